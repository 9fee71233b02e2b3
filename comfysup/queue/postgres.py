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
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from comfysup.errors import DatabaseLocked, DatabaseUnavailable, LeaseLost, NotFound, QueueError
from comfysup.queue.base import (
    DEAD,
    QUEUED,
    RUNNING,
    STATES,
    Attempt,
    Claim,
    Delivery,
    EndedAttempt,
    JobRecord,
    Machine,
    NewJob,
    Output,
    PruneBatch,
    RunningJob,
    Status,
    SubmitConflict,
    SubmitResult,
    owner_host,
)
from comfysup.queue.specs import SpecCache, dumps_plain
from comfysup.workflows import apply_params, canonical, content_hash, model_key

SCHEMA_VERSION = 3
SUBMIT_BATCH = 500
CHANNEL = "comfysup_jobs"
MIGRATION_LOCK = 0x636F6D6679737570  # "comfysup": one advisory lock key for schema changes
CONNECT_TIMEOUT_SECONDS = 5
NETWORK_TIMEOUT_SECONDS = 10.0
"""A statement that gets no answer for this long fails (tcp_user_timeout, keepalives): well inside a lease."""
TEMPLATE_CACHE = 32
"""Parsed workflows kept by id in each process (identity ids are never reused)."""
LISTEN_RETRY_SECONDS = 2.0
"""After the LISTEN connection failed, idle waits just sleep this long before it is tried again."""

AT = "coalesce(%(now)s::float8, extract(epoch from now())::float8)"
"""The operation's time: the caller's ``now`` in tests, else the database server's clock."""

T = TypeVar("T")


def _named_sql() -> dict[str, str]:
    """Named statements from postgres.sql (``-- name: NAME`` headers), as procrastinate keeps its SQL."""
    text = resources.files("comfysup.queue").joinpath("postgres.sql").read_text()
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("-- name:"):
            name = line.split(":", 1)[1].strip()
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def describe_url(url: str) -> str:
    """host:port/dbname of a connection URL, never its password (messages are shown and logged)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error:
        return "postgresql://(unreadable url)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host, port = parts.get("host") or "localhost", parts.get("port") or 5432
    return f"postgresql://{user}{host}:{port}/{parts.get('dbname') or ''}"


_LIVE: weakref.WeakSet[PostgresQueue] = weakref.WeakSet()
_FORKING: list[PostgresQueue] = []
_INHERITED: list[Any] = []
"""Connections that came across a fork: kept referenced so the child never finishes (and so ends) the
parent's sessions."""


def _before_fork() -> None:
    """No transaction of this process is half-done in the child: fork waits for each queue's lock."""
    for queue in list(_LIVE):
        queue._lock.acquire()
        _FORKING.append(queue)


def _after_fork_in_parent() -> None:
    while _FORKING:
        _FORKING.pop()._lock.release()


def _after_fork_in_child() -> None:
    while _FORKING:
        queue = _FORKING.pop()
        queue._abandon()
        queue._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


@dataclass
class ImportResult:
    """What ``import_records`` did: rows inserted, already there with the same content, and conflicts."""

    inserted: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    attempts: int = 0


