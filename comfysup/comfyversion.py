"""Which ComfyUI a server runs, and what comfysup does differently for each (docs/comfyui-versions.md).

Pure functions over version strings: the runner (atomic cancel), the supervisor (command line, the warning
about an untested version) and what people see (status, health, metrics) share them.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTED_LOW = (0, 3, 64)
TESTED_HIGH = (0, 38)
"""The tested range: 0.3.64 (recorded) to 0.38.x (read from its source)."""
TESTED_TEXT = "0.3.64 to 0.38.x"
JOBS_API = (0, 38)
"""From here on the server has POST /api/jobs/{id}/cancel (comfy_execution/jobs.py, server.py of 0.38)."""
REMOVED_FLAGS = {(0, 38): ("--normalvram", "--disable-ipex-optimize")}
"""Flags a version no longer accepts (its argparse exits 2): dropped from the command line with a warning."""

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")
_VERSION_FILE = re.compile(r"""__version__\s*=\s*["']([^"']+)["']""")


def parse(version: str | None) -> tuple[int, ...] | None:
    """"0.38.1" → (0, 38, 1); None for anything that does not start like a version."""
    match = _VERSION.match(version or "")
    if match is None:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def in_tested_range(version: str | None) -> bool:
    """True for 0.3.64 ≤ version < 0.39, and for an unknown version (nothing to warn about)."""
    parsed = parse(version)
    if parsed is None:
        return True
    return parsed >= TESTED_LOW and parsed[:2] <= TESTED_HIGH


def tells_every_output(version: str | None) -> bool:
    """The versions whose WebSocket carries every output of a run (an ``executed`` message for each node with one,
    cached nodes too) and its end after the history is written: 0.3.64 and later, those comfysup is tested on."""
    parsed = parse(version)
    return parsed is not None and parsed >= TESTED_LOW


def has_jobs_api(version: str | None) -> bool:
    parsed = parse(version)
    return parsed is not None and parsed[:2] >= JOBS_API


def untested_warning(name: str, version: str) -> str:
    return (f"{name}: ComfyUI {version} is outside the versions comfysup was tested with ({TESTED_TEXT}); "
            "it may answer in ways comfysup does not expect")


def read_version_file(main: Path) -> str | None:
    """The version of the ComfyUI whose main.py this is, from comfyui_version.py next to it (None: no such
    file, as for fake_comfy, or it cannot be read)."""
    try:
        text = (main.parent / "comfyui_version.py").read_text(errors="replace")
    except OSError:
        return None
    match = _VERSION_FILE.search(text)
    return match.group(1) if match else None


def accepted_args(version: str | None, args: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments this version accepts, the flags dropped). Removed flags take no value, so only the
    flag itself goes."""
    parsed = parse(version)
    removed: set[str] = set()
    for since, flags in REMOVED_FLAGS.items():
        if parsed is not None and parsed[:2] >= since:
            removed.update(flags)
    kept = [a for a in args if a.split("=", 1)[0] not in removed]
    return kept, [a for a in args if a.split("=", 1)[0] in removed]
