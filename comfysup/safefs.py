"""Files under a root that no symlink can lead out of: every step is opened relative to the one before,
with O_NOFOLLOW, so the check and the use are the same system call and cannot be raced.

Checking ``Path.resolve()`` and then opening the path is not enough: a folder can be replaced by a symlink
between the two (``<store>/<job id> -> /etc``). Here each component is opened with ``dir_fd`` and
``O_NOFOLLOW`` (a symlink fails with ELOOP, a non-folder with ENOTDIR), files are created with ``O_EXCL``,
and renames and removals name a folder by its descriptor. The root itself is the operator's choice and may
be a symlink; nothing below it may.

A base module: it imports nothing of comfysup.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Escapes(OSError):
    """A component below the root is a symlink or not what it should be: nothing was opened through it."""


def _refuse(exc: OSError, where: str) -> Escapes:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return Escapes(exc.errno, f"{where} is a symlink or not a folder; nothing is read or written through it")
    return exc  # type: ignore[return-value]


def open_root(root: str | Path, *, create: bool = False) -> int:
    """A descriptor of ``root`` (made 0700 with its parents when ``create``, each made folder's entry fsynced)."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise
    private_dirs(Path(root), durable=True)  # once: the root is there for every later file, after a power loss too
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir(parent_fd: int, name: str, *, create: bool = False, where: str = "") -> int:
    """The folder ``name`` inside ``parent_fd``, never through a symlink; made 0700 when ``create``, and then
    its entry fsynced in ``parent_fd``: a file made durable in it later must not vanish with it in a power loss."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        else:
            os.fsync(parent_fd)
    try:
        return os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as exc:
        raise _refuse(exc, where or name) from None


def open_below(root: str | Path, name: str, *, where: str = "") -> int:
    """The folder ``name`` right inside ``root`` in one system call instead of three (``open_root``, ``open_dir``,
    the root's close): ``root``'s own components are followed as ``open_root`` follows them, and ``name``, the
    last, is not (O_NOFOLLOW). A symlink or a non-folder met (ELOOP, ENOTDIR) is told apart the long way, so that
    a root that is not a folder stays the OSError it was and only ``name`` being one is ``Escapes``."""
    if not name or "/" in name or name in (".", ".."):
        raise Escapes(errno.EINVAL, f"{name!r} is not one plain name")
    try:
        return os.open(os.path.join(root, name), _DIR)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    root_fd = open_root(root)
    try:
        return open_dir(root_fd, name, where=where)
    finally:
        os.close(root_fd)


@contextlib.contextmanager
def dir_beneath(root_fd: int, parts: Sequence[str], *, create: bool = False,
                where: str = "") -> Iterator[int]:
    """The folder at ``parts`` below ``root_fd``, each step opened without following a symlink; ``root_fd``
    itself when ``parts`` is empty (closed by its owner, never here: no dup of it for a step that opens nothing,
    two system calls a file the runner stores and another two for each it reads)."""
    fd = root_fd
    try:
        for part in parts:
            child = open_dir(fd, part, create=create, where=where or "/".join(parts))
            if fd != root_fd:
                os.close(fd)
            fd = child
        yield fd
    finally:
        if fd != root_fd:
            os.close(fd)


def open_file(dir_fd: int, name: str, flags: int = os.O_RDONLY, mode: int = 0o600, where: str = "") -> int:
    """``name`` in ``dir_fd``, never through a symlink; only a regular file is returned for reading.

    Opened non-blocking, then made blocking once it is known to be a regular file: a FIFO planted under a name
    (a custom node's output, a hostile server's) would otherwise hold the open until something wrote to it.
    With O_CREAT and O_EXCL the file is one this call made, a regular file: opened as it is, with no check."""
    if flags & os.O_CREAT and flags & os.O_EXCL:
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, mode, dir_fd=dir_fd)
        except OSError as exc:
            raise _refuse(exc, where or name) from None
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refuse(exc, where or name) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Escapes(errno.EINVAL, f"{where or name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_beneath(root: Path, relative: str) -> int:
    """The regular file at ``relative`` below ``root``, read-only: every component opened without following a
    symlink (``Escapes`` names the one that is a link, or a file that is not regular: a FIFO, a device), the
    file opened non-blocking so that a FIFO cannot hold the open. ``relative`` is checked first: no absolute
    path and no ``..``; FileNotFoundError when it is not there."""
    parts = relative.split("/")
    if relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Escapes(errno.EINVAL, f"{relative} is not a plain relative path (no leading /, no . or .., no //)")
    root_fd = open_root(root)
    try:
        with dir_beneath(root_fd, parts[:-1], where=relative) as folder:
            return open_file(folder, parts[-1], where=relative)
    finally:
        os.close(root_fd)


def private_dirs(path: Path, *, durable: bool = False) -> None:
    """``mkdir -p`` whose every folder it makes is 0700 (``mkdir -p`` makes the parents with the umask's mode);
    a folder that exists is left as it is (its owner chose its mode). ``durable``: the parent of each folder that
    was missing is fsynced once the folder is there (made here or by a process that raced this one), so that
    what is later made durable inside it survives a power loss with its folder."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        if durable:
            sync_dir(folder.parent)


def sync_dir(path: str | Path) -> None:
    """fsync the folder ``path``: the entries made, renamed or removed in it are on disk once this returns (a
    file's own fsync does not make its name durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(path: str | Path) -> int:
    """A file the caller named by path (its folders are the caller's), read-only, only if it is a regular file
    and not a symlink; non-blocking until that is known, so that a FIFO put there cannot hang the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise _refuse(exc, str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Escapes(errno.EINVAL, f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove ``name`` in ``parent_fd`` and, if it is a real folder, all below it; a symlink is removed as a
    link, never followed. The folder is opened without a look first (O_NOFOLLOW | O_DIRECTORY refuses a link
    and anything not a folder, which is unlinked instead), and what is in it is told apart by the type its
    listing gives: no stat of each name (two of the runner's system calls a job, for its one-file folder)."""
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=parent_fd)
        return
    try:
        with os.scandir(fd) as entries:
            children = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for child, is_dir in children:
            if is_dir:
                remove_tree(fd, child)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def empty(dir_fd: int) -> None:
    """Remove everything inside the folder ``dir_fd``, following no symlink."""
    for child in os.listdir(dir_fd):
        remove_tree(dir_fd, child)
