"""fake_comfy's own version (shown by --version, /system_stats and the web root), and which ComfyUI version it
plays (0.3.64 or 0.38): a module of its own, so the server and the options can say either without importing
the package, or the 0.38 differences, that import them."""

from __future__ import annotations

import os

__version__ = "0.1.0"

OLD, NEW = "0.3.64", "0.38"
ENV = "FAKE_COMFY_VERSION"
"""The default version when neither --comfyui-version nor the constructor names one (tests set it)."""


def normalize(version: str) -> str:
    """"0.38", "0.38.1" → "0.38"; "0.3.64" → "0.3.64"; anything else ValueError."""
    if version in (OLD,):
        return OLD
    if version == NEW or version.startswith(NEW + "."):
        return NEW
    raise ValueError(f"--comfyui-version must be {OLD} or {NEW}, not {version!r}")


def default_version() -> str:
    return normalize(os.environ.get(ENV) or NEW)
