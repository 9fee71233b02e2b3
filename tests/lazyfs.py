"""A filesystem that forgets what was not fsynced: power loss for the tests, in the spirit of Jepsen's LazyFS.

A FUSE passthrough (``mfusepy`` on Debian's ``fuse3``) over a folder on the real disk. Every operation is done
on that folder at once, so the processes on the mount see an ordinary filesystem; beside it this module keeps
what a disk would still hold after a power cut:

- **data**: per file, the durable bytes of every 4 KiB page written since its last ``fsync``/``fdatasync``
  (an undo page cache: the first write to a page saves the page as it was) and its durable size. ``fsync`` of
  the file forgets them: its bytes as they are now are the durable ones. A file made on the mount starts
  durable and empty.
- **names**: per folder, its durable entries (name → file or folder identity); ``fsync`` of the folder takes
  its entries as they are now. A create, a rename, an unlink or a mkdir is durable only once its folder is
  fsynced (strictly: no filesystem journal that orders it for free). A file unlinked or replaced while a
  durable entry still names it is kept (a hard link in ``<base>/grave``) until that entry is gone.

``cut`` is the power cut: from that moment every operation fails (EIO), every process with a file, folder or
mapping on the mount is killed with SIGKILL, and the folder is rewritten to exactly the durable state (each
durable file's saved pages written back and cut to its durable size, every entry not durable removed); then
the filesystem unmounts and its process exits. Mounting ``<base>`` again shows only what was durable. A cut
with ``keep`` > 0 is a disk that wrote some of the rest before the power went (its own writeback, a journal
commit): each unsynced page, each file's unsynced size and each folder's current entries reach it with that
probability, so that what was synced must hold up beside a random part of what was not.

SQLite's ``-shm`` files (its WAL index, shared memory mapped by every connection) are never durable: they are
dropped at the cut as their contents are by a real power loss (SQLite rebuilds the index from the WAL when the
first connection opens the database again). Everything else of SQLite (the database, its WAL and its directory
syncs) is modelled as for any file. Not modelled: torn or reordered writes within a page, metadata (modes,
times) and hard links made on the mount.

Command line (the tests use :class:`LazyMount`, which runs these)::

    python tests/lazyfs.py serve BASE MOUNTPOINT     # mount BASE/root at MOUNTPOINT (foreground)
    python tests/lazyfs.py cut BASE [--keep 0.5]     # power cut: kill the mount's users, keep what was durable
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE = 4096
NOT_DURABLE_SUFFIXES = ("-shm",)
"""Files that a power loss leaves with meaningless contents and whose owner rebuilds them: dropped at the cut."""
FUSERMOUNT = "fusermount3"


def fuse_missing() -> str | None:
    """Why a lazy filesystem cannot be mounted here (None: it can): what is missing and how to install it."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine (FUSE is not available: a container without the device?)"
    if shutil.which(FUSERMOUNT) is None:
        return "fusermount3 is not installed: as root, apt-get install fuse3 (.ci/run does it)"
    try:
        import mfusepy  # noqa: F401  (only to know that it loads, with its libfuse3)
    except (ImportError, OSError) as exc:
        return f"mfusepy does not load ({exc}): pip install -e '.[test]' and apt-get install fuse3"
    return None


# -- the model: what is durable ------------------------------------------------------------------------------


