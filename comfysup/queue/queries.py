"""Named SQL, as procrastinate keeps it: ``-- name: NAME`` heads each query in a ``.sql`` file, loaded once.

comfysup/queue/sql/queries.sql holds what both backends run, written once with ``:name`` for a named
parameter (every statement takes a mapping of its parameters by name); sql/sqlite.sql and sql/postgres.sql hold
each dialect's own statements and the fragments the shared ones leave open (``{now}``: where time comes from;
``{by_jobs_state}``: SQLite's index hints; …). Loading a dialect inlines the fragments and translates what
differs in spelling only, once per process: PostgreSQL's ``%(name)s`` for ``:name`` (a cast's ``::`` is left
alone), SQLite's ``IN (SELECT value FROM json_each(:ids))`` for ``= ANY(:ids)`` (a list of ids travels as one
JSON text, see ``SQLiteDb.id_list``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

FRAGMENT = re.compile(r"\{([a-z_]+)\}")
ANY = re.compile(r"\s*=\s*ANY\((:\w+)\)")
PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
"""A named parameter, ``:name``; not the second colon of a cast (``x::float8``)."""


def parse(text: str) -> dict[str, str]:
    """The blocks of a named-SQL file by name, as written (comments kept: schema steps are run as they are)."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("-- name:"):
            name = line.split(":", 1)[1].strip()
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def read(filename: str) -> dict[str, str]:
    """A named-SQL file of this package (``schema.sql``, ``sql/postgres.sql``) by name, as written. Read beside
    this module (package data, installed as files): importlib.resources' reader brought in zipfile and its
    kin, about 5 ms of every ``comfysup submit``'s start."""
    return parse(Path(__file__).parent.joinpath(*filename.split("/")).read_text(encoding="utf-8"))


def _code(block: str) -> str:
    """A block without its comment lines (its one-line purpose) and surrounding blank space."""
    return "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--")).strip()


class Queries(Mapping[str, str]):
    """Every query of a dialect by name, its fragments inlined and its spelling translated the first time it is
    asked for: a command runs a few of them (a submit, a handful of the nearly two hundred), and never pays for
    the rest."""

    def __init__(self, dialect: str, blocks: dict[str, str]) -> None:
        self.dialect = dialect
        self._blocks = blocks
        self._ready: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        text = self._ready.get(name)
        if text is None:
            text = self._ready[name] = self._translate(self._expand(name, ()))
        return text

    def __iter__(self) -> Iterator[str]:
        return iter(self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def _expand(self, name: str, seen: tuple[str, ...]) -> str:
        if name in seen:
            raise ValueError(f"SQL fragment {name} includes itself")
        return FRAGMENT.sub(lambda m: self._expand(m.group(1), (*seen, name)), _code(self._blocks[name]))

    def _translate(self, text: str) -> str:
        if self.dialect == "postgres":
            return PARAMETER.sub(r"%(\1)s", text)
        return ANY.sub(r" IN (SELECT value FROM json_each(\1))", text)


@cache
def load(dialect: str) -> Queries:
    """Every query of ``dialect`` ("sqlite" or "postgres") by name, ready to execute."""
    return Queries(dialect, {**read("sql/queries.sql"), **read(f"sql/{dialect}.sql")})