class PostgresQueue:
    """The queue for several machines. See comfysup.queue.base for the contract."""

    def __init__(self, url: str, *, busy_timeout_seconds: float = 30.0, default_callback_url: str = "") -> None:
        self.url = url
        self.default_callback_url = default_callback_url
        self.where = describe_url(url)
        self.busy_timeout_seconds = busy_timeout_seconds
        self._conn: psycopg.Connection[Any] | None = None
        self._listen: psycopg.Connection[Any] | None = None
        self._pid = -1
        self._listen_pid = -1
        self._lock = threading.RLock()
        self._listen_lock = threading.Lock()
        self._listen_failed_at: float | None = None
        self._templates: OrderedDict[int, dict[str, Any]] = OrderedDict()
        _LIVE.add(self)
        self._migrate()

    # -- connections -------------------------------------------------------------------------------------

    def _params(self) -> dict[str, Any]:
        """Timeouts that make a lost server an error in seconds; the URL's own settings win."""
        given = conninfo_to_dict(self.url)
        wanted = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, "application_name": "comfysup",
                  "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                  "tcp_user_timeout": int(NETWORK_TIMEOUT_SECONDS * 1000)}
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

    def _transaction(self, fn: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """Run ``fn`` in one transaction and commit it. A stale connection is replaced and ``fn`` retried
        once when the failure came before COMMIT (the server then rolled it back)."""
        with self._lock:
            for retry in (False, True):
                conn, fresh = self._connection()
                committing = False
                try:
                    with conn.cursor() as cur:
                        result = fn(cur)
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
            return DatabaseUnavailable(f"{self.where}: the database does not answer{when}: {text}")
        return QueueError(f"{self.where}: {text}")

    def _migrate(self) -> None:
        """Create or bring the schema forward under an advisory lock, so two machines starting at once do
        not both create it; an up-to-date schema is only read."""
        if self._version() == SCHEMA_VERSION:
            return

        def migrate(cur: psycopg.Cursor[Any]) -> None:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version "
                        "(version integer PRIMARY KEY, applied_at double precision NOT NULL)")
            version = cur.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise QueueError(f"{self.where}: schema version {version} is newer than this comfysup "
                                 f"({SCHEMA_VERSION}); upgrade comfysup")
            sql = _named_sql()
            for step in range(version + 1, SCHEMA_VERSION + 1):
                cur.execute(sql[f"v{step}"])
                if step == 3:
                    self._fill_model_keys(cur)
                cur.execute("INSERT INTO schema_version VALUES (%s, extract(epoch from now()))", (step,))

        self._transaction(migrate)

    @staticmethod
    def _fill_model_keys(cur: psycopg.Cursor[Any]) -> None:
        """v3's Python step: the model key of every job still to run (SQL cannot read loader nodes)."""
        rows = cur.execute("SELECT j.seq, w.workflow, j.params FROM jobs j JOIN workflows w ON w.id = j.workflow_id "
                           "WHERE j.state IN ('queued', 'running')").fetchall()
        keys = [(model_key(apply_params(json.loads(text), json.loads(params))), seq) for seq, text, params in rows]
        cur.executemany("UPDATE jobs SET model_key = %s WHERE seq = %s", [k for k in keys if k[0] is not None])

    def _version(self) -> int | None:
        def read(cur: psycopg.Cursor[Any]) -> int | None:
            if cur.execute("SELECT to_regclass('schema_version') IS NULL").fetchone()[0]:
                return None
            return cur.execute("SELECT max(version) FROM schema_version").fetchone()[0]

        return self._transaction(read)

    def maintenance(self) -> None:
        """Nothing to do: autovacuum keeps the tables in shape."""

    # -- LISTEN/NOTIFY ------------------------------------------------------------------------------------

    def _notify(self, cur: psycopg.Cursor[Any]) -> None:
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

    # -- submit -------------------------------------------------------------------------------------------

    def submit(self, jobs: Iterable[NewJob], now: float | None = None) -> SubmitResult:
        """Insert a batch in one transaction; memory is bounded by SUBMIT_BATCH, not by the batch size."""

        def insert(cur: psycopg.Cursor[Any]) -> SubmitResult:
            inserted = existing = 0
            conflicts: list[str] = []
            batch: list[NewJob] = []
            specs = SpecCache()
            for job in jobs:
                batch.append(job)
                if len(batch) >= SUBMIT_BATCH:
                    i, e = self._insert_batch(cur, batch, now, conflicts, specs)
                    inserted, existing, batch = inserted + i, existing + e, []
            if batch:
                i, e = self._insert_batch(cur, batch, now, conflicts, specs)
                inserted, existing = inserted + i, existing + e
            if conflicts:
                raise SubmitConflict(conflicts)
            if inserted:
                self._notify(cur)
            return SubmitResult(inserted=inserted, existing=existing)

        return self._transaction(insert)

    @staticmethod
    def _workflow_ids(cur: psycopg.Cursor[Any], texts: dict[str, str], cache: SpecCache) -> None:
        """Each workflow's id by hash, inserted when new. The upsert locks an existing row until this
        transaction ends, so a ``prune`` running now cannot delete a workflow that this submit is about to
        reference (its delete waits, then the foreign key keeps the row)."""
        missing = {h: t for h, t in texts.items() if h not in cache.ids}
        if not missing:
            return
        if len(cache.ids) >= 4096:
            cache.ids.clear()
        rows = cur.execute(
            "INSERT INTO workflows (hash, workflow) SELECT * FROM unnest(%s::text[], %s::text[]) "
            "ON CONFLICT (hash) DO UPDATE SET hash = excluded.hash RETURNING hash, id",
            (list(missing), list(missing.values()))).fetchall()
        cache.ids.update(dict(rows))

    def _insert_batch(self, cur: psycopg.Cursor[Any], batch: list[NewJob], now: float | None,
                      conflicts: list[str], specs: SpecCache) -> tuple[int, int]:
        """Insert what is new (ON CONFLICT DO NOTHING: a concurrent submit of the same id cannot fail),
        then judge every row that was not inserted by its spec_hash."""
        stored = [specs.template(j) for j in batch]
        self._workflow_ids(cur, {h: t for t, h in stored}, specs)
        cur.execute(
            "INSERT INTO jobs (id, priority, submitted_at, spec_hash, workflow_name, workflow_id, extra_data, meta, "
            f"params, callback_url, model_key) SELECT t.id, t.priority, {AT}, t.spec_hash, t.workflow_name, "
            "t.workflow_id, t.extra_data, t.meta, t.params, t.callback_url, t.model_key "
            "FROM unnest(%(ids)s::text[], %(priorities)s::bigint[], "
            "%(hashes)s::text[], %(names)s::text[], %(workflows)s::bigint[], %(extras)s::text[], %(metas)s::text[], "
            "%(params)s::text[], %(callbacks)s::text[], %(keys)s::text[]) WITH ORDINALITY "
            "AS t(id, priority, spec_hash, workflow_name, workflow_id, extra_data, meta, params, callback_url, "
            "model_key, ord) "
            "ORDER BY t.ord ON CONFLICT (id) DO NOTHING RETURNING id",
            {"now": now, "ids": [j.id for j in batch], "priorities": [j.priority for j in batch],
             "hashes": [j.spec_hash for j in batch], "names": [j.workflow_name for j in batch],
             "workflows": [specs.ids[h] for _t, h in stored],
             "extras": [dumps_plain(j.extra_data) for j in batch], "metas": [dumps_plain(j.meta) for j in batch],
             "params": [dumps_plain(j.params) for j in batch],
             "callbacks": [j.callback_url or None for j in batch], "keys": [specs.model_key(j) for j in batch]})
        fresh = {r[0] for r in cur.fetchall()}
        rest = [j for j in batch if j.id not in fresh]
        # An id that appears twice in the batch is inserted once; its other copies are judged like rows
        # already in the table.
        seen: set[str] = set()
        for job in batch:
            if job.id in fresh and job.id not in seen:
                seen.add(job.id)
            elif job.id in fresh:
                rest.append(job)
        known: dict[str, str] = {}
        if rest:
            cur.execute("SELECT id, spec_hash FROM jobs WHERE id = ANY(%s)", (list({j.id for j in rest}),))
            known = dict(cur.fetchall())
        for job in rest:
            if known.get(job.id) != job.spec_hash:
                conflicts.append(job.id)
        return len(fresh), len(rest) - sum(1 for j in rest if known.get(j.id) != j.spec_hash)

    # -- the runner's side ------------------------------------------------------------------------------

    def claim(self, owner: str, server: str, lease_seconds: float, now: float | None = None, *,
              prefer_model: str | None = None, max_wait_seconds: float = 0.0) -> Claim | None:
        """Expired leases go back to the queue, then the next ready job is taken in one statement."""
        return self._claim_from(self._transaction(
            lambda cur: self._claim(cur, owner, server, lease_seconds, now, prefer_model, max_wait_seconds)))

    def complete_and_claim(self, claim: Claim, outputs: Sequence[Output], owner: str, server: str,
                           lease_seconds: float, now: float | None = None, *, trace: dict[str, Any] | None = None,
                           prefer_model: str | None = None, max_wait_seconds: float = 0.0) -> Claim | None:
        """One transaction, so one commit flushed, for a job done and the next one claimed. A lost fence
        raises LeaseLost before anything is claimed (the transaction is rolled back)."""

        def both(cur: psycopg.Cursor[Any]) -> tuple[Any, ...] | None:
            self._complete(cur, claim, outputs, now, trace)
            return self._claim(cur, owner, server, lease_seconds, now, prefer_model, max_wait_seconds)

        return self._claim_from(self._transaction(both))

    _HEAD = (f"SELECT seq, priority FROM jobs WHERE state = 'queued' AND run_after <= {AT} "
             "ORDER BY priority DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED")
    _PICK = (
        f"SELECT coalesce((SELECT j.seq FROM jobs j WHERE j.state = 'queued' AND j.model_key = %(key)s "
        f"  AND j.priority = h.priority AND j.run_after <= {AT} "
        "  AND coalesce((SELECT min(s.at) FROM affinity_skips s WHERE s.priority = h.priority "
        f"      AND s.seq_bound > h.seq), {AT}) > {AT} - %(wait)s "
        "  ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED), h.seq) FROM head h")
    """The first job of the head's priority with the preferred model key, unless the head has been passed over
    for ``wait`` seconds already; else the head. Index seeks only: jobs_ready, affinity_skips, jobs_affinity."""

    def _claim(self, cur: psycopg.Cursor[Any], owner: str, server: str, lease_seconds: float, now: float | None,
               prefer_model: str | None, max_wait_seconds: float) -> tuple[Any, ...] | None:
        self._expire_leases(cur, now)
        affinity = bool(prefer_model) and max_wait_seconds > 0
        pick = self._PICK if affinity else "SELECT seq FROM head"
        row = cur.execute(
            f"WITH head AS ({self._HEAD}), pick AS ({pick}), "
            "claimed AS ("
            "  UPDATE jobs SET state = 'running', attempt = attempt + 1, owner = %(owner)s, server = %(server)s, "
            f"   lease_until = {AT} + %(lease)s, started_at = {AT}, progress = NULL "
            "  WHERE seq = (SELECT * FROM pick) "
            "  RETURNING seq, id, attempt, workflow_id, extra_data, params, last_server, last_prompt_number, reason, "
            "            cancel_requested, lease_until, started_at, model_key), "
            "opened AS (INSERT INTO attempts (job_id, attempt, owner, server, started_at) "
            "  SELECT id, attempt, %(owner)s, %(server)s, started_at FROM claimed) "
            "SELECT c.id, c.attempt, c.workflow_id, c.extra_data, c.params, c.last_server, c.last_prompt_number, "
            "c.reason, c.cancel_requested, c.lease_until, c.model_key, "
            "(SELECT w.workflow FROM workflows w WHERE w.id = c.workflow_id AND NOT w.id = ANY(%(cached)s::bigint[])), "
            "c.seq, h.seq, h.priority FROM claimed c, head h",
            {"owner": owner, "server": server, "lease": lease_seconds, "now": now, "key": prefer_model,
             "wait": max_wait_seconds, "cached": list(self._templates)}).fetchone()
        if row is None:
            return None
        if affinity:
            taken, head, priority = row[12], row[13], row[14]
            if taken != head:
                # ON CONFLICT: two machines passing over the same jobs at once; the claim reads min(at).
                cur.execute(f"INSERT INTO affinity_skips (priority, seq_bound, at) SELECT %(p)s, %(bound)s, {AT} "
                            "WHERE NOT EXISTS (SELECT 1 FROM affinity_skips WHERE priority = %(p)s AND "
                            "seq_bound >= %(bound)s) ON CONFLICT DO NOTHING",
                            {"p": priority, "bound": taken, "now": now})
            else:
                cur.execute("DELETE FROM affinity_skips WHERE priority = %s AND seq_bound <= %s", (priority, head))
        return (owner, server, *row[:12])

    def _claim_from(self, taken: tuple[Any, ...] | None) -> Claim | None:
        """The Claim, with its workflow rebuilt from the cached (or just read) template and its params."""
        if taken is None:
            return None
        (owner, server, job_id, attempt, workflow_id, extra_data, params, last_server, last_prompt_number, reason,
         cancel_requested, lease_until, key, text) = taken
        return Claim(id=job_id, attempt=attempt, owner=owner, server=server,
                     workflow=apply_params(self._template(workflow_id, text), json.loads(params)),
                     extra_data=json.loads(extra_data), lease_until=lease_until, last_server=last_server,
                     last_prompt_number=last_prompt_number, last_reason=reason,
                     cancel_requested=bool(cancel_requested), model_key=key)

    def _template(self, workflow_id: int, text: str | None) -> dict[str, Any]:
        """A parsed workflow by id, from this process's small cache."""
        with self._lock:
            template = self._templates.get(workflow_id)
            if template is None:
                if text is None:  # evicted since the claim was sent
                    text = self._scalar("SELECT workflow FROM workflows WHERE id = %s", (workflow_id,))
                template = json.loads(text)
                self._templates[workflow_id] = template
                if len(self._templates) > TEMPLATE_CACHE:
                    self._templates.popitem(last=False)
            else:
                self._templates.move_to_end(workflow_id)
            return template

    def _expire_leases(self, cur: psycopg.Cursor[Any], now: float | None) -> None:
        """Running jobs whose lease passed are queued again; their attempt stays counted. SKIP LOCKED: a row
        another transaction is renewing or expiring right now is left to it."""
        cur.execute(
            "WITH expired AS ("
            "  UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, "
            "    reason = 'lease expired: the runner stopped renewing it' "
            "  WHERE seq IN (SELECT seq FROM jobs WHERE state = 'running' "
            f"                 AND lease_until < {AT} FOR UPDATE SKIP LOCKED) "
            "  RETURNING id, attempt) "
            f"UPDATE attempts a SET ended_at = {AT}, outcome = 'lease_expired', kind = 'lease_expired', "
            "reason = 'lease expired' "
            "FROM expired e WHERE a.job_id = e.id AND a.attempt = e.attempt AND a.ended_at IS NULL",
            {"now": now})

    @staticmethod
    def _fence(claim: Claim) -> dict[str, Any]:
        return {"id": claim.id, "attempt": claim.attempt, "owner": claim.owner}

    _FENCE = " WHERE id = %(id)s AND attempt = %(attempt)s AND owner = %(owner)s AND state = 'running'"
    _ATTEMPT_ROW = ("WHERE job_id = %(id)s AND attempt = %(attempt)s AND owner = %(owner)s AND ended_at IS NULL "
                    "AND EXISTS (SELECT 1 FROM job)")
    _END = (f"ended_at = {AT}, outcome = %(outcome)s, reason = %(end_reason)s, kind = %(kind)s, "
            "trace = %(trace)s")
    """Set on the attempt row by every write that ends an attempt."""

    def _deliver(self, cur: psycopg.Cursor[Any], job_id: str, now: float | None) -> None:
        """A terminal job's webhook, in the transaction that made it terminal: due at once."""
        cur.execute(f"INSERT INTO deliveries (job_id, url, created_at, next_at) "
                    f"SELECT id, coalesce(nullif(callback_url, ''), %(url)s), {AT}, {AT} FROM jobs "
                    "WHERE id = %(id)s AND coalesce(nullif(callback_url, ''), %(url)s) != ''",
                    {"url": self.default_callback_url, "now": now, "id": job_id})

    def set_progress(self, claim: Claim, progress: dict[str, Any] | None) -> None:
        self._transaction(lambda cur: self._fenced(cur, claim, "UPDATE jobs SET progress = %(progress)s",
                                                   {"progress": _dumps(progress)}))

    def _fenced(self, cur: psycopg.Cursor[Any], claim: Claim, sql: str, args: dict[str, Any], *,
                attempt_set: str = "", returning: str = "1") -> tuple[Any, ...]:
        """The job row's UPDATE guarded by id + attempt + owner and, in the same statement, the attempt
        row's (``attempt_set``), made only when the fence held. No row back: the lease is gone and nothing
        changed. One statement instead of two saves a round trip on every claim's last write."""
        query = f"{sql}{self._FENCE} RETURNING {returning}"
        if attempt_set:
            query = (f"WITH job AS ({query}), attempt_row AS (UPDATE attempts SET {attempt_set} "
                     f"{self._ATTEMPT_ROW}) SELECT * FROM job")
        row = cur.execute(query, {**args, **self._fence(claim)}).fetchone()
        if row is None:
            raise LeaseLost(f"job {claim.id}: attempt {claim.attempt} of {claim.owner} no longer holds the job")
        return row

    def heartbeat(self, claim: Claim, lease_seconds: float, now: float | None = None) -> bool:
        def renew(cur: psycopg.Cursor[Any]) -> bool:
            row = self._fenced(cur, claim, f"UPDATE jobs SET lease_until = {AT} + %(lease)s",
                               {"now": now, "lease": lease_seconds}, returning="cancel_requested")
            return bool(row[0])

        return self._transaction(renew)

    def record_prompt(self, claim: Claim, server: str, prompt_number: int) -> None:
        self._transaction(lambda cur: self._fenced(
            cur, claim, "UPDATE jobs SET last_server = %(server)s, last_prompt_number = %(number)s",
            {"server": server, "number": prompt_number},
            attempt_set="prompt_number = %(number)s, server = %(server)s"))

    def complete(self, claim: Claim, outputs: Sequence[Output], now: float | None = None, *,
                 trace: dict[str, Any] | None = None) -> None:
        self._transaction(lambda cur: self._complete(cur, claim, outputs, now, trace))

    def _complete(self, cur: psycopg.Cursor[Any], claim: Claim, outputs: Sequence[Output], now: float | None,
                  trace: dict[str, Any] | None) -> None:
        files = json.dumps([o.__dict__ for o in outputs], separators=(",", ":"))
        self._fenced(cur, claim, f"UPDATE jobs SET state = 'done', outputs = %(files)s, finished_at = {AT}, "
                     "reason = NULL, owner = NULL, lease_until = NULL, machine = %(machine)s",
                     {"files": files, "now": now, "machine": owner_host(claim.owner), "outcome": "done",
                      "end_reason": None, "kind": None, "trace": _dumps(trace)}, attempt_set=self._END)
        self._deliver(cur, claim.id, now)

    def retry_later(self, claim: Claim, run_after: float, reason: str, now: float | None = None, *,
                    kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        """``run_after`` is read on the caller's clock: without ``now`` the delay it leaves from this
        machine's time is added to the database's time, so a skewed machine neither hurries nor holds
        back its retries."""
        given, delay = (run_after, 0.0) if now is not None else (None, run_after - time.time())

        def later(cur: psycopg.Cursor[Any]) -> None:
            # The attempt judged its prompt: the next one must not adopt that run's failure again, so the
            # number is forgotten (a live prompt is still followed, and a success still adopted, by id).
            (due,) = self._fenced(
                cur, claim, "UPDATE jobs SET state = 'queued', "
                "run_after = coalesce(%(given)s::float8, extract(epoch from now())::float8 + %(delay)s), "
                "reason = %(end_reason)s, owner = NULL, lease_until = NULL, last_prompt_number = NULL",
                {"given": given, "delay": delay, "now": now, "outcome": "retry", "end_reason": reason, "kind": kind,
                 "trace": _dumps(trace)},
                attempt_set=self._END, returning=f"run_after <= {AT}")
            if due:
                self._notify(cur)

        self._transaction(later)

    def dead(self, claim: Claim, reason: str, now: float | None = None, *, kind: str | None = None,
             trace: dict[str, Any] | None = None) -> None:
        self._finish(claim, DEAD, reason, now, kind, trace)

    def cancelled(self, claim: Claim, reason: str, now: float | None = None, *,
                  trace: dict[str, Any] | None = None) -> None:
        self._finish(claim, "cancelled", reason, now, "cancelled", trace)

    def _finish(self, claim: Claim, state: str, reason: str, now: float | None, kind: str | None,
                trace: dict[str, Any] | None) -> None:
        def end(cur: psycopg.Cursor[Any]) -> None:
            self._fenced(cur, claim, f"UPDATE jobs SET state = %(outcome)s, reason = %(end_reason)s, "
                         f"finished_at = {AT}, owner = NULL, lease_until = NULL",
                         {"now": now, "outcome": state, "end_reason": reason, "kind": kind, "trace": _dumps(trace)},
                         attempt_set=self._END)
            self._deliver(cur, claim.id, now)

        self._transaction(end)

    def release(self, claim: Claim, reason: str, count_attempt: bool = True, now: float | None = None, *,
                kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        def put_back(cur: psycopg.Cursor[Any]) -> None:
            # A runner releases only a prompt it interrupted itself: forget the number, as for a retry.
            self._fenced(cur, claim, "UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, "
                         "reason = %(end_reason)s, attempt = attempt - %(uncount)s, last_prompt_number = NULL",
                         {"uncount": 0 if count_attempt else 1, "now": now, "end_reason": reason,
                          "outcome": "released" if count_attempt else "released_uncounted", "kind": kind,
                          "trace": _dumps(trace)},
                         attempt_set=self._END)
            self._notify(cur)

        self._transaction(put_back)

    def release_owner(self, owner: str, reason: str, count_attempt: bool = True,
                      now: float | None = None) -> list[str]:
        outcome = "released" if count_attempt else "released_uncounted"
        kind = "runner_died" if count_attempt else "shutdown"

        def put_back(cur: psycopg.Cursor[Any]) -> list[str]:
            rows = cur.execute(
                "WITH freed AS (UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, "
                "  reason = %(reason)s, attempt = attempt - %(uncount)s "
                "  WHERE state = 'running' AND owner = %(owner)s RETURNING id, attempt + %(uncount)s AS attempt), "
                f"ended AS (UPDATE attempts a SET ended_at = {AT}, outcome = %(outcome)s, reason = %(reason)s, "
                "  kind = %(kind)s "
                "  FROM freed f WHERE a.job_id = f.id AND a.attempt = f.attempt AND a.owner = %(owner)s "
                "  AND a.ended_at IS NULL) "
                "SELECT id FROM freed",
                {"reason": reason, "uncount": 0 if count_attempt else 1, "owner": owner, "outcome": outcome,
                 "kind": kind, "now": now}).fetchall()
            if rows:
                self._notify(cur)
            return [r[0] for r in rows]

        return self._transaction(put_back)

    def active_count(self) -> int:
        return self._scalar("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')")

    def running_owners(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT DISTINCT owner FROM jobs WHERE state = 'running'")]

    def _rows(self, sql: str, args: dict[str, Any] | Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return self._transaction(lambda cur: cur.execute(sql, args).fetchall())

    def _scalar(self, sql: str, args: dict[str, Any] | Sequence[Any] | None = None) -> Any:
        return self._rows(sql, args)[0][0]

    # -- the people's side ------------------------------------------------------------------------------

    def cancel(self, ids: Sequence[str], now: float | None = None) -> dict[str, str]:
        def cancel(cur: psycopg.Cursor[Any]) -> dict[str, str]:
            out: dict[str, str] = {}
            for job_id in ids:
                row = cur.execute("SELECT state FROM jobs WHERE id = %s FOR UPDATE", (job_id,)).fetchone()
                if row is None:
                    out[job_id] = "unknown"
                elif row[0] == QUEUED:
                    cur.execute(f"UPDATE jobs SET state = 'cancelled', finished_at = {AT}, "
                                "reason = 'cancelled by user' WHERE id = %(id)s", {"now": now, "id": job_id})
                    self._deliver(cur, job_id, now)
                    out[job_id] = "cancelled"
                elif row[0] == RUNNING:
                    cur.execute("UPDATE jobs SET cancel_requested = true WHERE id = %s", (job_id,))
                    out[job_id] = "cancelling"
                else:
                    out[job_id] = f"already {row[0]}"
            return out

        return self._transaction(cancel)

    _REQUEUE = ("UPDATE jobs SET state = 'queued', attempt = 0, run_after = 0, reason = NULL, finished_at = NULL, "
                "cancel_requested = false, last_server = NULL, last_prompt_number = NULL")
    """A retried dead job runs afresh: no earlier prompt is looked for, so its old failure is not adopted."""

    def requeue_dead(self, ids: Sequence[str] | None, now: float | None = None) -> dict[str, str]:
        def requeue(cur: psycopg.Cursor[Any]) -> dict[str, str]:
            out: dict[str, str] = {}
            if ids is None:
                rows = cur.execute(f"{self._REQUEUE} WHERE state = 'dead' RETURNING id").fetchall()
                out = {r[0]: "requeued" for r in rows}
            else:
                for job_id in ids:
                    row = cur.execute("SELECT state FROM jobs WHERE id = %s FOR UPDATE", (job_id,)).fetchone()
                    if row is None:
                        out[job_id] = "unknown"
                    elif row[0] != DEAD:
                        out[job_id] = f"not dead ({row[0]})"
                    else:
                        cur.execute(f"{self._REQUEUE} WHERE id = %s", (job_id,))
                        out[job_id] = "requeued"
            if "requeued" in out.values():
                self._notify(cur)
            return out

        return self._transaction(requeue)

    _COLUMNS = ("jobs.id, state, priority, attempt, w.workflow, extra_data, meta, params, workflow_name, "
                "submitted_at, run_after, owner, server, lease_until, started_at, finished_at, reason, outputs, "
                "cancel_requested, machine, spec_hash, last_server, last_prompt_number, progress, callback_url, "
                "model_key")
    _FROM = "jobs JOIN workflows w ON w.id = jobs.workflow_id"

    @staticmethod
    def _record(row: Sequence[Any], attempts: list[Attempt]) -> JobRecord:
        outputs = [Output(**o) for o in json.loads(row[17])] if row[17] else []
        params = json.loads(row[7])
        template = json.loads(row[4])
        return JobRecord(
            id=row[0], state=row[1], priority=row[2], attempt=row[3], workflow=apply_params(template, params),
            extra_data=json.loads(row[5]), meta=json.loads(row[6]), params=params,
            workflow_name=row[8], submitted_at=row[9], run_after=row[10], owner=row[11], server=row[12],
            lease_until=row[13], started_at=row[14], finished_at=row[15], reason=row[16], outputs=outputs,
            cancel_requested=bool(row[18]), attempts=attempts, machine=row[19], spec_hash=row[20],
            last_server=row[21], last_prompt_number=row[22], progress=_loads(row[23]), callback_url=row[24],
            model_key=row[25], template=template)

    @staticmethod
    def _attempts(cur: psycopg.Cursor[Any], ids: Sequence[str]) -> dict[str, list[Attempt]]:
        out: dict[str, list[Attempt]] = {i: [] for i in ids}
        if ids:
            for r in cur.execute(
                    "SELECT job_id, attempt, owner, server, started_at, ended_at, outcome, reason, prompt_number, "
                    "kind, trace FROM attempts WHERE job_id = ANY(%s) ORDER BY n", (list(ids),)).fetchall():
                out[r[0]].append(Attempt(*r[1:9], kind=r[9], trace=_loads(r[10])))
        return out

    def get(self, job_id: str) -> JobRecord:
        rows = self.get_many([job_id])
        if not rows:
            raise NotFound(f"no job with id {job_id} in {self.where}")
        return rows[0]

    def get_many(self, ids: Sequence[str]) -> list[JobRecord]:
        ids = list(ids)

        def read(cur: psycopg.Cursor[Any]) -> list[JobRecord]:
            rows = cur.execute(f"SELECT {self._COLUMNS} FROM {self._FROM} WHERE jobs.id = ANY(%s)", (ids,)).fetchall()
            attempts = self._attempts(cur, [r[0] for r in rows])
            return [self._record(r, attempts[r[0]]) for r in rows]

        if not ids:
            return []
        order = {job_id: i for i, job_id in enumerate(ids)}
        return sorted(self._transaction(read), key=lambda j: order[j.id])

    def iter_jobs(self, states: Sequence[str] | None = None) -> Iterator[JobRecord]:
        """Every job in submission order, read in pages so memory stays flat on a large table."""
        last = 0
        where = " AND state = ANY(%(states)s)" if states else ""

        def page(cur: psycopg.Cursor[Any]) -> list[tuple[int, JobRecord]]:
            rows = cur.execute(f"SELECT seq, {self._COLUMNS} FROM {self._FROM} WHERE seq > %(last)s{where} "
                               "ORDER BY seq LIMIT 500", {"last": last, "states": list(states or ())}).fetchall()
            attempts = self._attempts(cur, [r[1] for r in rows])
            return [(r[0], self._record(r[1:], attempts[r[1]])) for r in rows]

        while True:
            records = self._transaction(page)
            if not records:
                return
            for _, record in records:
                yield record
            last = records[-1][0]

    def status(self, now: float | None = None, dead_limit: int = 5, done_limit: int = 0) -> Status:
        def read(cur: psycopg.Cursor[Any]) -> Status:
            counts = dict.fromkeys(STATES, 0)
            counts.update(dict(cur.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()))
            waiting = cur.execute(f"SELECT count(*) FROM jobs WHERE state = 'queued' AND run_after > {AT}",
                                  {"now": now}).fetchone()[0]
            counts["waiting"] = waiting
            counts[QUEUED] -= waiting
            oldest = cur.execute("SELECT submitted_at FROM jobs WHERE state = 'queued' ORDER BY seq LIMIT 1").fetchone()
            running = [RunningJob(*r[:6], progress=_loads(r[6])) for r in cur.execute(
                "SELECT id, owner, server, attempt, started_at, lease_until, progress FROM jobs "
                "WHERE state = 'running' ORDER BY started_at").fetchall()]
            dead = [tuple(r) for r in cur.execute(
                "SELECT id, finished_at, reason FROM jobs WHERE state = 'dead' ORDER BY finished_at DESC LIMIT %s",
                (dead_limit,)).fetchall()]
            done = [tuple(r) for r in cur.execute(
                "SELECT id, finished_at FROM jobs WHERE state = 'done' ORDER BY finished_at DESC LIMIT %s",
                (done_limit,)).fetchall()] if done_limit else []
            return Status(counts=counts, oldest_queued_at=oldest[0] if oldest else None, running=running,
                          recent_dead=dead, recent_done=done)  # type: ignore[arg-type]

        return self._transaction(read)

    def states(self, ids: Sequence[str]) -> dict[str, str]:
        ids = list(ids)
        out: dict[str, str] = {}
        for start in range(0, len(ids), 5000):
            out.update(dict(self._rows("SELECT id, state FROM jobs WHERE id = ANY(%s)", (ids[start:start + 5000],))))
        return out

    def finished_counts(self, since: float, now: float | None = None) -> dict[str, int]:
        return dict(self._rows("SELECT state, count(*) FROM jobs WHERE state IN ('done', 'dead', 'cancelled') "
                               "AND finished_at >= %s GROUP BY state", (since,)))

    def ended_since(self, since: float, limit: int = 10000) -> list[EndedAttempt]:
        """The trace stays in the database: its node lists are counted there (0 when one is missing or not
        a list, as SQLite's json_array_length), so metrics never hold the several KB of JSON of each attempt."""
        rows = self._rows(
            "SELECT a.job_id, a.attempt, a.outcome, a.kind, a.started_at, a.ended_at, "
            "CASE json_typeof(t.doc -> 'nodes') WHEN 'array' THEN json_array_length(t.doc -> 'nodes') ELSE 0 END, "
            "CASE json_typeof(t.doc -> 'cached') WHEN 'array' THEN json_array_length(t.doc -> 'cached') ELSE 0 END, "
            "j.workflow_name, j.submitted_at, (SELECT min(f.started_at) FROM attempts f WHERE f.job_id = a.job_id) "
            "FROM attempts a JOIN jobs j ON j.id = a.job_id CROSS JOIN LATERAL (SELECT a.trace::json AS doc) t "
            "WHERE a.ended_at >= %s ORDER BY a.ended_at LIMIT %s",
            (since, limit))
        return [EndedAttempt(job_id=r[0], attempt=r[1], outcome=r[2], kind=r[3], started_at=r[4], ended_at=r[5],
                             nodes_run=r[6], nodes_cached=r[7], workflow_name=r[8], submitted_at=r[9],
                             first_started_at=r[10])
                for r in rows]

    def ended_count(self, since: float, until: float) -> int:
        return self._scalar("SELECT count(*) FROM attempts WHERE ended_at >= %s AND ended_at <= %s", (since, until))

    def ended_keys(self, since: float, until: float) -> list[tuple[str, int, float, float]]:
        return self._rows("SELECT job_id, attempt, started_at, ended_at FROM attempts "  # type: ignore[return-value]
                          "WHERE ended_at >= %s AND ended_at <= %s ORDER BY ended_at", (since, until))

    # -- webhook deliveries --------------------------------------------------------------------------------

    _DELIVERY = "id, job_id, url, attempts, created_at, next_at, last_status, last_error, delivered_at"

    def deliveries(self, job_id: str) -> list[Delivery]:
        return [Delivery(*r) for r in self._rows(f"SELECT {self._DELIVERY} FROM deliveries WHERE job_id = %s "
                                                 "ORDER BY id", (job_id,))]

    def pending_deliveries(self) -> int:
        return self._scalar("SELECT count(*) FROM deliveries WHERE next_at IS NOT NULL")

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """SKIP LOCKED, as the job claim: deliverers on several machines take different rows."""
        rows = self._rows(
            f"UPDATE deliveries SET next_at = {AT} + %(hold)s WHERE id IN (SELECT id FROM deliveries "
            f"WHERE next_at IS NOT NULL AND next_at <= {AT} ORDER BY next_at LIMIT %(limit)s "
            f"FOR UPDATE SKIP LOCKED) RETURNING {self._DELIVERY}",
            {"now": now, "hold": hold_seconds, "limit": limit})
        return sorted((Delivery(*r) for r in rows), key=lambda d: d.id)  # next_at: the end of the hold

    def delivery_result(self, delivery_id: int, *, delivered: bool, status: int | None, error: str | None,
                        next_at: float | None, now: float | None = None) -> None:
        self._rows(f"UPDATE deliveries SET attempts = attempts + 1, last_status = %(status)s, last_error = %(error)s, "
                   f"delivered_at = CASE WHEN %(delivered)s THEN {AT} END, next_at = %(next_at)s "
                   "WHERE id = %(id)s RETURNING id",
                   {"status": status, "error": error, "delivered": delivered, "now": now,
                    "next_at": None if delivered else next_at, "id": delivery_id})

    # -- prune ------------------------------------------------------------------------------------------

    def prunable(self, finished_before: float) -> int:
        return self._scalar("SELECT count(*) FROM jobs WHERE state IN ('done', 'dead', 'cancelled') "
                            "AND finished_at < %s", (finished_before,))

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """As SQLite's: up to ``limit`` old terminal jobs (not one whose webhook is still pending), their
        attempts and deliveries, and the workflows no job uses any more, in one short transaction. SKIP
        LOCKED: a row someone else holds (a cancel, another prune) is left for the next batch. A workflow
        that a concurrent submit references is kept: the foreign key refuses its delete, undone alone."""

        def batch(cur: psycopg.Cursor[Any]) -> PruneBatch:
            rows = cur.execute(
                "WITH gone AS (DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs j "
                "  WHERE state IN ('done', 'dead', 'cancelled') AND finished_at < %(before)s AND NOT EXISTS "
                "  (SELECT 1 FROM deliveries d WHERE d.job_id = j.id AND d.next_at IS NOT NULL) "
                "  LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING id, machine, workflow_id), "
                "a AS (DELETE FROM attempts WHERE job_id IN (SELECT id FROM gone)), "
                "d AS (DELETE FROM deliveries WHERE job_id IN (SELECT id FROM gone)) "
                "SELECT id, machine, workflow_id FROM gone",
                {"before": finished_before, "limit": limit}).fetchall()
            removed = 0
            for workflow_id in sorted({r[2] for r in rows}):
                cur.execute("SAVEPOINT prune_workflow")
                try:
                    removed += cur.execute("DELETE FROM workflows w WHERE id = %s AND NOT EXISTS "
                                           "(SELECT 1 FROM jobs WHERE workflow_id = w.id)", (workflow_id,)).rowcount
                    cur.execute("RELEASE SAVEPOINT prune_workflow")
                except psycopg.errors.ForeignKeyViolation:
                    cur.execute("ROLLBACK TO SAVEPOINT prune_workflow")
            return PruneBatch(removed=[(r[0], r[1]) for r in rows], workflows_removed=removed)

        return self._transaction(batch)

    # -- machines -----------------------------------------------------------------------------------------

    def register_machine(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                         now: float | None = None) -> None:
        def register(cur: psycopg.Cursor[Any]) -> None:
            cur.execute("DELETE FROM machines WHERE host = %s", (host,))
            cur.execute(f"INSERT INTO machines (host, pid, slots, started_at, heartbeat_at) "
                        f"VALUES (%(host)s, %(pid)s, %(slots)s, {AT}, {AT})",
                        {"host": host, "pid": pid, "slots": json.dumps(list(slots)), "now": now})

        self._transaction(register)

    def machine_heartbeat(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                          now: float | None = None) -> None:
        self._transaction(lambda cur: cur.execute(
            f"INSERT INTO machines (host, pid, slots, started_at, heartbeat_at) "
            f"VALUES (%(host)s, %(pid)s, %(slots)s, {AT}, {AT}) ON CONFLICT (host, pid) DO UPDATE "
            "SET slots = excluded.slots, heartbeat_at = excluded.heartbeat_at",
            {"host": host, "pid": pid, "slots": json.dumps(list(slots)), "now": now}))

    def machines(self, now: float | None = None) -> list[Machine]:
        rows = self._rows(f"SELECT host, pid, slots, started_at, heartbeat_at, {AT} - heartbeat_at FROM machines "
                          "ORDER BY host, pid", {"now": now})
        return [Machine(host=r[0], pid=r[1], slots=json.loads(r[2]), started_at=r[3], heartbeat_at=r[4],
                        age_seconds=max(0.0, r[5])) for r in rows]

    # -- migration from another queue ------------------------------------------------------------------

    def import_records(self, records: Sequence[JobRecord], *, with_attempts: bool) -> ImportResult:
        """Copy jobs as they are (state, attempts, times) in one transaction: an id already here with the
        same spec_hash is left alone, with another one it is a conflict; attempt rows come only with the
        jobs inserted now, so running this twice copies nothing twice."""
        result = ImportResult()

        def copy(cur: psycopg.Cursor[Any]) -> None:
            if not records:
                return
            known = dict(cur.execute("SELECT id, spec_hash FROM jobs WHERE id = ANY(%s)",
                                     ([r.id for r in records],)).fetchall())
            fresh: list[JobRecord] = []
            for r in records:
                if r.id in known:
                    (result.existing if known[r.id] == r.spec_hash else result.conflicts).append(r.id)
                    continue
                known[r.id] = r.spec_hash
                fresh.append(r)
            # A batch's jobs share one stored template: it is copied once, not once per job.
            memo: dict[str, str] = {}
            stored = [_stored_template(r, memo) for r in fresh]
            specs = SpecCache()
            self._workflow_ids(cur, {h: t for t, h in stored}, specs)
            cur.executemany(
                "INSERT INTO jobs (id, state, priority, run_after, attempt, owner, server, lease_until, "
                "started_at, cancel_requested, submitted_at, finished_at, reason, outputs, machine, last_server, "
                "last_prompt_number, spec_hash, workflow_name, workflow_id, extra_data, meta, params, progress, "
                "callback_url, model_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(r.id, r.state, r.priority, r.run_after, r.attempt, r.owner, r.server, r.lease_until,
                  r.started_at, r.cancel_requested, r.submitted_at, r.finished_at, r.reason,
                  json.dumps([o.__dict__ for o in r.outputs]) if r.outputs else None, r.machine,
                  r.last_server, r.last_prompt_number, r.spec_hash, r.workflow_name, specs.ids[h],
                  dumps_plain(r.extra_data), dumps_plain(r.meta), dumps_plain(r.params), _dumps(r.progress),
                  r.callback_url, r.model_key if r.model_key is not None else model_key(r.workflow))
                 for r, (_t, h) in zip(fresh, stored, strict=True)])
            rows = [(r.id, a.attempt, a.owner, a.server, a.started_at, a.ended_at, a.outcome, a.reason,
                     a.prompt_number, a.kind, _dumps(a.trace)) for r in fresh if with_attempts for a in r.attempts]
            if rows:
                cur.executemany("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, "
                                "outcome, reason, prompt_number, kind, trace) "
                                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)
            result.inserted = [r.id for r in fresh]
            result.attempts = len(rows)
            if any(r.state == QUEUED for r in fresh):
                self._notify(cur)

        self._transaction(copy)
        return result


def _dumps(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _stored_template(record: JobRecord, memo: dict[str, str]) -> tuple[str, str]:
    """The text and hash to store for a migrated job: its template (shared by its batch), else its workflow.
    ``memo`` remembers recent texts, so a batch's 10 KB template is hashed once rather than once per job."""
    text = canonical(record.template if record.template is not None else record.workflow)
    digest = memo.get(text)
    if digest is None:
        if len(memo) >= 64:
            memo.clear()
        digest = memo[text] = content_hash(text)
    return text, digest


def _loads(text: str | None) -> Any:
    return None if not text else json.loads(text)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["CHANNEL", "SCHEMA_VERSION", "ImportResult", "PostgresQueue", "describe_url"]
