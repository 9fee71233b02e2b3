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
from collections.abc import Iterable
from pathlib import Path

from comfysup.queue.base import Output


class UnsafeName(ValueError):
    """An output name that could write outside the job's folder."""


class TooLarge(ValueError):
    """An output file over the size cap."""


def check_part(part: str, what: str) -> str:
    if (not part or part in (".", "..") or "\0" in part or "/" in part or "\\" in part or ".." in part
            or os.path.isabs(part) or part.startswith("~")):
        raise UnsafeName(f"unsafe output name {what}={part!r}")
    return part


def safe_relative(filename: str, subfolder: str) -> str:
    """``subfolder/filename`` after checking each part; ComfyUI's own subfolders are plain names."""
    parts = [check_part(p, "subfolder") for p in subfolder.replace("\\", "/").split("/") if p] if subfolder else []
    if subfolder and (subfolder.startswith(("/", "\\")) or "\0" in subfolder or ".." in subfolder):
        raise UnsafeName(f"unsafe output name subfolder={subfolder!r}")
    return "/".join([*parts, check_part(filename, "filename")])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ResultStore:
    def __init__(self, root: Path, max_file_bytes: int) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def prepare(self, job_id: str) -> Path:
        """The job's folder, created 0700, with leftovers of an interrupted earlier attempt removed.

        Everything in it is a leftover: a job being downloaded is not done, so no file there belongs to a
        recorded result. An attempt killed after downloading and before its done record leaves complete
        files; when the run has to be repeated (its server died with the history) the new run's files
        have other names, and the old ones would stay beside them as a second result set (the chaos
        suite's K2 found one in 100 supervisor kills). Only the attempt holding the job calls this.
        """
        if not self.root.exists():
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = self.job_dir(job_id)
        try:
            folder.mkdir(mode=0o700)
            return folder  # just made: nothing left over (a scan saved on every job's first attempt)
        except FileExistsError:
            pass
        for leftover in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                if leftover.is_dir() and not leftover.is_symlink():
                    leftover.rmdir()
                else:
                    leftover.unlink()
        return folder

    def write(self, job_id: str, relative: str, chunks: Iterable[bytes]) -> Output:
        """Stream into ``.<name>.part``, fsync, then rename to the final name; returns its size and hash."""
        folder = self.job_dir(job_id).resolve()
        final = (folder / relative).resolve()
        if folder not in final.parents:
            raise UnsafeName(f"unsafe output name {relative!r}: outside the job's folder")
        final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.part")
        digest = hashlib.sha256()
        size = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_file_bytes:
                        raise TooLarge(f"output {relative!r} is larger than {self.max_file_bytes // 2**20} MiB "
                                       "([store] max_file_mb)")
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return Output(name=relative, size=size, sha256=digest.hexdigest(), path=str(final))


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
