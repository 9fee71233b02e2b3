"""Logging for comfysup's processes: one line per event, plain by default."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: int = logging.INFO) -> None:
    """Plain lines on stderr, like the examples in the runner's issue: ``job 1a2b3c4d: done on gpu0 …``."""
    root = logging.getLogger("comfysup")
    if any(getattr(h, "_comfysup", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._comfysup = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
