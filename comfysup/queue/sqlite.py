"""The SQLite backend: one WAL file on a local disk, every write its own durable transaction.

- ``synchronous=FULL``: a committed submit or ``done`` survives a power loss.
- ``BEGIN IMMEDIATE`` for every transaction that writes: a deferred transaction that upgrades to a
  write lock gets SQLITE_BUSY at once, ignoring the busy timeout.
- The connection is opened lazily in the process that uses it, never inherited: SQLite forbids
  carrying a connection across fork. Its in-process lock bookkeeping is copied into the child, where
  the OS locks it stands for are not held, so a child opening a second connection would believe it
  holds locks it does not, and the parent's last close would then delete the WAL under the child's
  feet (committed writes lost). So every queue closes its idle connection just before ``os.fork``
  (``os.register_at_fork``), and a connection a child still inherits is never used or closed there.
- One lock per queue serialises its transactions, so threads sharing a queue never interleave
  statements on one connection, and a fork waits for a running transaction to end.
- Processes wait for the write lock in SQLite's own busy handler, which sleeps between tries. A blocking
  ``flock`` on a file next to the database, taken before BEGIN IMMEDIATE so the lock passes to a waiter the
  moment it is free, was measured and dropped: SQLite empties a connection's page cache once
  another connection has committed, so each handoff cost the new holder about 15 page reads inside the
  lock. With 4 processes it did 15-20 % fewer transactions per second on 30-70 % more CPU per job. The
  busy handler's sleeps let one process commit several transactions in a row with a warm cache.
- A periodic PASSIVE checkpoint and ``journal_size_limit`` keep the WAL bounded.
- The runner's side takes its time once the write lock is held, so the times recorded follow the order of
  commits: a claim that waited for the lock behind a release never appears to start before that release
  ended, and a lease is counted from when it was granted, not from before a wait for the lock.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from comfysup import safefs
from comfysup.errors import DatabaseMissing, QueueError
from comfysup.queue import queries, records
from comfysup.queue import sqlite_statements as statements_of
from comfysup.queue.base import DONE, TERMINAL, NewJob
from comfysup.queue.core import SQLQueue
from comfysup.queue.db import ClaimAsk, SQLDb
from comfysup.queue.reads import fetch
from comfysup.queue.specs import SpecCache
from comfysup.queue.sqlite_file import BackgroundCheckpoint, FileCheck, refuse_network_filesystem, settle, statements
from comfysup.workflows import content_hash

if TYPE_CHECKING:
    from comfysup.queue.run_values import Delivery, PruneBatch

SCHEMA_VERSION = 21
BUSY_FIRST_STEP_SECONDS = 0.0002
BUSY_STEP_SECONDS = 0.002
"""How a write waits for the lock another process holds: 0.2 ms, doubling to 2 ms a try (see ``_begin``)."""
IDLE_WAIT_CAP_SECONDS = 0.25
WAKE_CHECK_SECONDS = 0.02
"""How often an idle waiter looks whether another connection committed (``PRAGMA data_version``: a read of
the WAL index in shared memory, no disk I/O). A job submitted to an idle runner used to wait up to
IDLE_WAIT_CAP_SECONDS for its claim (bench/real.py: 0.26 s from ``comfysup submit``'s start to ComfyUI's
first execution, of which 0.2 s the command itself); now at most this long."""
SQL = queries.load("sqlite")

T = TypeVar("T")


_INHERITED: list[sqlite3.Connection] = []
"""Connections that came across a fork: kept referenced so the child never closes (frees) them."""


class SQLiteQueue(SQLQueue):
    """The default queue backend: the queue's roles over one SQLite file (``SQLiteDb``). See comfysup.queue.base
    for the contract, comfysup.queue.core for the code both backends share."""

    def __init__(self, path: str | Path, *, create: bool = True, busy_timeout_seconds: float = 30.0,
                 checkpoint_seconds: float = 30.0, default_callback_url: str = "",
                 assets_dir: str | Path | None = None) -> None:
        db = SQLiteDb(path, create=create, busy_timeout_seconds=busy_timeout_seconds,
                      checkpoint_seconds=checkpoint_seconds, default_callback_url=default_callback_url)
        self.path = db.path
        super().__init__(db, assets_dir=Path(assets_dir) if assets_dir else db.path.parent / "assets")
        """Input files: [assets] dir, else a folder next to the queue file."""


class SQLiteDb(SQLDb):
    """SQLite's dialect: the file, its connection, its locks and its own statements."""

    DIALECT = "sqlite"
    DURABLE_SYNC = "FULL"
    CHEAP_SYNC = "NORMAL"
    """``synchronous`` of a durable commit and of one that need not be (``_write``'s ``durable=False``)."""
    SCHEMA = "schema.sql"
    WHOLE_SCHEMA = "schema_whole.sql"
    SCHEMA_VERSION = SCHEMA_VERSION

    def __init__(self, path: str | Path, *, create: bool = True, busy_timeout_seconds: float = 30.0,
                 checkpoint_seconds: float = 30.0, default_callback_url: str = "") -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.default_callback_url = default_callback_url
        self.busy_timeout_seconds = busy_timeout_seconds
        self.checkpoint_seconds = checkpoint_seconds
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._settings: tuple[int, str] | None = None
        """(busy_timeout ms, synchronous) the open connection runs with, None when unsure: see ``_settle``."""
        self._identity: tuple[int, int] | None = None
        """(device, inode) of the file the open connection holds: see :meth:`replaced`."""
        self._file_check = FileCheck(self.path, busy_timeout_seconds)
        self._setup()
        self._last_checkpoint = time.monotonic()
        self._checkpointer: BackgroundCheckpoint | None = None
        """The thread of ``checkpoint_in_background``, and what stops it; None while commits checkpoint."""
        if not self.path.exists() and not create:
            raise DatabaseMissing(f"{self.path}: no queue database here. Submit jobs first "
                                  "(comfysup submit jobs.jsonl), or point [queue] path at the right file.")
        refuse_network_filesystem(self.path)
        if not self.path.exists():
            self._create_file()
        self._migrate()

    # -- connection -----------------------------------------------------------------------------------

    def _create_file(self) -> None:
        directory = self.path.parent
        try:
            safefs.private_dirs(directory, durable=True)
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # another process created it first; its file is as good as ours
        except OSError as exc:
            raise QueueError(f"{self.path}: cannot create the queue database: {exc.strerror}") from exc
        os.close(fd)
        # Its name, before a first submit is acknowledged: SQLite syncs the folder for its WAL, never for the
        # database file it is handed, and the folders made above are synced in theirs.
        safefs.sync_dir(directory)

    @property
    def conn(self) -> sqlite3.Connection:
        """This process's connection, with its busy_timeout and ``synchronous = FULL`` for every statement outside
        a write transaction (``_write`` leaves other settings behind it); one inherited across fork is dropped."""
        conn = self._connection()
        if not conn.in_transaction:
            self._settle(conn, int(self.busy_timeout_seconds * 1000), self.DURABLE_SYNC)
        return conn

    def _connection(self) -> sqlite3.Connection:
        """This process's connection as it is; a connection inherited across fork is dropped, never used."""
        if self._conn is None or self._pid != os.getpid():
            self._abandon()
            if not self.path.exists():  # only __init__ creates the file: a reconnect never makes an empty one
                raise DatabaseMissing(f"{self.path}: the queue database is gone (deleted or moved while comfysup "
                                      "was using it); restore it, or start comfysup again to make a new one")
            try:
                self._settings = None
                self._conn = self._connect()
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            self._pid = os.getpid()
        return self._conn

    def _abandon(self) -> None:
        """Forget a connection opened by another process without closing it (closing frees state the
        parent still uses)."""
        if self._conn is not None and self._pid != os.getpid():
            _INHERITED.append(self._conn)
            self._conn = None

    def _drop_for_fork(self) -> None:
        """Just before fork: close this process's connection unless a transaction of this thread is open
        (then the child abandons it)."""
        if self._conn is not None and self._pid == os.getpid() and not self._conn.in_transaction:
            self._conn.close()
            self._conn = None

    def replaced(self) -> str | None:
        """None while the file at the path is the one this process has open (or none is open yet); else
        what happened to it: a database deleted or replaced under a running process takes every later
        write with the old file, and nothing tells SQLite."""
        if self._conn is None or self._pid != os.getpid() or self._identity is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path} was deleted while open"
        except OSError:
            return None  # cannot tell (a permission change): the next write says what is wrong
        if (st.st_dev, st.st_ino) != self._identity:
            return f"{self.path} was replaced by another file while open (inode {self._identity[1]} → {st.st_ino})"
        return None

    def integrity(self, deep: bool = False) -> str | None:
        """None while the file on disk reads as a database (its size, its page 1 read afresh; with ``deep``, SQLite's
        ``PRAGMA quick_check``); else what is wrong with it, in SQLite's words where it has any (sqlite_file)."""
        if self._conn is None or self._pid != os.getpid():
            return None
        if not self._file_check.page_size:
            with contextlib.suppress(QueueError):  # one that meets a corrupt page is said by the check itself
                self._file_check.page_size = self._read("PRAGMA page_size")[0][0]
        return self._file_check.problem(deep)

    def _connect(self) -> sqlite3.Connection:
        # mode=rw: the file must exist (made by __init__); deleted in the meantime, it is not made again empty
        conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=rw", uri=True,
                               timeout=self.busy_timeout_seconds, isolation_level=None, check_same_thread=False)
        with contextlib.suppress(OSError):  # right after the open: the file the connection holds
            st = os.stat(self.path)
            self._identity = (st.st_dev, st.st_ino)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_seconds * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise QueueError(f"{self.path}: could not switch the database to WAL mode (got {mode})")
            conn.execute(f"PRAGMA synchronous = {self.DURABLE_SYNC}")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute("PRAGMA foreign_keys = ON")
            # For the v5 migration (and only there): SQL cannot hash or read loader nodes by itself.
            conn.create_function("comfysup_sha256", 1, content_hash, deterministic=True)
            conn.create_function("comfysup_model_key", 1, statements_of.model_key_of_text, deterministic=True)
        except BaseException:
            conn.close()
            raise
        self._settings = (int(self.busy_timeout_seconds * 1000), self.DURABLE_SYNC)
        return conn

    def _settle(self, conn: sqlite3.Connection, busy_ms: int, sync: str) -> None:
        if self._settings != (busy_ms, sync):
            now, self._settings = self._settings, None  # unsure until settle returns
            self._settings = settle(conn, now, busy_ms, sync)

    @contextlib.contextmanager
    def _write(self, durable: bool = True, busy_seconds: float | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction taken with BEGIN IMMEDIATE, committed or rolled back as a whole.

        ``durable=False`` commits without an fsync (``synchronous=NORMAL`` for this transaction): still
        safe from a crash of any process, lost only with the machine's power, and made durable by the
        next durable commit, which syncs every frame before it. Only writes that describe a prompt
        running on this very machine use it (heartbeat, record_prompt, set_progress): a power loss ends
        that prompt too, so what they said is moot after one. Claims, submits and ends stay durable.

        ``busy_seconds``: wait at most this long for the write lock (not busy_timeout_seconds), for a write that
        may be skipped when another process holds the lock that long (DatabaseLocked then).
        """
        with self._lock:
            conn = self._connection()
            try:
                self._settle(conn, 0, self.DURABLE_SYNC if durable else self.CHEAP_SYNC)
                self._begin(conn, self.busy_timeout_seconds if busy_seconds is None else busy_seconds)
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            try:
                yield conn
                conn.execute("COMMIT")
                if self._checkpointer is not None:
                    self._checkpointer.committed()
            except BaseException as exc:
                # SQLite may have rolled back by itself (disk full, I/O error): never let a failing
                # ROLLBACK hide the error that caused it.
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc) from exc
                raise

    def _begin(self, conn: sqlite3.Connection, wait_seconds: float) -> None:
        """BEGIN IMMEDIATE, waiting up to ``wait_seconds`` for the write lock in short steps of its own
        (BUSY_STEP_SECONDS at most) instead of SQLite's busy handler, whose sleeps grow 1, 2, 5, 10, 15, 20, 25
        ms: a runner that met another process's commit of a millisecond slept on for up to 18 ms, and twice
        in a row for 40, while its server waited for the next prompt (bench/e2e.py, 20 ms prompts on two
        servers: 20-80 ms idle a few times a run, most of the servers' idle time).

        The caller (``_write``) set busy_timeout to 0 and leaves it so for the statements of the transaction,
        which wait for nothing: in WAL mode a connection holding the write lock takes no other lock until its
        COMMIT ends (SQLite calls its busy handler only while taking a lock: BEGIN's, or a checkpoint's other
        than PASSIVE; a commit's own autocheckpoint is PASSIVE). Every statement outside a write transaction
        gets the connection's busy_timeout back first (``conn``)."""
        give_up = time.monotonic() + wait_seconds
        step = BUSY_FIRST_STEP_SECONDS
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY or time.monotonic() >= give_up:
                    raise
            time.sleep(min(step, max(give_up - time.monotonic(), 0.0)))
            step = min(step * 2, BUSY_STEP_SECONDS)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row | tuple]:
        with self._lock:
            try:
                return self.conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    def _translate(self, exc: sqlite3.Error) -> Exception:
        return self._file_check.translate(exc, self.busy_timeout_seconds)

    def transaction(self, fn: Callable[..., T], *args: Any, write: bool = True, durable: bool = True,
                     busy_seconds: float | None = None) -> T:
        """A write runs in ``_write`` (``busy_seconds``: see there); a read runs alone, outside any transaction, so
        it never waits for the write lock. Rows are ``sqlite3.Row``, read by column name."""
        if write:
            with self._write(durable, busy_seconds) as conn:
                return fn(conn, *args)
        with self._lock:
            try:
                return fn(self.conn, *args)
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    @staticmethod
    def time(now: float | None) -> float:
        """This machine's clock (one machine), read inside the transaction once the write lock is held."""
        return time.time() if now is None else now

    def id_list(self, ids: Sequence[str]) -> str:
        """One JSON text: ``= ANY(?)`` reads it with json_each (see comfysup.queue.queries)."""
        return statements_of.id_list(ids)

    def _migrate(self) -> None:
        """Bring the schema forward. An up-to-date file is only read, so opening it to run ``status`` or
        ``show`` never waits for the write lock that a long submit holds."""
        if self._read("PRAGMA user_version")[0][0] == SCHEMA_VERSION:
            return
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for _step, script in self.schema_steps(version):
                for statement in statements(script):
                    conn.execute(statement)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def checkpoint_in_background(self) -> None:
        """This process's commits no longer checkpoint the WAL themselves; a thread of its own does, on its own
        connection, after every CHECKPOINT_COMMITS commits (once a second at most) and every few seconds while the WAL
        changes (comfysup.queue.sqlite_file; PASSIVE: it never blocks a reader or a writer).

        For a runner: SQLite's wal_autocheckpoint runs a whole checkpoint inside the commit that takes the WAL
        past 1,000 pages, writing them into the database and fsyncing it, 100-200 ms on this project's test
        machine, about every hundred jobs; the runner's server waited that long for its next prompt
        (bench/e2e.py, 20 ms prompts on two servers: four such waits a run, most of the servers' idle time).
        Other processes (submit, the supervisor, the API) keep checkpointing as SQLite does."""
        if self._checkpointer is not None and self._checkpointer.alive():
            return
        self._checkpointer = BackgroundCheckpoint(self.path)
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.execute("PRAGMA wal_autocheckpoint = 0")
        self._checkpointer.start()

    def _stop_checkpoints(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()

    def close(self) -> None:
        self._stop_checkpoints()
        with self._lock:
            self._abandon()
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    def maintenance(self) -> None:
        """A PASSIVE checkpoint every ``checkpoint_seconds``: it never blocks readers or writers."""
        if time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds:
            self._last_checkpoint = time.monotonic()
            with self._lock, contextlib.suppress(sqlite3.OperationalError):
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def wait_for_work(self, timeout_seconds: float) -> None:
        """Nothing can wake a process waiting on a SQLite file, so this sleeps in steps of WAKE_CHECK_SECONDS
        and returns at the first step after another connection committed (a submit, a retry coming due is
        not a commit: the timeout covers it); never longer than IDLE_WAIT_CAP_SECONDS, so a caller that
        checks a stop flag between waits stays responsive. Another runner's commit (a claim, a heartbeat)
        wakes it too: the caller looks for a job once more, and waits again. This connection's own commits
        do not change ``data_version``."""
        deadline = time.monotonic() + max(0.0, min(timeout_seconds, IDLE_WAIT_CAP_SECONDS))
        seen = self._data_version()
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(WAKE_CHECK_SECONDS, left))
            if seen is not None and self._data_version() != seen:
                return

    def _data_version(self) -> int | None:
        """None when the file does not answer: the wait then only sleeps (it never raises)."""
        try:
            return self._read("PRAGMA data_version")[0][0]
        except QueueError:
            return None

    # -- the runner's side --------------------------------------------------------------------------------

    def take(self, conn: sqlite3.Connection, ask: ClaimAsk, at: float, cached: Mapping[int, Any]
             ) -> dict[str, Any] | None:
        return statements_of.take(conn, ask, at, cached)

    # -- the dialect's statements (comfysup.queue.sqlite_statements) ---------------------------------------------

    def bulk(self, conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]:
        return statements_of.bulk(conn)

    def insert_batch(self, conn: sqlite3.Connection, batch: list[NewJob], at: float | None,
                      conflicts: list[str], cache: SpecCache) -> tuple[int, int]:
        return statements_of.insert_batch(conn, batch, at, conflicts, cache)

    def fenced(self, conn: sqlite3.Connection, job_sql: str, job_args: Sequence[Any], attempt_sql: str | None = None,
                attempt_args: Sequence[Any] = ()) -> Any:
        return statements_of.fenced(conn, job_sql, job_args, attempt_sql, attempt_args)

    # -- webhook deliveries and prune -------------------------------------------------------------------------

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """A read looks first: deliverers poll every second, and an idle poll must not take the write lock
        that runners' claims and heartbeats wait for."""
        at = self.time(now)
        if not self.transaction(fetch, SQL["any_due"], {"now": at}, write=False):
            return []
        rows = self.transaction(statements_of.hold_deliveries, at, limit, at + hold_seconds)
        return [records.delivery(r, next_at=at + hold_seconds) for r in rows]  # next_at: the end of the hold

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """Up to ``limit`` terminal jobs finished before ``finished_before``, with their attempts, deliveries
        and the workflows no remaining job uses, in one short transaction. A job whose webhook is still being
        delivered stays until its delivery ends."""
        return self.transaction(statements_of.prune, finished_before, limit)

__all__ = ["DONE", "TERMINAL", "SQLiteDb", "SQLiteQueue"]
