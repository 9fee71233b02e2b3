"""The hostile catalogue, whole: every way the fake can mangle an answer, one named mutation each.

comfysup must treat every answer of ComfyUI as untrusted input, for days, unattended. The table and the
primitives a mutation is made of are in hostile_kit.py (with the mutations of typed paths); broken bodies,
huge and deep values and the rest register themselves from hostile_bodies.py. Importing both here, once,
makes `CATALOGUE` complete for whoever reads it (the script word `hostile:NAME`, `--hostile-seed`, the
chaos checker), and keeps the two halves from importing each other.
"""

from __future__ import annotations

from . import hostile_bodies  # noqa: F401  - registers the rest of the catalogue into hostile_kit.CATALOGUE
from .hostile_kit import CATALOGUE, DEPTH, ONCE, TRICKLE, WHERE, Mutation, Raw, _mangle, choose

__all__ = ["CATALOGUE", "DEPTH", "ONCE", "PREFIX", "TRICKLE", "WHERE", "Mutation", "Raw", "_mangle", "choose",
           "mutation_of"]

PREFIX = "hostile:"
"""A script word `hostile:NAME` gives one prompt the mutation NAME."""


def mutation_of(word: str) -> Mutation | None:
    """The mutation a script word names (`hostile:NAME`), or None for any other word."""
    return CATALOGUE.get(word[len(PREFIX) :]) if isinstance(word, str) and word.startswith(PREFIX) else None

