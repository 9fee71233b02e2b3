"""The PostgreSQL backend: one queue shared by several machines, with the contract of the SQLite one.

- The claim is one statement: ``UPDATE … WHERE seq = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1)``, so
  runners on every machine take different rows without waiting for each other.
- Time comes from the database server (``extract(epoch from now())``) whenever ``now`` is None: leases,
  ``run_after`` and heartbeats of every machine are stamped by one clock, so a machine whose clock runs
  ahead cannot expire a live lease on another. ``now()`` is the transaction's start, so every statement
  of one operation agrees on the time. Tests pass ``now=`` and get exactly that.
- Every operation is one transaction (``autocommit=False``) on this process's connection. A connection
  is never used across fork: psycopg's and libpq's state belongs to the process that opened it, and
  closing an inherited one would end the parent's session, so a child abandons it (kept referenced,
  never closed or freed) and opens its own.
- A connection that went stale while idle (the server restarted) is replaced and the operation retried
  once, but only when the failure came before COMMIT was sent: the server rolled that transaction back,
  so nothing can happen twice. A failure during COMMIT is reported, never retried.
- Network hangs are bounded (TCP keepalives, ``tcp_user_timeout``, ``connect_timeout``) and row-lock
  waits by ``lock_timeout``: a runner whose database went away must learn it in seconds, well inside its
  lease, so it can stop its prompt before the job could be handed to another machine.
- ``submit``, ``requeue_dead``, ``release``, ``release_owner`` and a ``retry_later`` that is due now send
  ``NOTIFY comfysup_jobs`` (delivered at commit); ``wait_for_work`` listens on a second connection, so an
  idle runner claims a new job within milliseconds instead of at its next poll.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from comfysup.errors import DatabaseLocked, DatabaseUnavailable, QueueError
from comfysup.queue import pg_import, pg_statements, queries, records
from comfysup.queue.base import Delivery, JobRecord, NewJob, PruneBatch
from comfysup.queue.core import SQLQueue
from comfysup.queue.db import ClaimAsk, SQLDb, note_passed_over
from comfysup.queue.pg_import import ImportResult
from comfysup.queue.reads import fetch
from comfysup.queue.specs import SpecCache
from comfysup.workflows import apply_params, model_key

SCHEMA_VERSION = 17
CHANNEL = "comfysup_jobs"
MIGRATION_LOCK = 0x636F6D6679737570  # "comfysup": one advisory lock key for schema changes
CONNECT_TIMEOUT_SECONDS = 5
NETWORK_TIMEOUT_SECONDS = 10.0
"""A statement that gets no answer for this long fails (tcp_user_timeout, keepalives): well inside a lease."""
LISTEN_RETRY_SECONDS = 2.0
"""After the LISTEN connection failed, idle waits just sleep this long before it is tried again."""
SQL = queries.load("postgres")


def _fuse(job_sql: str, attempt_sql: str) -> str:
    """A fenced job UPDATE and its attempt row's UPDATE as one statement (one round trip): the attempt row
    changes only when the fence held, and no row back means the lease is gone and nothing changed."""
    return f"WITH job AS ({job_sql}), attempt_row AS ({attempt_sql} AND EXISTS (SELECT 1 FROM job)) SELECT * FROM job"


FUSED = {(SQL[job], SQL[attempt]): _fuse(SQL[job], SQL[attempt])
         for job in ("complete", "stage", "retry_later", "finish", "release", "record_prompt")
         for attempt in ("end_attempt", "attempt_prompt")}
"""Every pair the lease role may pass to ``fenced``, built once at import."""

T = TypeVar("T")


def _named_sql() -> dict[str, str]:
    """The schema's steps from postgres.sql (``-- name: vN`` headers)."""
    return queries.read("postgres.sql")


def describe_url(url: str) -> str:
    """host:port/dbname of a connection URL, never its password (messages are shown and logged)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "postgresql://(unreadable url)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host, port = parts.get("host") or "localhost", parts.get("port") or 5432
    return f"postgresql://{user}{host}:{port}/{parts.get('dbname') or ''}"


_INHERITED: list[Any] = []
"""Connections that came across a fork: kept referenced so the child never finishes (and so ends) the
parent's sessions."""


