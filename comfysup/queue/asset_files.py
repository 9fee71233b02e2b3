"""Where an input file's bytes live on disk: the asset folder (``<2 hex>/<hex>`` by content), written whole
(temporary name, fsync, rename) and read back only when they still match their hash.

The asset role (comfysup.queue.assets) decides where a content goes (the folder, the database's chunks, a bucket)
and keeps its rows; this module only moves bytes, hashing them again as they pass.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import blake3

from comfysup import safefs
from comfysup.assets import HASH_PREFIX
from comfysup.errors import QueueError
from comfysup.queue.values import NewAsset

CHUNK_BYTES = 4 * 1024 * 1024
TEMPORARY_SECONDS = 86400.0
"""A temporary file in the asset folder older than this is a killed process's leftover; prune removes it."""


class AssetMissing(QueueError):
    """A job names an input file by its hash that the asset store does not hold."""


def path_of(folder: Path | None, digest: str) -> Path:
    """Where a content's file is in the asset folder."""
    assert folder is not None
    hexa = digest.removeprefix(HASH_PREFIX)
    return folder / hexa[:2] / hexa


def write_file(folder: Path, asset: NewAsset) -> int:
    """The asset's bytes as their file in ``folder``, durable (the file, its rename and any folder made for it)
    before this returns."""
    target = path_of(folder, asset.hash)
    if target.is_file() and target.stat().st_size == asset.size:
        # Left by a submit that rolled back, or stored by another queue: same content, synced before its rename,
        # but its name maybe not (a writer killed before its folder's fsync): synced here before the row is.
        safefs.sync_dir(target.parent)
        return asset.size
    safefs.private_dirs(target.parent, durable=True)  # the folders' entries too: a power loss must not take them
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
    try:
        with os.fdopen(fd, "wb") as out:
            size = copy(asset, out.write)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        safefs.sync_dir(target.parent)  # the rename itself, before the row that says the file exists is committed
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


def copy(asset: NewAsset, write: Callable[[bytes], object]) -> int:
    """Copy the file in chunks through ``write``, hashing it again; QueueError when it changed."""
    hasher, size = blake3.blake3(), 0
    assert asset.path is not None
    try:  # the file hashed at validation, opened again: never through a symlink, never a FIFO put there since
        fd = safefs.open_regular(asset.path)
    except OSError as exc:
        raise QueueError(f"{asset.path} cannot be read again to store it ({exc.strerror}); nothing was "
                         "submitted") from None
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            hasher.update(chunk)
            size += len(chunk)
            write(chunk)
    if HASH_PREFIX + hasher.hexdigest() != asset.hash:
        raise QueueError(f"{asset.path} changed while it was being submitted; nothing was submitted")
    return size


def read_file(folder: Path, digest: str, size: int) -> bytes:
    """A content's file as stored (AssetMissing when it is gone or unreadable); ``check_hash`` it before use."""
    path = path_of(folder, digest)
    try:
        fd = safefs.open_regular(path)
    except FileNotFoundError:
        raise AssetMissing(f"input {digest}: its file {path} is missing") from None
    except OSError as exc:
        raise AssetMissing(f"input {digest}: its file {path} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        return f.read(size + 1)


def check_hash(data: bytes, digest: str) -> None:
    """Bytes read back are hashed again before they are sent: bytes changed on disk (or in the table) never go
    out under an old hash."""
    if HASH_PREFIX + blake3.blake3(data).hexdigest() != digest:
        raise AssetMissing(f"input {digest}: the stored copy no longer matches its hash (changed or damaged "
                           "on disk); submit the file again to store it anew")


def sweep(folder: Path | None, at: float) -> None:
    """Temporary files of copies that a killed process left (``.incoming-*`` of a submit, ``.api-upload-*``
    of an API upload) once they are a day old: no live copy takes that long."""
    if folder is None or not folder.is_dir():
        return
    for path in [*folder.glob(".api-upload-*"), *folder.glob("*/.incoming-*")]:
        try:
            if path.lstat().st_mtime < at - TEMPORARY_SECONDS:
                path.unlink()
        except FileNotFoundError:
            pass
