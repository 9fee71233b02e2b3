"""The result store: ``<dir>/<job id>/<files>``. A file carries its final name only when it is complete.

Names come from the ComfyUI server and are treated as hostile: a ``..``, a path separator, an absolute
path or a NUL is refused before anything is opened, every path is checked to stay inside the job's
folder, and sizes are capped while streaming.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from comfysup import safefs
from comfysup.queue.base import Output


class UnsafeName(ValueError):
    """An output name that could write outside the job's folder."""


class UnsafeFolder(UnsafeName):
    """The job's folder in the store is a symlink (or not a folder): the job is dead-lettered, nothing outside
    the store is read, written or removed."""


class Incomplete(ValueError):
    """An output whose bytes are not a whole file of the type its name says (a cut or garbled download)."""


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
"""An IEND chunk as a PNG ends with it: length 0, the type, its fixed CRC (also used by
comfysup.runner.outputs, which walks a whole PNG's chunks before adopting it from disk)."""


def check_complete(name: str, head: bytes, tail: bytes, size: int) -> None:
    """Incomplete unless a file named as a PNG, JPEG or WebP begins and ends as one: a server whose answer
    was cut with a matching Content-Length (or that sent something else) cannot make a job done with half an
    image. Other types are taken as they come."""
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if suffix == "png":
        ok, what = head.startswith(PNG_SIGNATURE) and tail.endswith(PNG_END), "a PNG ending in its IEND chunk"
    elif suffix in ("jpg", "jpeg"):
        ok, what = head.startswith(b"\xff\xd8") and tail.endswith(b"\xff\xd9"), "a JPEG from SOI to EOI"
    elif suffix == "webp":
        riff = int.from_bytes(head[4:8], "little") + 8 if len(head) >= 12 else -1
        ok, what = head[:4] == b"RIFF" and head[8:12] == b"WEBP" and riff == size, "a WebP of its RIFF size"
    else:
        return
    if not ok:
        raise Incomplete(f"output {name!r} ({size} bytes) is not {what}: the download was cut or garbled")


PROGRESS_SECONDS = 1.0
"""How often a long write (or upload) calls its ``progress``: the attempt's checkpoint, cheap unless it is due."""


def every(seconds: float, fn: Callable[[], None] | None) -> Callable[[], None]:
    """``fn`` at most once per ``seconds`` (monotonic), for a loop that runs per chunk; a no-op without ``fn``."""
    if fn is None:
        return lambda: None
    last = [time.monotonic()]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            fn()

    return tick


class TooLarge(ValueError):
    """An output file over the size cap."""


def check_part(part: str, what: str) -> str:
    if (not part or part in (".", "..") or "\0" in part or "/" in part or "\\" in part or ".." in part
            or os.path.isabs(part) or part.startswith("~") or not part.isprintable()):
        raise UnsafeName(f"unsafe output name {what}={part!r}")
    return part


TEMPORARY_SUFFIX = ".part"
"""A file is written as ``.<name>.part``, then renamed: no output may carry such a name (see ``write``)."""
MAX_SUBFOLDERS = 16
"""Folders an output name may nest in: ComfyUI's own are one or two deep."""


def safe_relative(filename: str, subfolder: str) -> str:
    """``subfolder/filename`` after checking each part; ComfyUI's own subfolders are plain names."""
    parts = [check_part(p, "subfolder") for p in subfolder.replace("\\", "/").split("/") if p] if subfolder else []
    if len(parts) > MAX_SUBFOLDERS:
        raise UnsafeName(f"unsafe output name subfolder={subfolder[:100]!r}: more than {MAX_SUBFOLDERS} folders deep")
    if subfolder and (subfolder.startswith(("/", "\\")) or "\0" in subfolder or ".." in subfolder):
        raise UnsafeName(f"unsafe output name subfolder={subfolder!r}")
    name = check_part(filename, "filename")
    if name.startswith(".") and name.endswith(TEMPORARY_SUFFIX):
        raise UnsafeName(f"unsafe output name filename={name!r}: the result store's own temporary name (.<name>.part), "
                         "under which another output is written before it is renamed")
    return "/".join([*parts, name])


