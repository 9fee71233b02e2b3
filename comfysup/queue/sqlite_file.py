"""The SQLite queue's file: where it may live (never on a network filesystem, whose locks SQLite cannot trust), the
schema script's statements, and the thread that checkpoints the WAL of a process whose commits must not.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from comfysup.errors import DatabaseCorrupt, DatabaseLocked, QueueError
from comfysup.queue import queries

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre",
    "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "davfs", "fuse.glusterfs", "beegfs", "gpfs",
})
BACKGROUND_CHECKPOINT_SECONDS = 5.0
"""How often ``checkpoint_in_background``'s thread looks at the WAL at least (and checkpoints it when it changed)."""
CHECKPOINT_COMMITS = 100
"""After this many commits of its process (25 jobs of a runner, about SQLite's own 1,000 pages) the thread looks at
once, though never sooner than CHECKPOINT_GAP_SECONDS after its last checkpoint: a runner of trivial jobs is
checkpointed once a second, one of jobs that take a second or more every BACKGROUND_CHECKPOINT_SECONDS. Once a
second whatever the pace, its wake-ups and fsyncs took 1-3 ms of CPU a second from the cores a ComfyUI computes on
(bench/profile_runner.py following one 6 s prompt: 40 ms of the runner's CPU with the thread, 23 ms without)."""
CHECKPOINT_GAP_SECONDS = 1.0

def settle(conn: sqlite3.Connection, now: tuple[int, str] | None, busy_ms: int, sync: str) -> tuple[int, str]:
    """``busy_timeout`` and ``synchronous`` as asked, each set only when ``now`` (what the connection runs with,
    None when unsure) differs: a runner's writes follow one another with nothing between, so most need neither
    PRAGMA (they were 12 of the 34 statements of a job: busy_timeout set to 0 and back around each BEGIN
    IMMEDIATE, synchronous to NORMAL and back around each commit that need not be durable). Returns the new
    state; a PRAGMA that fails raises before it, and the caller, still unsure, sets both the next time."""
    if now is None or now[0] != busy_ms:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
    if now is None or now[1] != sync:
        conn.execute(f"PRAGMA synchronous = {sync}")
    return busy_ms, sync


def named_sql() -> dict[str, str]:
    """The schema's steps from schema.sql (``-- name: vN`` headers)."""
    return queries.read("schema.sql")


def statements(script: str) -> Iterator[str]:
    """The statements of a named step, one at a time: split at semicolons, rejoined until SQLite says a
    statement is complete (a trigger's body holds semicolons of its own); comment-only pieces are skipped."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            code = "\n".join(line for line in pending.splitlines() if not line.lstrip().startswith("--"))
            if code.strip(" \n;"):
                yield pending
            pending = ""


def filesystem_type(path: Path) -> str:
    """The type of the filesystem that holds ``path`` (the longest matching mount point)."""
    target = str(path.resolve())
    best, kind = "", ""
    for mountpoint, fstype in _mounts():
        mount = mountpoint.rstrip("/") or "/"
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, fstype
    return kind


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount: /proc/self/mounts on Linux, psutil's list elsewhere."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:  # not Linux: psutil, which costs a command's start-up more than Linux ever needs it
        import psutil

        return [(p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]
    octal = re.compile(r"\\([0-7]{3})")  # a space in a mount point is written \040
    fields = (line.split() for line in lines)
    return [(octal.sub(lambda m: chr(int(m.group(1), 8)), f[1]), f[2]) for f in fields if len(f) >= 3]


def refuse_network_filesystem(path: Path) -> None:
    """A queue file on a share is refused: checked on the nearest existing folder, before anything is created
    on it."""
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    kind = filesystem_type(existing)
    if kind.lower() in NETWORK_FILESYSTEMS:
        raise QueueError(f"{path}: on a network filesystem ({kind}). SQLite's locks are not reliable "
                         "there and the queue could hand one job to two runners; put [queue] path on a "
                         "local disk, or use PostgreSQL ([queue] url) to share a queue between machines.")


class BackgroundCheckpoint:
    """A thread that checkpoints one database's WAL on its own connection, woken by its process's commits
    (``committed``, CHECKPOINT_COMMITS) or the clock, while the WAL changes (PASSIVE: it never blocks a reader or
    a writer); see ``SQLiteDb.checkpoint_in_background``."""

    def __init__(self, path: Path) -> None:
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        """Set by a stop, or when CHECKPOINT_COMMITS commits were made since the thread last looked."""
        self.commits = 0
        self.thread = threading.Thread(target=_checkpoints, args=(path, self.stop_event, self.wake),
                                       name="comfysup-wal-checkpoint", daemon=True)

    def committed(self) -> None:
        """One more commit of this process (called with the queue's lock held)."""
        self.commits += 1
        if self.commits >= CHECKPOINT_COMMITS:
            self.commits = 0
            self.wake.set()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        if self.thread is not threading.current_thread() and self.thread.is_alive():
            self.thread.join(10)


def _checkpoints(path: Path, stop: threading.Event, wake: threading.Event) -> None:
    wal = Path(f"{path}-wal")
    seen: tuple[int, int] | None = None
    conn: sqlite3.Connection | None = None
    last = -math.inf
    try:
        while True:
            wake.wait(BACKGROUND_CHECKPOINT_SECONDS)
            wake.clear()
            if stop.wait(max(0.0, last + CHECKPOINT_GAP_SECONDS - time.monotonic())):
                break
            try:
                st = os.stat(wal)
            except OSError:
                continue  # no WAL (yet, or the database is gone): nothing to checkpoint
            if (st.st_size, st.st_mtime_ns) == seen:
                continue
            try:
                if conn is None:  # mode=rw: a database deleted meanwhile is never made again, empty
                    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=rw", uri=True,
                                           timeout=0, isolation_level=None, check_same_thread=False)
                    conn.execute("PRAGMA cache_size = -64")  # 64 KiB: a checkpoint copies, it caches nothing
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                seen, last = (st.st_size, st.st_mtime_ns), time.monotonic()
            except sqlite3.Error:  # busy (another checkpoint), or the file is gone: again the next time
                if conn is not None:
                    conn.close()
                conn = None
    finally:
        if conn is not None:
            conn.close()


