"""Fixtures integration tests take by name without importing them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lazyfs import LazyMount, fuse_missing

from tests.api_support import api  # noqa: F401  (the API on a fresh queue, with a stand-in runner)


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyMount]:
    """A lazy filesystem (tests/lazyfs.py) mounted at ``tmp_path / "disk"``: skipped, saying why, without FUSE."""
    why = fuse_missing()
    if why:
        pytest.skip(f"no lazy filesystem: {why}")
    mount = LazyMount(tmp_path / "lazyfs-base", tmp_path / "disk")
    mount.mount()
    try:
        yield mount
    finally:
        mount.unmount()