class PostgresQueue(SQLQueue):
    """The queue for several machines: its roles over one PostgreSQL database (``PostgresDb``). See
    comfysup.queue.base for the contract, comfysup.queue.core for the code both backends share."""

    def __init__(self, url: str, *, busy_timeout_seconds: float = 30.0, default_callback_url: str = "",
                 assets_dir: str | None = None, network_timeout_seconds: float = NETWORK_TIMEOUT_SECONDS) -> None:
        self.url = url
        db = PostgresDb(url, busy_timeout_seconds=busy_timeout_seconds, default_callback_url=default_callback_url,
                        network_timeout_seconds=network_timeout_seconds)
        super().__init__(db, assets_dir=Path(assets_dir) if assets_dir else None)
        """Input files: in the database (chunked) unless [assets] dir names a folder every machine shares."""

    def import_records(self, records: Sequence[JobRecord], *, with_attempts: bool,
                       source_file: Callable[[str], str | None] = lambda digest: None) -> ImportResult:
        """What ``comfysup migrate`` copies a SQLite queue's jobs with (comfysup.queue.pg_import)."""
        return pg_import.import_records(self.db, self.assets, records, with_attempts=with_attempts,
                                        source_file=source_file)


class PostgresDb(SQLDb):
    """PostgreSQL's dialect: the connections (one for transactions, one to LISTEN) and its own statements."""

    DIALECT = "postgres"
    SCHEMA = "postgres.sql"
    SCHEMA_VERSION = SCHEMA_VERSION
    ID_CHUNK = 5000
    DURABLE_RENEWALS = True
    """A renewal lost with the server would put the lease back one heartbeat: with heartbeat_seconds over half of
    lease_seconds (allowed) it can expire under a live runner, whose job then runs twice at once."""
    ADVISORY_LOCKS = True

    def __init__(self, url: str, *, busy_timeout_seconds: float = 30.0, default_callback_url: str = "",
                 network_timeout_seconds: float = NETWORK_TIMEOUT_SECONDS) -> None:
        self.url = url
        self.network_timeout_seconds = network_timeout_seconds
        """How long a connect or a statement may go unanswered before it fails (NETWORK_TIMEOUT_SECONDS unless a
        runner asks for less: comfysup.runner.station's queue_wait_seconds)."""
        self.default_callback_url = default_callback_url
        self.where = describe_url(url)
        self.busy_timeout_seconds = busy_timeout_seconds
        self._conn: psycopg.Connection[Any] | None = None
        self._listen: psycopg.Connection[Any] | None = None
        self._pid = -1
        self._listen_pid = -1
        self._setup()
        self._listen_lock = threading.Lock()
        self._listen_failed_at: float | None = None
        self._migrate()

    # -- connections -------------------------------------------------------------------------------------

    def _params(self) -> dict[str, Any]:
        """Timeouts that make a lost server an error in seconds; the URL's own settings win."""
        given = conninfo_to_dict(self.url)
        network = self.network_timeout_seconds
        wanted = {"connect_timeout": max(2, math.ceil(min(CONNECT_TIMEOUT_SECONDS, network))),  # libpq: 2 at least
                  "application_name": "comfysup",
                  "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                  "tcp_user_timeout": int(network * 1000)}
        return {k: v for k, v in wanted.items() if k not in given}

    def _open(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self.url, autocommit=autocommit, **self._params())
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"{self.where}: cannot connect: {_first_line(exc)}") from exc
        return conn

    def _connection(self) -> tuple[psycopg.Connection[Any], bool]:
        """This process's connection and whether it was opened just now (a reused one may be stale)."""
        if self._conn is not None and self._pid != os.getpid():
            self._abandon()
        if self._conn is not None and not (self._conn.closed or self._conn.broken):
            return self._conn, False
        self._drop()
        conn = self._open(autocommit=False)
        try:
            conn.execute(f"SET lock_timeout = {int(self.busy_timeout_seconds * 1000)}")
            conn.commit()
        except psycopg.Error as exc:
            with contextlib.suppress(psycopg.Error):
                conn.close()
            raise self._translate(exc) from exc
        self._conn, self._pid = conn, os.getpid()
        return conn, True

    def _abandon(self) -> None:
        """In a forked child: forget the parent's connections without closing them."""
        if self._conn is not None and self._pid != os.getpid():
            _INHERITED.append(self._conn)
            self._conn = None
        if self._listen is not None and self._listen_pid != os.getpid():
            _INHERITED.append(self._listen)
            self._listen = None

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        with self._lock:
            self._abandon()
            self._drop()
        with self._listen_lock:
            self._drop_listener()

    def transaction(self, fn: Callable[..., T], *args: Any, write: bool = True, durable: bool = True,
                     busy_seconds: float | None = None) -> T:
        """Run ``fn(cur, *args)`` in one transaction and commit it (reads too: one snapshot). A stale connection
        is replaced and ``fn`` retried once when the failure came before COMMIT (the server then rolled it
        back). ``durable=False``: the commit does not wait for the WAL's flush (sql/postgres.sql not_durable).
        Rows are dicts by column name. ``busy_seconds`` is SQLite's (a whole-database write
        lock); rows here are locked one by one, and lock_timeout bounds every wait."""
        with self._lock:
            for retry in (False, True):
                conn, fresh = self._connection()
                committing = False
                try:
                    with conn.cursor(row_factory=dict_row) as cur:
                        if not durable:  # as SQLite's durable=False: a renewal, a prompt number, progress
                            cur.execute(SQL["not_durable"])
                        result = fn(cur, *args)
                    committing = True
                    conn.commit()
                    return result
                except psycopg.Error as exc:
                    lost = conn.closed or conn.broken
                    self._rollback(conn)
                    if lost and not fresh and not committing and not retry:
                        continue
                    raise self._translate(exc, committing=committing) from exc
                except BaseException:
                    self._rollback(conn)
                    raise
        raise AssertionError("unreachable")

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        if conn.closed or conn.broken:
            self._drop()
            return
        try:
            conn.rollback()
        except psycopg.Error:
            self._drop()

    def _translate(self, exc: psycopg.Error, committing: bool = False) -> QueueError:
        """A message a person can act on instead of psycopg's exception (and never the password)."""
        text = _first_line(exc)
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return DatabaseLocked(f"{self.where}: a row stayed locked for more than {self.busy_timeout_seconds:g} s "
                                  "(lock_timeout); another session holds it in a long transaction")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            when = " while committing (the change may or may not have been made)" if committing else ""
            return DatabaseUnavailable(f"{self.where}: the database does not answer{when}: {text}",
                                       maybe_stored=committing)
        return QueueError(f"{self.where}: {text}")

    def _migrate(self) -> None:
        """Create or bring the schema forward under an advisory lock, so two machines starting at once do
        not both create it; an up-to-date schema is only read."""
        if self._version() == SCHEMA_VERSION:
            return

        def migrate(cur: psycopg.Cursor[Any]) -> None:
            cur.execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": MIGRATION_LOCK})
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version "
                        "(version integer PRIMARY KEY, applied_at double precision NOT NULL)")
            row = cur.execute("SELECT coalesce(max(version), 0) AS version FROM schema_version").fetchone()
            version = row["version"]
            for step, script in self.schema_steps(version):
                cur.execute(script)
                if step == 3:
                    self._fill_model_keys(cur)
                cur.execute("INSERT INTO schema_version VALUES (%(step)s, extract(epoch from now()))", {"step": step})

        self.transaction(migrate)

    @staticmethod
    def _fill_model_keys(cur: psycopg.Cursor[Any]) -> None:
        """v3's Python step: the model key of every job still to run (SQL cannot read loader nodes)."""
        rows = cur.execute("SELECT j.seq, w.workflow, j.params FROM jobs j JOIN workflows w ON w.id = j.workflow_id "
                           "WHERE j.state IN ('queued', 'running')").fetchall()
        keys = [{"key": model_key(apply_params(json.loads(r["workflow"]), json.loads(r["params"]))), "seq": r["seq"]}
                for r in rows]
        cur.executemany("UPDATE jobs SET model_key = %(key)s WHERE seq = %(seq)s",
                        [k for k in keys if k["key"] is not None])

    def _version(self) -> int | None:
        def read(cur: psycopg.Cursor[Any]) -> int | None:
            if cur.execute("SELECT to_regclass('schema_version') IS NULL AS missing").fetchone()["missing"]:
                return None
            return cur.execute("SELECT max(version) AS version FROM schema_version").fetchone()["version"]

        return self.transaction(read)

    def maintenance(self) -> None:
        """Nothing to do: autovacuum keeps the tables in shape."""

    def checkpoint_in_background(self) -> None:
        """Nothing to do: the database server checkpoints by itself."""

    def replaced(self) -> str | None:
        """A server's database cannot be swapped under an open connection."""
        return None

    def integrity(self, deep: bool = False) -> str | None:
        """The server checks its own files."""
        return None

    # -- LISTEN/NOTIFY ------------------------------------------------------------------------------------

    def notify(self, cur: psycopg.Cursor[Any]) -> None:
        """Wake idle runners when this transaction commits (PostgreSQL folds repeats into one)."""
        cur.execute(f"NOTIFY {CHANNEL}")

    def _listener(self) -> psycopg.Connection[Any] | None:
        """The LISTEN connection of this process, or None while the database does not answer."""
        if self._listen is not None and self._listen_pid != os.getpid():
            with self._lock:
                self._abandon()
        if self._listen is not None and not (self._listen.closed or self._listen.broken):
            return self._listen
        self._drop_listener()
        if self._listen_failed_at is not None and time.monotonic() - self._listen_failed_at < LISTEN_RETRY_SECONDS:
            return None
        try:
            conn = self._open(autocommit=True)
            conn.execute(f"LISTEN {CHANNEL}")
        except (QueueError, psycopg.Error):
            self._listen_failed_at = time.monotonic()
            return None
        self._listen_failed_at = None
        self._listen, self._listen_pid = conn, os.getpid()
        return conn

    def _drop_listener(self) -> None:
        if self._listen is not None:
            with contextlib.suppress(psycopg.Error):
                self._listen.close()
        self._listen = None

    def wait_for_work(self, timeout_seconds: float) -> None:
        """Return at the first NOTIFY or after ``timeout_seconds``; sleep instead while the LISTEN
        connection is down (it is reopened on a later call)."""
        end = time.monotonic() + max(0.0, timeout_seconds)
        with self._listen_lock:
            conn = self._listener()
            if conn is not None:
                try:
                    woke = False
                    for _ in conn.notifies(timeout=max(0.0, timeout_seconds), stop_after=1):
                        woke = True
                    if woke:
                        for _ in conn.notifies(timeout=0):  # fold a burst into this one wake-up
                            pass
                        return
                    if time.monotonic() >= end:
                        return
                except psycopg.Error:
                    self._drop_listener()
                    self._listen_failed_at = time.monotonic()
        remaining = end - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    # -- the dialect ------------------------------------------------------------------------------------------

    @staticmethod
    def time(now: float | None) -> float | None:
        """The caller's ``now``, else None: the SQL's ``{now}`` then reads the database server's clock."""
        return now

    def _scalar(self, sql: str, args: Sequence[Any] | None = None) -> Any:
        return self.transaction(lambda cur: next(iter(cur.execute(sql, args).fetchone().values())))

    def fenced(self, cur: psycopg.Cursor[Any], job_sql: str, job_args: Mapping[str, Any],
               attempt_sql: str | None = None, attempt_args: Mapping[str, Any] | None = None) -> Any:
        """One statement, fused at import (FUSED), for the job row and its attempt row."""
        if attempt_sql is None:
            return cur.execute(job_sql, job_args).fetchone()
        return cur.execute(FUSED[job_sql, attempt_sql], {**job_args, **(attempt_args or {})}).fetchone()

    def insert_batch(self, cur: psycopg.Cursor[Any], batch: list[NewJob], now: float | None,
                     conflicts: list[str], specs: SpecCache) -> tuple[int, int]:
        return pg_statements.insert_batch(cur, batch, now, conflicts, specs)

    def take(self, cur: psycopg.Cursor[Any], ask: ClaimAsk, now: float | None, cached: Mapping[int, Any]
             ) -> dict[str, Any] | None:
        """Expired leases go back to the queue, then the next ready job is taken in one statement (planned as
        claim_plan says)."""
        row = pg_statements.take(cur, ask, now, cached, self.tenants.capped)
        if row is not None and ask.affinity:
            note_passed_over(SQL, cur, row, row["seq"], now)
        return row

    # -- webhook deliveries and prune ------------------------------------------------------------------------

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """SKIP LOCKED, as the job claim: deliverers on several machines take different rows."""
        rows = self.transaction(fetch, SQL["claim_deliveries"], {"now": now, "hold": hold_seconds, "limit": limit})
        return sorted((records.delivery(r) for r in rows), key=lambda d: d.id)  # next_at: the end of the hold

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """As SQLite's: up to ``limit`` old terminal jobs (not one whose webhook is still pending), their
        attempts and deliveries, and the workflows no job uses any more, in one short transaction. SKIP
        LOCKED: a row someone else holds (a cancel, another prune) is left for the next batch. A workflow
        that a concurrent submit references is kept: the foreign key refuses its delete, undone alone."""
        return self.transaction(pg_statements.prune, finished_before, limit)

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["CHANNEL", "SCHEMA_VERSION", "ImportResult", "PostgresDb", "PostgresQueue", "describe_url"]
