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
from collections.abc import Iterable, Iterator
from pathlib import Path

from comfysup import safefs
from comfysup.queue.base import Output


class UnsafeName(ValueError):
    """An output name that could write outside the job's folder."""


class UnsafeFolder(UnsafeName):
    """The job's folder in the store is a symlink (or not a folder): the job is dead-lettered, nothing outside
    the store is read, written or removed."""


class TooLarge(ValueError):
    """An output file over the size cap."""


def check_part(part: str, what: str) -> str:
    if (not part or part in (".", "..") or "\0" in part or "/" in part or "\\" in part or ".." in part
            or os.path.isabs(part) or part.startswith("~") or not part.isprintable()):
        raise UnsafeName(f"unsafe output name {what}={part!r}")
    return part


MAX_SUBFOLDERS = 16
"""Folders an output name may nest in: ComfyUI's own are one or two deep."""


def safe_relative(filename: str, subfolder: str) -> str:
    """``subfolder/filename`` after checking each part; ComfyUI's own subfolders are plain names."""
    parts = [check_part(p, "subfolder") for p in subfolder.replace("\\", "/").split("/") if p] if subfolder else []
    if len(parts) > MAX_SUBFOLDERS:
        raise UnsafeName(f"unsafe output name subfolder={subfolder[:100]!r}: more than {MAX_SUBFOLDERS} folders deep")
    if subfolder and (subfolder.startswith(("/", "\\")) or "\0" in subfolder or ".." in subfolder):
        raise UnsafeName(f"unsafe output name subfolder={subfolder!r}")
    return "/".join([*parts, check_part(filename, "filename")])


class ResultStore:
    """Every folder and file below ``root`` is opened through its parent's descriptor without following a
    symlink (comfysup.safefs): a job folder replaced by ``-> /etc`` is refused, never written through."""

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
        A job folder that is a symlink raises UnsafeFolder: nothing outside the store is touched.
        """
        check_part(job_id, "job id")
        root = safefs.open_root(self.root, create=True)
        try:
            try:
                os.mkdir(job_id, 0o700, dir_fd=root)
                return self.job_dir(job_id)  # just made: nothing left over (a scan saved on every first attempt)
            except FileExistsError:
                pass
            with self._job_fd(root, job_id) as folder:
                safefs.empty(folder)
        finally:
            os.close(root)
        return self.job_dir(job_id)

    def write(self, job_id: str, relative: str, chunks: Iterable[bytes]) -> Output:
        """Stream into ``.<name>.part``, fsync, then rename to the final name; returns its size and hash."""
        *subfolders, name = [check_part(p, "name") for p in relative.split("/")]
        tmp = f".{name}.part"
        digest = hashlib.sha256()
        size = 0
        root = safefs.open_root(self.root, create=True)
        try:
            with self._job_fd(root, job_id) as job, self._beneath(job, subfolders, relative) as folder:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder)
                try:
                    fd = safefs.open_file(folder, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        for chunk in chunks:
                            size += len(chunk)
                            if size > self.max_file_bytes:
                                raise TooLarge(f"output {relative!r} is larger than {self.max_file_bytes // 2**20}"
                                               " MiB ([store] max_file_mb)")
                            digest.update(chunk)
                            f.write(chunk)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
                    os.fsync(folder)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=folder)
                    raise
        finally:
            os.close(root)
        return Output(name=relative, size=size, sha256=digest.hexdigest(), path=str(self.job_dir(job_id) / relative))

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
            with safefs.dir_beneath(root, [job_id], where=str(self.job_dir(job_id))) as fd:
                yield fd
        except safefs.Escapes as exc:
            raise UnsafeFolder(f"the result store's folder for this job {exc.strerror}") from None


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
