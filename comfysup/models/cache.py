"""Where model files live: a cache kept once per content, and the folder of links each launched server sees.

The cache (``[comfyui] models_cache``, default ``model-cache`` beside the queue file) holds each file once under
its hash, ``sha256/<hex>``, renamed there only after its hash was checked; a download in progress is
``partial/<hex>`` (kept when interrupted, continued by the next pull) with ``partial/<hex>.lock`` held by the one
process fetching it. Named by content, the cache can be shared by several configs and machines (one NFS mount):
two manifests naming different files ``model.safetensors`` never overwrite each other, and a second machine
finds what the first fetched.

The servers see files by name, not hash: ``<base_directory>/models/<folder>/<name>`` is a link to the cached
file (made only once it is verified), and each server's ``extra_model_paths.yaml`` points its folders there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from comfysup.config import Config, ModelFile
from comfysup.safefs import private_dirs

CHUNK = 1 << 20
YAML_NAME = "extra_model_paths.yaml"


def cache_dir(config: Config) -> Path:
    """``[comfyui] models_cache``, else ``model-cache`` in the state folder (the queue file's)."""
    if config.comfyui.models_cache:
        return config.resolve(config.comfyui.models_cache).absolute()
    return config.resolve(config.queue.path).parent.absolute() / "model-cache"


def view_dir(config: Config) -> Path:
    """The folder of links by name that every server of this config sees: ``<base_directory>/models``."""
    return config.resolve(config.comfyui.base_directory).absolute() / "models"


@dataclass(frozen=True)
class Cache:
    root: Path

    def blob(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256

    def partial(self, sha256: str) -> Path:
        return self.root / "partial" / sha256

    @contextlib.contextmanager
    def locked(self, sha256: str, waiting: Callable[[], None]) -> Iterator[None]:
        """Hold the fetch lock of one content (flock on ``partial/<hex>.lock``): two pulls on this machine, or two
        machines on one shared cache, never write one partial file at once. ``waiting`` is called when another
        process holds it (this one then waits for it: it will find the file verified, or continue the partial)."""
        path = self.partial(sha256).with_name(sha256 + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        with flocked(path, waiting):
            yield


@contextlib.contextmanager
def flocked(path: Path, waiting: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (made when missing); ``waiting`` is called before waiting for another."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class FileState:
    """What ``models list`` says of one manifest entry."""

    entry: ModelFile
    state: str
    """``verified`` (in the cache under its hash, checked when it was written, or just now with --verify),
    ``missing``, ``partial`` (a download to continue) or ``mismatch`` (--verify found other content)."""
    size: int | None
    """Bytes in the cache (verified, mismatch) or fetched so far (partial); None when missing."""
    linked: bool = False
    """The servers see it: ``<base_directory>/models/<folder>/<name>`` links to the cached file (``pull`` makes the
    link; a machine that shares a cache another one filled has the file but not yet the link)."""


def state_of(config: Config, cache: Cache, entry: ModelFile, *, verify: bool = False) -> FileState:
    """One entry's state; ``verify`` hashes a cached file again (reads it all) instead of trusting its name."""
    link = view_dir(config) / entry.folder / entry.name
    try:
        size = cache.blob(entry.sha256).stat().st_size
    except FileNotFoundError:
        try:
            return FileState(entry, "partial", cache.partial(entry.sha256).stat().st_size)
        except FileNotFoundError:
            return FileState(entry, "missing", None)
    if verify and file_sha256(cache.blob(entry.sha256)) != entry.sha256:
        return FileState(entry, "mismatch", size)
    try:
        linked = os.readlink(link) == str(cache.blob(entry.sha256))
    except OSError:
        linked = False
    return FileState(entry, "verified", size, linked)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Partial:
    """A download in progress: the partial file open for appending, and the hash of every byte it holds.

    Opening it reads what an earlier, interrupted pull left (its hash), so the next bytes continue it; ``restart``
    empties it when the source cannot continue (it sent the whole file again, or it changed)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[bytes] = open(path, "a+b")  # noqa: SIM115 - closed by close()
        self._file.seek(0)
        self.hash = hashlib.sha256()
        while chunk := self._file.read(CHUNK):
            self.hash.update(chunk)
        self.size = self._file.tell()

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self.hash.update(chunk)
        self.size += len(chunk)

    def restart(self) -> None:
        self._file.truncate(0)
        self._file.seek(0)
        self.hash = hashlib.sha256()
        self.size = 0

    def finish(self, target: Path) -> None:
        """Flush to disk and rename to ``target`` (read-only): the verified file appears whole or not at all."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self.close()
        os.chmod(self.path, 0o444)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path, target)
        _fsync_dir(target.parent)
        with contextlib.suppress(FileNotFoundError):
            self.meta_path.unlink()

    def discard(self) -> None:
        self.close()
        for path in (self.path, self.meta_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        self._file.close()

    @property
    def meta_path(self) -> Path:
        """Beside the partial file: what the source said of the file (ETag, Last-Modified), to resume only the
        same one (HTTP If-Range)."""
        return self.path.with_name(self.path.name + ".json")

    def read_meta(self) -> dict[str, str]:
        try:
            meta = json.loads(self.meta_path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in meta.items() if isinstance(k, str) and isinstance(v, str)} \
            if isinstance(meta, dict) else {}

    def write_meta(self, meta: dict[str, str]) -> None:
        tmp = self.meta_path.with_name(self.meta_path.name + ".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.meta_path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_view(config: Config, cache: Cache) -> None:
    """Make ``<base_directory>/models`` hold a link by name to each verified file of the manifest, and nothing
    else: a link to a file no longer in the manifest, or not verified, is removed (only links are touched)."""
    view = view_dir(config)
    private_dirs(view)  # the servers' base directories beside it are 0700: the jobs' files pass through them
    with flocked(view / ".lock"):  # two pulls of one config at once: neither removes the other's new link
        _link_view(config, cache, view)


def _link_view(config: Config, cache: Cache, view: Path) -> None:
    wanted: dict[Path, Path] = {}
    for entry in config.models:
        blob = cache.blob(entry.sha256)
        if blob.is_file():
            wanted[view / entry.folder / entry.name] = blob
    for entry in config.models:
        (view / entry.folder).mkdir(parents=True, exist_ok=True)
    for link, blob in wanted.items():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link) == str(blob):
                continue
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(blob, tmp)
        os.replace(tmp, link)
    if view.is_dir():
        for folder, _dirs, files in os.walk(view):
            for name in files:
                path = Path(folder) / name
                if path.is_symlink() and path not in wanted and not name.startswith("."):
                    path.unlink()


def server_yaml(config: Config) -> str:
    """The ``extra_model_paths.yaml`` of a launched server: each manifest folder under ``<base_directory>/models``.

    Written as JSON, which YAML reads as it is (ComfyUI's loader is ``yaml.safe_load``): no YAML writer needed,
    and any path is quoted and escaped correctly."""
    folders = sorted({entry.folder for entry in config.models})
    section = {"base_path": str(view_dir(config)), **{folder: folder for folder in folders}}
    return json.dumps({"comfysup_models": section}, indent=2) + "\n"