class ResultStore:
    """Every folder and file below ``root`` is opened through its parent's descriptor without following a
    symlink (comfysup.safefs): a job folder replaced by ``-> /etc`` is refused, never written through."""

    def __init__(self, root: Path, max_file_bytes: int) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self._root = os.fspath(Path(root))  # normalised as pathlib writes it: no trailing or doubled slash
        """The root as text: a job's paths are joined as text (pathlib's objects cost more than the job's writes)."""

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def _job_path(self, job_id: str, relative: str = "") -> str:
        """``root/job_id[/relative]``: both are checked plain names (``check_part``), joined as text."""
        return f"{self._root}/{job_id}/{relative}" if relative else f"{self._root}/{job_id}"

    def prepare(self, job_id: str) -> Path:
        """The job's folder, created 0700 (its entry in the root fsynced), with leftovers of an interrupted earlier
        attempt removed.

        Everything in it is a leftover: a job being downloaded is not done, so no file there belongs to a
        recorded result. An attempt killed after downloading and before its done record leaves complete
        files; when the run has to be repeated (its server died with the history) the new run's files
        have other names, and the old ones would stay beside them as a second result set (the chaos
        suite's K2 found one in 100 supervisor kills). Only the attempt holding the job calls this.
        A job folder that is a symlink raises UnsafeFolder: nothing outside the store is touched.
        """
        check_part(job_id, "job id")
        with contextlib.suppress(FileNotFoundError, FileExistsError):  # no root yet; a folder (or a link) there
            # by its path: mkdir never follows a link in its last component (EEXIST), the root's are followed
            os.mkdir(self._job_path(job_id), 0o700)
            safefs.sync_dir(self._root)  # its entry: the done record names files in it, which a power loss
            return self.job_dir(job_id)  # must not take with it; just made: nothing left over (no scan)
        root = safefs.open_root(self.root, create=True)
        try:
            try:
                os.mkdir(job_id, 0o700, dir_fd=root)
                os.fsync(root)
                return self.job_dir(job_id)
            except FileExistsError:
                pass
            with self._job_fd(root, job_id) as folder:
                safefs.empty(folder)
        finally:
            os.close(root)
        return self.job_dir(job_id)

    def write(self, job_id: str, relative: str, chunks: Iterable[bytes], *, limit_bytes: int | None = None,
              limit_name: str = "[store] max_file_mb", progress: Callable[[], None] | None = None) -> Output:
        """Stream into ``.<name>.part``, fsync, then rename to the final name; returns its size and hash.
        ``limit_bytes`` (what is left of the job's budget, when less than a file's) caps it instead. ``progress``
        is called now and then while a long file streams (at most once a second): the attempt's checkpoint,
        which renews its lease, so a file that takes longer than the lease does not lose the job."""
        tick = every(PROGRESS_SECONDS, progress)
        cap, cap_name = self.max_file_bytes, "[store] max_file_mb"
        if limit_bytes is not None and limit_bytes < cap:
            cap, cap_name = limit_bytes, limit_name
        *subfolders, name = [check_part(p, "name") for p in relative.split("/")]
        tmp = f".{name}{TEMPORARY_SUFFIX}"
        digest = hashlib.sha256()
        size = 0
        try:  # the job's folder, made by prepare: opened below the root in one call
            job = safefs.open_below(self._root, job_id, where=self._job_path(job_id))
        except safefs.Escapes as exc:
            raise UnsafeFolder(f"the result store's folder for this job {exc.strerror}") from None
        try:
            with self._beneath(job, subfolders, relative) as folder:
                try:
                    fd = self._create(folder, tmp)
                    head = tail = b""
                    try:  # written on the descriptor: a file object's buffer gains nothing for whole chunks
                        for chunk in chunks:
                            tick()
                            if len(head) < 16:
                                head += chunk[:16 - len(head)]
                            tail = (tail + chunk)[-16:]
                            size += len(chunk)
                            if size > cap:
                                raise TooLarge(f"output {relative!r} is larger than {cap / 2**20:g} MiB "
                                               f"({cap_name})")
                            digest.update(chunk)
                            write_all(fd, chunk)
                        check_complete(name, head, tail, size)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                    os.fsync(folder)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=folder)
                    raise
        finally:
            os.close(job)
        return Output(name=relative, size=size, sha256=digest.hexdigest(), path=self._job_path(job_id, relative))

    def finish(self, job_id: str) -> None:
        """Every file of the job is written: here they stay."""

    def staged_in(self, job_id: str) -> str | None:
        """None: the files are in the store itself, the job is done when recorded (an object store's wait)."""
        return None

    @staticmethod
    def _create(folder: int, tmp: str) -> int:
        """``tmp`` made anew; one left by an attempt killed while writing it is removed first (found by the
        O_EXCL open itself: no unlink is tried for the file that is nearly never there)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return safefs.open_file(folder, tmp, flags, 0o600)
        except FileExistsError:
            os.unlink(tmp, dir_fd=folder)
            return safefs.open_file(folder, tmp, flags, 0o600)

    @staticmethod
    @contextlib.contextmanager
    def _beneath(job: int, subfolders: list[str], relative: str) -> Iterator[int]:
        try:
            with safefs.dir_beneath(job, subfolders, create=True, where=relative) as fd:
                yield fd
        except safefs.Escapes as exc:
            raise UnsafeFolder(f"output {exc.strerror}") from None

    @contextlib.contextmanager
    def _job_fd(self, root: int, job_id: str) -> Iterator[int]:
        try:
            with safefs.dir_beneath(root, [job_id], where=self._job_path(job_id)) as fd:
                yield fd
        except safefs.Escapes as exc:
            raise UnsafeFolder(f"the result store's folder for this job {exc.strerror}") from None


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (os.write may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