MIN_FILE_BYTES = 512
"""The smallest SQLite database file that holds a page (the smallest page size); a queue in WAL mode always has
page 1 on disk."""


class FileCheck:
    """The integrity of the queue's file (``SQLiteDb.integrity``): a cheap look every heartbeat, or a deep one.

    The file is never opened here with ``open()``: closing any descriptor of a file drops every POSIX lock this
    process holds on it, SQLite's included, and another process's last connection would then delete the WAL
    under this one's feet. So the cheap look is a ``stat`` (a SQLite file is always a whole number of pages) and a
    connection of its own reading the schema's version from page 1 (SQLite keeps such a connection's descriptor
    open while others of this process hold locks); the deep look is ``PRAGMA quick_check`` on such a connection.
    Neither uses a cache, so a header overwritten on disk is seen as SQLite will see it."""

    def translate(self, exc: sqlite3.Error, busy_timeout_seconds: float) -> Exception:
        """A message a person can act on instead of sqlite3's exception (and its traceback); a corrupt file is also
        remembered (``said``) for the watch."""
        text = str(exc)
        if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            self.said = f"{self.path} fails its integrity check: SQLite says: {text}"
            return DatabaseCorrupt(f"{self.said}; restore it from a backup, or move it away")
        if "locked" in text or "busy" in text:
            return DatabaseLocked(f"{self.path}: {text} for more than {busy_timeout_seconds:g} s; another "
                                  "process holds a write lock (a long transaction or a stuck process)")
        return QueueError(f"{self.path}: {text}")

    def __init__(self, path: Path, timeout_seconds: float = 5.0) -> None:
        self.path = path
        self.timeout_seconds = timeout_seconds
        self.page_size = 0
        """This database's page size (set by the queue once it is open; it never changes in WAL mode)."""
        self.said: str | None = None
        """What SQLite itself said of the file when a query of this process met a corrupt page (SQLITE_CORRUPT or
        SQLITE_NOTADB): a page a cheap look cannot see, in SQLite's own words."""

    def problem(self, deep: bool = False) -> str | None:
        if self.said is not None:
            return self.said
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return None  # gone (``replaced`` says so) or unreadable: the next query says what is wrong
        lost = f"{self.path} fails its integrity check"
        if size < MIN_FILE_BYTES:  # never opened then: SQLite deletes the WAL of a database with no page
            return f"{lost}: it is {size} bytes long, less than one page (truncated)"
        if self.page_size and size % self.page_size:
            return f"{lost}: it is {size} bytes long, not a whole number of its {self.page_size}-byte pages (cut)"
        words = self.sqlite_says(quick=deep)
        return f"{lost}: SQLite says: {words}" if words else None

    def sqlite_says(self, quick: bool) -> str | None:
        """SQLite's own words about the file (None: it reads well, or is busy): ``PRAGMA quick_check`` when
        ``quick``, else whether it can read the schema at all."""
        try:
            conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True,
                                   timeout=self.timeout_seconds, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            return str(exc)
        try:
            rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)" if quick else "PRAGMA schema_version")]
        except sqlite3.Error as exc:
            busy = getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            return None if busy else str(exc)
        finally:
            conn.close()
        return "; ".join(rows)[:500] if quick and rows != ["ok"] else None