@dataclass
class Dirty:
    """A file written since its last fsync: its durable size and the durable bytes of every page written."""

    size: int
    pages: dict[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Entry:
    """A durable folder entry: the identity it names, its kind (``file``, ``dir``, ``link``), a link's target."""

    ident: int
    kind: str
    target: str = ""


class Durable:
    """The durable state of a folder tree, kept beside the live one (``root``, where every operation is done).

    Identities are this model's own numbers, mapped from the live inode numbers (an inode number can be reused
    once its file is gone; an identity never is)."""

    def __init__(self, root: Path, grave: Path) -> None:
        self.root = root
        self.grave = grave
        self.ids: dict[int, int] = {}
        self.next_id = 1
        self.dirty: dict[int, Dirty] = {}
        self.entries: dict[int, dict[str, Entry]] = {}
        self.root_id = self.ident(os.lstat(root).st_ino)
        self._adopt(root, self.root_id)

    def ident(self, ino: int) -> int:
        if ino not in self.ids:
            self.ids[ino] = self.next_id
            self.next_id += 1
        return self.ids[ino]

    def ident_of(self, path: Path) -> int:
        return self.ident(os.lstat(path).st_ino)

    def _adopt(self, folder: Path, ident: int) -> None:
        """Everything already in the folder is durable (the state a mount starts from)."""
        self.entries[ident] = self._listing(folder)
        for name, entry in self.entries[ident].items():
            if entry.kind == "dir":
                self._adopt(folder / name, entry.ident)

    def _listing(self, folder: Path) -> dict[str, Entry]:
        out = {}
        with os.scandir(folder) as it:
            for item in it:
                st = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    kind = "dir"
                elif stat.S_ISLNK(st.st_mode):
                    kind = "link"
                else:
                    kind = "file"
                target = os.readlink(item.path) if kind == "link" else ""
                out[item.name] = Entry(self.ident(st.st_ino), kind, target)
        return out

    # -- data ----------------------------------------------------------------------------------------------

    def created(self, ident: int) -> None:
        """A file made on the mount: durable and empty until it is fsynced."""
        self.dirty[ident] = Dirty(0)

    def before_write(self, ident: int, fd: int, offset: int, length: int) -> None:
        """Save the durable bytes of the pages ``[offset, offset + length)`` touches, before they change."""
        dirty = self.dirty.get(ident)
        if dirty is None:
            dirty = self.dirty[ident] = Dirty(os.fstat(fd).st_size)
        if length <= 0:
            return
        for page in range(offset // PAGE, (offset + length - 1) // PAGE + 1):
            if page * PAGE < dirty.size and page not in dirty.pages:
                dirty.pages[page] = os.pread(fd, PAGE, page * PAGE)

    def before_truncate(self, ident: int, fd: int, length: int) -> None:
        """A shrinking truncate loses the pages past ``length``: save the durable ones first."""
        dirty = self.dirty.get(ident)
        size = dirty.size if dirty is not None else os.fstat(fd).st_size
        if length < size:
            self.before_write(ident, fd, length, size - length)
        else:
            self.before_write(ident, fd, length, 0)

    def synced(self, ident: int) -> None:
        self.dirty.pop(ident, None)

    # -- names ---------------------------------------------------------------------------------------------

    def referenced(self) -> set[int]:
        return {e.ident for entries in self.entries.values() for e in entries.values()}

    def keep(self, path: Path) -> None:
        """``path`` (a file) is about to be unlinked or replaced: kept in the grave while a durable entry names it."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            self.ids.pop(st.st_ino, None)  # an empty folder: its inode number may come back as another's
            return
        ident = self.ident(st.st_ino)
        kept = self.grave / str(ident)
        if not kept.exists() and ident in self.referenced():
            os.link(path, kept, follow_symlinks=False)

    def dir_synced(self, folder: Path) -> None:
        self.entries[self.ident_of(folder)] = self._listing(folder)
        alive = self.referenced()
        for kept in list(self.grave.iterdir()):
            if int(kept.name) not in alive:
                st = os.lstat(kept)
                kept.unlink()
                if st.st_nlink == 1:  # gone from the live tree too: forget it
                    self.ids.pop(st.st_ino, None)
                    self.dirty.pop(int(kept.name), None)

    # -- the cut -------------------------------------------------------------------------------------------

    def live_paths(self) -> dict[int, Path]:
        """Identity → a path of it in the live tree or the grave."""
        out: dict[int, Path] = {}
        for kept in self.grave.iterdir():
            out[int(kept.name)] = kept
        for folder, dirs, files in os.walk(self.root):
            for name in dirs + files:
                path = Path(folder, name)
                ino = os.lstat(path).st_ino
                if ino in self.ids:
                    out.setdefault(self.ids[ino], path)
        return out

    def restore(self, target: Path, keep: float = 0.0, rng: random.Random | None = None) -> dict[str, int]:
        """Make ``target`` (absent) the durable tree: each durable file's saved pages written back, cut to its
        durable size, and hard-linked under its durable name; folders made from their durable entries.

        ``keep`` (0 to 1): a disk that wrote some of what was never synced before the power went, as a real one
        may (its own writeback, a journal commit): each unsynced page, each file's unsynced size and each
        folder's unsynced entries reach the disk with that probability, drawn from ``rng``."""
        rng = rng or random.Random(0)
        sources = self.live_paths()
        counts = {"files": 0, "dirs": 0, "pages_undone": 0, "pages_kept": 0, "folders_kept": 0, "dropped": 0,
                  "missing": 0}
        if keep:
            for folder, _dirs, _files in os.walk(self.root):
                if rng.random() < keep:  # this folder's entries as they are: written back before the cut
                    self.entries[self.ident_of(Path(folder))] = self._listing(Path(folder))
                    counts["folders_kept"] += 1
            sources = self.live_paths()
        done: set[int] = set()

        def build(ident: int, folder: Path) -> None:
            folder.mkdir()
            counts["dirs"] += 1
            for name, entry in self.entries.get(ident, {}).items():
                path = folder / name
                if entry.kind == "dir":
                    build(entry.ident, path)
                elif entry.kind == "link":
                    os.symlink(entry.target, path)
                elif name.endswith(NOT_DURABLE_SUFFIXES):
                    counts["dropped"] += 1
                elif entry.ident in sources:
                    if entry.ident not in done:
                        undone, kept = self._undo(entry.ident, sources[entry.ident], keep, rng)
                        counts["pages_undone"] += undone
                        counts["pages_kept"] += kept
                        done.add(entry.ident)
                    os.link(sources[entry.ident], path, follow_symlinks=False)
                    counts["files"] += 1
                else:
                    counts["missing"] += 1
                    path.touch()

        build(self.root_id, target)
        return counts

    @staticmethod
    def _live_keeps(keep: float, rng: random.Random) -> bool:
        return bool(keep) and rng.random() < keep

    def _undo(self, ident: int, path: Path, keep: float, rng: random.Random) -> tuple[int, int]:
        """The file at ``path`` back to its durable bytes (but for the unsynced pages that ``keep`` lets reach
        the disk): (pages undone, pages kept)."""
        dirty = self.dirty.get(ident)
        if dirty is None:
            return 0, 0
        undone = 0
        fd = os.open(path, os.O_WRONLY)
        try:
            for page, data in dirty.pages.items():
                if not self._live_keeps(keep, rng):
                    os.pwrite(fd, data, page * PAGE)
                    undone += 1
            if not self._live_keeps(keep, rng):
                os.ftruncate(fd, dirty.size)
        finally:
            os.close(fd)
        return undone, len(dirty.pages) - undone


# -- the filesystem ------------------------------------------------------------------------------------------


class PowerCut(Exception):
    """The power is off: every operation from now on fails."""


def _operations_base() -> type:
    import mfusepy

    return mfusepy.Operations


class LazyOps(_operations_base() if fuse_missing() is None else object):  # type: ignore[misc]
    """mfusepy's operations, each done on ``root`` at once and told to the :class:`Durable` model first.

    One lock orders the operations against each other and against the cut; ``flush`` and ``release`` take
    none (a process being killed waits in its close for their answers, and the cut waits for it to die)."""

    use_ns = True

    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.model = Durable(self.root, base / "grave")
        self.mutex = threading.Lock()
        self.fd_mutex = threading.Lock()
        self.off = False
        self.trace_file = open(base / "trace.log", "a") if os.environ.get("LAZYFS_TRACE") else None  # noqa: SIM115
        self.fds: dict[int, tuple[int, int, bool]] = {}
        """fh → (backing fd, identity, tracked: False for a file that is never durable)."""

    def trace(self, op: str, *args: object) -> None:
        """One line per change and sync in ``<base>/trace.log`` when $LAZYFS_TRACE is set (to debug a row)."""
        if self.trace_file is not None:
            import mfusepy

            try:
                pid = mfusepy.fuse_get_context()[2]
            except ValueError:  # not in a FUSE request (the power switch's own thread)
                pid = 0
            self.trace_file.write(f"{time.time():.6f} {pid} {op} {' '.join(map(str, args))}\n")
            self.trace_file.flush()

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @contextlib.contextmanager
    def _on(self) -> Iterator[None]:
        with self.mutex:
            if self.off:
                raise OSError(errno.EIO, "the power is off")
            yield

    # -- reading -------------------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._on():
            st = os.fstat(self.fds[fh][0]) if fh in self.fds else os.lstat(self._path(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns",
                "st_blocks")
        out = {k: getattr(st, k) for k in keys}
        for k in ("st_atime", "st_mtime", "st_ctime"):
            out[k] = out.pop(k + "_ns")
        return out

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._on():
            return [".", "..", *os.listdir(self._path(path))]

    def readlink(self, path: str) -> str:
        with self._on():
            return os.readlink(self._path(path))

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.root)
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                             "f_files", "f_flag", "f_frsize", "f_namemax")}

    def access(self, path: str, amode: int) -> int:
        with self._on():
            if not os.access(self._path(path), amode, follow_symlinks=False):
                raise OSError(errno.EACCES, "")
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._on():
            return os.pread(self.fds[fh][0], size, offset)

    # -- files ---------------------------------------------------------------------------------------------

    def _opened(self, fd: int, path: str) -> int:
        tracked = not path.endswith(NOT_DURABLE_SUFFIXES)
        self.fds[fd] = (fd, self.model.ident(os.fstat(fd).st_ino), tracked)
        return fd

    def open(self, path: str, flags: int) -> int:
        with self._on():
            real = self._path(path)
            if flags & os.O_TRUNC and not path.endswith(NOT_DURABLE_SUFFIXES):
                with contextlib.suppress(FileNotFoundError):
                    probe = os.open(real, os.O_RDONLY)
                    try:
                        self.model.before_truncate(self.model.ident(os.fstat(probe).st_ino), probe, 0)
                    finally:
                        os.close(probe)
            return self._opened(os.open(real, (flags & ~os.O_APPEND) | os.O_CLOEXEC), path)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        with self._on():
            fd = os.open(self._path(path), (flags & ~os.O_APPEND) | os.O_CREAT | os.O_CLOEXEC, mode)
            fh = self._opened(fd, path)
            self.trace("create", path, self.fds[fh][1])
            if os.fstat(fd).st_size == 0:
                self.model.created(self.fds[fh][1])
            return fh

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._on():
            fd, ident, tracked = self.fds[fh]
            if tracked:
                self.model.before_write(ident, fd, offset, len(data))
            return os.pwrite(fd, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._on():
            if fh in self.fds:
                fd, ident, tracked = self.fds[fh]
                if tracked:
                    self.model.before_truncate(ident, fd, length)
                os.ftruncate(fd, length)
                return 0
            fd = os.open(self._path(path), os.O_RDWR | os.O_CLOEXEC)
            try:
                if not path.endswith(NOT_DURABLE_SUFFIXES):
                    self.model.before_truncate(self.model.ident(os.fstat(fd).st_ino), fd, length)
                os.ftruncate(fd, length)
            finally:
                os.close(fd)
            return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        raise OSError(errno.EOPNOTSUPP, "not modelled")

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._on():
            self.trace("fsync", path, self.fds[fh][1])
            self.model.synced(self.fds[fh][1])
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.fd_mutex:  # not the operations' mutex: see the class; the cut closes what is left under it
            entry = self.fds.pop(fh, None)
            if entry is not None:
                os.close(entry[0])
        return 0

    def close_all(self) -> None:
        """Close every backing descriptor still open (the cut's, once the mount's users are dead); a release that
        comes later finds nothing to close, and no descriptor number is closed twice."""
        with self.fd_mutex:
            for fd, _ident, _tracked in self.fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.fds.clear()

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self._on():
            os.utime(self._path(path), ns=times, follow_symlinks=False)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        with self._on():
            os.chmod(self._path(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self._on():
            os.lchown(self._path(path), uid, gid)
        return 0

    # -- names ---------------------------------------------------------------------------------------------

    def mkdir(self, path: str, mode: int) -> int:
        with self._on():
            self.trace("mkdir", path)
            os.mkdir(self._path(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        with self._on():
            self.trace("rmdir", path)
            self.model.keep(self._path(path))
            os.rmdir(self._path(path))
        return 0

    def unlink(self, path: str) -> int:
        with self._on():
            self.trace("unlink", path)
            self.model.keep(self._path(path))
            os.unlink(self._path(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._on():
            self.trace("rename", old, new)
            self.model.keep(self._path(new))
            os.rename(self._path(old), self._path(new))
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self._on():
            os.symlink(source, self._path(target))
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self._on():
            self.trace("fsyncdir", path, self.model.ident_of(self._path(path)))
            self.model.dir_synced(self._path(path))
        return 0

    # -- the cut -------------------------------------------------------------------------------------------

    def power_off(self) -> None:
        with self.mutex:  # after the operation in flight: nothing from now on changes the live tree
            self.off = True
            self.trace("power off")


def users(mountpoint: Path, spare: set[int]) -> list[int]:
    """Processes with a descriptor, a mapping, a working or root folder on the mount (``spare`` left out)."""
    prefix = str(mountpoint)
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        if _uses(Path(entry.path), prefix):
            found.append(int(entry.name))
    return found


def _on_mount(text: str, prefix: str) -> bool:
    return text == prefix or text.startswith(prefix + "/")


def _uses(proc: Path, prefix: str) -> bool:
    try:
        links = [proc / "cwd", proc / "root", *(proc / "fd").iterdir()]
        if any(_on_mount(os.readlink(link), prefix) for link in links if link.is_symlink()):
            return True
        return f" {prefix}/" in (proc / "maps").read_text()
    except OSError:  # gone meanwhile, or a descriptor closed between the listing and its readlink
        return False


def kill_users(mountpoint: Path, spare: set[int], also: list[int], seconds: float = 20.0) -> list[int]:
    """SIGKILL every user of the mount and ``also``; wait until none uses it. Returns the pids killed."""
    killed: list[int] = []
    for pid in also:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + seconds
    while True:
        left = users(mountpoint, spare)
        if not left:
            return killed
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {left} still use {mountpoint} {seconds:g} s after SIGKILL")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
        time.sleep(0.01)  # a killed process lets go of its files as it exits: polled, with a deadline


class Control:
    """The power switch: a Unix socket in ``<base>`` that takes one JSON request a connection (``cut``)."""

    def __init__(self, ops: LazyOps, base: Path, mountpoint: Path) -> None:
        self.ops, self.base, self.mountpoint = ops, base, mountpoint
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = base / "control.sock"
        path.unlink(missing_ok=True)
        self.sock.bind(str(path))
        self.sock.listen(4)
        threading.Thread(target=self._serve, name="lazyfs-control", daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            with conn:
                request = json.loads(conn.makefile().readline())
                peer = _peer_pid(conn)
                try:
                    answer = self.cut(request, {os.getpid(), peer})
                except Exception as exc:  # said to the caller, who fails its test with it
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                conn.sendall((json.dumps(answer) + "\n").encode())
            if request.get("op") == "cut":
                _unmount(self.mountpoint)
                return

    def cut(self, request: dict[str, Any], spare: set[int]) -> dict[str, Any]:
        started = time.monotonic()
        self.ops.power_off()
        off_at = time.time()
        killed = kill_users(self.mountpoint, spare | set(request.get("spare", [])), list(request.get("kill", [])))
        self.ops.close_all()
        model = self.ops.model
        dirty_bytes = sum(len(p) for d in model.dirty.values() for p in d.pages.values())
        after = self.base / "next"
        counts = model.restore(after, float(request.get("keep", 0.0)), random.Random(request.get("seed", 0)))
        old = self.base / "before-the-cut"
        os.rename(model.root, old)
        os.rename(after, model.root)
        shutil.rmtree(old)
        shutil.rmtree(model.grave)
        model.grave.mkdir()
        return {"off_at": off_at, "killed": killed, "dirty_files": len(model.dirty), "undo_bytes": dirty_bytes,
                **counts, "seconds": round(time.monotonic() - started, 3)}


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def _unmount(mountpoint: Path) -> None:
    if subprocess.run([FUSERMOUNT, "-u", str(mountpoint)], capture_output=True).returncode != 0:
        subprocess.run([FUSERMOUNT, "-u", "-z", str(mountpoint)], capture_output=True)


def _orphaned(parent: int, mountpoint: Path) -> None:
    """Unmount once the process that started this one is gone (a test run killed): no mount is left behind."""
    while os.getppid() == parent:
        time.sleep(1.0)  # a parent's death has no event to wait on here: looked at once a second
    _unmount(mountpoint)


def serve(base: Path, mountpoint: Path) -> None:
    """Mount ``<base>/root`` at ``mountpoint`` until unmounted or cut (in the foreground)."""
    import mfusepy

    (base / "root").mkdir(parents=True, exist_ok=True)
    (base / "grave").mkdir(exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    ops = LazyOps(base)
    Control(ops, base, mountpoint)
    threading.Thread(target=_orphaned, args=(os.getppid(), mountpoint), name="lazyfs-orphan", daemon=True).start()
    # kernel_cache: every change comes through this mount, so the kernel's page cache of a file stays true
    # across opens; without it each open of SQLite's -shm would drop the pages other connections have mapped.
    # hard_remove: an open file unlinked is unlinked at once, as on a disk (libfuse otherwise renames it to a
    # .fuse_hidden name until it is closed, which a folder's fsync would make durable).
    mfusepy.FUSE(ops, str(mountpoint), foreground=True, nothreads=False, kernel_cache=True, hard_remove=True,
                 fsname="lazyfs", subtype="lazyfs")


# -- the tests' handle -----------------------------------------------------------------------------------------


class LazyMount:
    """A lazy filesystem for a test: ``mount()`` (again after a cut), ``cut()``, ``unmount()``.

    ``base`` holds the backing folder and the control socket; it must not lie under the mount. The serving
    process is started with ``base`` alone on its command line, so that a search for the processes of the
    test's folder (which holds the mount point) does not find it."""

    def __init__(self, base: Path, mountpoint: Path) -> None:
        self.base, self.mountpoint = base, mountpoint
        self.proc: subprocess.Popen[bytes] | None = None
        self.cuts: list[dict[str, Any]] = []

    def mount(self, seconds: float = 20.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "mountpoint").write_text(str(self.mountpoint))
        log = open(self.base / "lazyfs.log", "ab")  # noqa: SIM115  (the child keeps it)
        self.proc = subprocess.Popen([sys.executable, __file__, "serve", str(self.base)], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + seconds
        while not (os.path.ismount(self.mountpoint) and (self.base / "control.sock").exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lazyfs did not mount {self.mountpoint}: {self.log_tail()}")
            time.sleep(0.01)  # the mount appears when the FUSE process is ready: polled, with a deadline

    def cut(self, kill: tuple[int, ...] | list[int] = (), seconds: float = 60.0, keep: float = 0.0,
            seed: int = 0) -> dict[str, Any]:
        """The power cut: returns what it did (pids killed, files restored, pages undone, its time). ``keep``:
        the share of unsynced pages, sizes and folders' entries that reached the disk anyway (``Durable.restore``)."""
        answer = request(self.base, {"op": "cut", "kill": list(kill), "keep": keep, "seed": seed}, seconds)
        if self.proc is not None:
            self.proc.wait(seconds)
            self.proc = None
        if "error" in answer:
            raise RuntimeError(f"the power cut failed: {answer['error']}; {self.log_tail()}")
        self.cuts.append(answer)
        return answer

    def unmount(self) -> None:
        if self.proc is None:
            return
        _unmount(self.mountpoint)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.base / "lazyfs.log").read_text(errors="replace")[-2000:]
        return ""

    def __enter__(self) -> LazyMount:
        self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()


def request(base: Path, body: dict[str, Any], seconds: float) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(seconds)
        sock.connect(str(base / "control.sock"))
        sock.sendall((json.dumps(body) + "\n").encode())
        return json.loads(sock.makefile().readline())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("serve", help="mount BASE/root at MOUNTPOINT (or at the one BASE/mountpoint names)")
    one.add_argument("base", type=Path)
    one.add_argument("mountpoint", type=Path, nargs="?")
    two = sub.add_parser("cut", help="the power cut: kill the mount's users, keep only what was durable, unmount")
    two.add_argument("base", type=Path)
    two.add_argument("--keep", type=float, default=0.0,
                     help="the share of unsynced pages and folder entries written anyway (default 0: none)")
    args = parser.parse_args(argv)
    why = fuse_missing()
    if why:
        print(f"lazyfs: {why}", file=sys.stderr)
        return 2
    base = args.base.resolve()
    if args.command == "cut":
        print(json.dumps(request(base, {"op": "cut", "keep": args.keep, "seed": random.randrange(2**32)}, 60.0)))
        return 0
    mountpoint = args.mountpoint or Path((base / "mountpoint").read_text())
    serve(base, mountpoint.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
