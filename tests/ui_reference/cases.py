"""Workflows built for the frontend comparison: what the templates do not show (see ``built``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def built(templates: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    return iter(())
