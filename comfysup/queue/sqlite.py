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
  moment it is free, was measured (issue 7) and dropped: SQLite empties a connection's page cache once
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
import json
import os
import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import psutil

from comfysup.errors import DatabaseLocked, DatabaseMissing, LeaseLost, NotFound, QueueError
from comfysup.queue.base import (
    CANCELLED,
    DEAD,
    DONE,
    QUEUED,
    RUNNING,
    STATES,
    TERMINAL,
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
from comfysup.workflows import apply_params, content_hash, model_key

SCHEMA_VERSION = 7
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre",
    "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "davfs", "fuse.glusterfs", "beegfs", "gpfs",
})
SUBMIT_BATCH = 500
IDLE_WAIT_CAP_SECONDS = 0.25
SUBMIT_CACHE_KIB = -16384
"""PRAGMA cache_size during a submit: 16 MiB (negative: KiB), the id index of about 200,000 jobs."""
TEMPLATE_CACHE = 32
"""Parsed workflows kept by id in each process: a runner parses a batch's 10 KB workflow once, not per claim."""


def _named_sql() -> dict[str, str]:
    """Named statements from schema.sql (``-- name: NAME`` headers), as procrastinate keeps its SQL."""
    text = resources.files("comfysup.queue").joinpath("schema.sql").read_text()
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("-- name:"):
            name = line.split(":", 1)[1].strip()
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def _statements(script: str) -> Iterator[str]:
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
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") or "/"
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, part.fstype
    return kind


def _now(now: float | None) -> float:
    return time.time() if now is None else now


_LIVE: weakref.WeakSet[SQLiteQueue] = weakref.WeakSet()
_FORKING: list[SQLiteQueue] = []
_INHERITED: list[sqlite3.Connection] = []
"""Connections that came across a fork: kept referenced so the child never closes (frees) them."""


def _before_fork() -> None:
    """Each queue ends up with no open connection in the parent, so the child inherits no SQLite state."""
    for queue in list(_LIVE):
        queue._lock.acquire()
        _FORKING.append(queue)
        queue._drop_for_fork()


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


class SQLiteQueue:
    """The default queue backend. See comfysup.queue.base for the contract."""

    def __init__(self, path: str | Path, *, create: bool = True, busy_timeout_seconds: float = 30.0,
                 checkpoint_seconds: float = 30.0, default_callback_url: str = "") -> None:
        self.path = Path(path)
        self.default_callback_url = default_callback_url
        self.busy_timeout_seconds = busy_timeout_seconds
        self.checkpoint_seconds = checkpoint_seconds
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._lock = threading.RLock()
        self._templates: OrderedDict[int, dict[str, Any]] = OrderedDict()
        _LIVE.add(self)
        self._last_checkpoint = time.monotonic()
        if not self.path.exists() and not create:
            raise DatabaseMissing(f"{self.path}: no queue database here. Submit jobs first "
                                  "(comfysup submit jobs.jsonl), or point [queue] path at the right file.")
        self._refuse_network_filesystem()
        if not self.path.exists():
            self._create_file()
        self._migrate()

    def _refuse_network_filesystem(self) -> None:
        """Checked on the nearest existing folder, before anything is created on a share."""
        existing = self.path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        kind = filesystem_type(existing)
        if kind.lower() in NETWORK_FILESYSTEMS:
            raise QueueError(f"{self.path}: on a network filesystem ({kind}). SQLite's locks are not reliable "
                             "there and the queue could hand one job to two runners; put [queue] path on a "
                             "local disk, or use PostgreSQL ([queue] url) to share a queue between machines.")

    # -- connection -----------------------------------------------------------------------------------

    def _create_file(self) -> None:
        directory = self.path.parent
        try:
            if not directory.exists():
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # another process created it first; its file is as good as ours
        except OSError as exc:
            raise QueueError(f"{self.path}: cannot create the queue database: {exc.strerror}") from exc
        os.close(fd)

    @property
    def conn(self) -> sqlite3.Connection:
        """This process's connection; a connection inherited across fork is dropped, never used."""
        if self._conn is None or self._pid != os.getpid():
            self._abandon()
            try:
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

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_seconds, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_seconds * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise QueueError(f"{self.path}: could not switch the database to WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            conn.execute("PRAGMA foreign_keys = ON")
            # For the v5 migration (and only there): SQL cannot hash or read loader nodes by itself.
            conn.create_function("comfysup_sha256", 1, content_hash, deterministic=True)
            conn.create_function("comfysup_model_key", 1, _model_key_of_text, deterministic=True)
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _write(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction taken with BEGIN IMMEDIATE, committed or rolled back as a whole.

        ``durable=False`` commits without an fsync (``synchronous=NORMAL`` for this transaction): still
        safe from a crash of any process, lost only with the machine's power, and made durable by the
        next durable commit, which syncs every frame before it. Only writes that describe a prompt
        running on this very machine use it (heartbeat, record_prompt, set_progress): a power loss ends
        that prompt too, so what they said is moot after one. Claims, submits and ends stay durable.
        """
        with self._lock:
            conn = self.conn
            try:
                if not durable:
                    conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._restore_sync(conn, durable)
                raise self._translate(exc) from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                # SQLite may have rolled back by itself (disk full, I/O error): never let a failing
                # ROLLBACK hide the error that caused it.
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc) from exc
                raise
            finally:
                self._restore_sync(conn, durable)

    @staticmethod
    def _restore_sync(conn: sqlite3.Connection, durable: bool) -> None:
        if not durable:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA synchronous = FULL")

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row | tuple]:
        with self._lock:
            try:
                return self.conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    def _translate(self, exc: sqlite3.Error) -> Exception:
        """A message a person can act on instead of sqlite3's exception (and its traceback)."""
        text = str(exc)
        if "locked" in text or "busy" in text:
            return DatabaseLocked(f"{self.path}: {text} for more than {self.busy_timeout_seconds:g} s; another "
                                  "process holds a write lock (a long transaction or a stuck process)")
        return QueueError(f"{self.path}: {text}")

    def _migrate(self) -> None:
        """Bring the schema forward. An up-to-date file is only read, so opening it to run ``status`` or
        ``show`` never waits for the write lock that a long submit holds."""
        if self._read("PRAGMA user_version")[0][0] == SCHEMA_VERSION:
            return
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise QueueError(f"{self.path}: schema version {version} is newer than this comfysup "
                                 f"({SCHEMA_VERSION}); upgrade comfysup")
            sql = _named_sql()
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _statements(sql[f"v{step}"]):
                    conn.execute(statement)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
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
        """Nothing can wake a process waiting on a SQLite file, so this sleeps; never longer than
        IDLE_WAIT_CAP_SECONDS, so a caller that checks a stop flag between waits stays responsive."""
        time.sleep(max(0.0, min(timeout_seconds, IDLE_WAIT_CAP_SECONDS)))

    # -- submit -----------------------------------------------------------------------------------------

    def submit(self, jobs: Iterable[NewJob], now: float | None = None) -> SubmitResult:
        """Insert a batch in one transaction; memory is bounded by SUBMIT_BATCH, not by the batch size."""
        at = _now(now)
        inserted = existing = 0
        conflicts: list[str] = []
        specs = SpecCache()
        with self._write() as conn, self._submit_cache(conn):
            batch: list[NewJob] = []
            for job in jobs:
                batch.append(job)
                if len(batch) >= SUBMIT_BATCH:
                    i, e = self._insert_batch(conn, batch, at, conflicts, specs)
                    inserted, existing, batch = inserted + i, existing + e, []
            if batch:
                i, e = self._insert_batch(conn, batch, at, conflicts, specs)
                inserted, existing = inserted + i, existing + e
            if conflicts:
                raise SubmitConflict(conflicts)
        return SubmitResult(inserted=inserted, existing=existing)

    @staticmethod
    @contextlib.contextmanager
    def _submit_cache(conn: sqlite3.Connection) -> Iterator[None]:
        """A larger page cache while a submit inserts: job ids are random, so each insert lands on a random
        page of the id index, and with the default 2 MB cache a 100,000-job submit spent a fifth of its
        time writing out and reading back those pages. Given back after, so a long-lived process keeps the
        default."""
        size = conn.execute("PRAGMA cache_size").fetchone()[0]
        conn.execute(f"PRAGMA cache_size = {SUBMIT_CACHE_KIB}")
        try:
            yield
        finally:
            conn.execute(f"PRAGMA cache_size = {int(size)}")

    def _insert_batch(self, conn: sqlite3.Connection, batch: list[NewJob], at: float,
                      conflicts: list[str], cache: SpecCache) -> tuple[int, int]:
        marks = ",".join("?" * len(batch))
        known = dict(conn.execute(f"SELECT id, spec_hash FROM jobs WHERE id IN ({marks})",
                                  [j.id for j in batch]).fetchall())
        fresh = []
        specs = []
        seq = conn.execute("SELECT coalesce(max(seq), 0) FROM jobs").fetchone()[0]
        for job in batch:
            if job.id in known:
                if known[job.id] != job.spec_hash:
                    conflicts.append(job.id)
                continue
            known[job.id] = job.spec_hash  # a repeat later in this same chunk is judged like one in the table
            seq += 1  # explicit, so the spec row gets the same key without a round trip per job
            text, digest = cache.template(job)
            workflow_id = cache.ids.get(digest)
            if workflow_id is None:
                if len(cache.ids) >= 4096:
                    cache.ids.clear()
                row = conn.execute("SELECT id FROM workflows WHERE hash = ?", (digest,)).fetchone()
                workflow_id = cache.ids[digest] = row[0] if row else conn.execute(
                    "INSERT INTO workflows (hash, workflow) VALUES (?, ?)", (digest, text)).lastrowid
            fresh.append((seq, job.id, job.priority, at, job.spec_hash, job.workflow_name, job.callback_url or None,
                          cache.model_key(job)))
            specs.append((seq, workflow_id, dumps_plain(job.extra_data), dumps_plain(job.meta),
                          dumps_plain(job.params)))
        conn.executemany(
            "INSERT INTO jobs (seq, id, priority, submitted_at, spec_hash, workflow_name, callback_url, model_key) "
            "VALUES (?,?,?,?,?,?,?,?)",
            fresh)
        conn.executemany("INSERT INTO job_specs (seq, workflow_id, extra_data, meta, params) VALUES (?,?,?,?,?)",
                         specs)
        return len(fresh), len(batch) - len(fresh)

    # -- the runner's side --------------------------------------------------------------------------------

    def claim(self, owner: str, server: str, lease_seconds: float, now: float | None = None, *,
              prefer_model: str | None = None, max_wait_seconds: float = 0.0) -> Claim | None:
        with self._write() as conn:
            at = _now(now)
            taken = self._claim(conn, owner, server, lease_seconds, at, prefer_model, max_wait_seconds)
        return self._claim_from(taken)

    def complete_and_claim(self, claim: Claim, outputs: Sequence[Output], owner: str, server: str,
                           lease_seconds: float, now: float | None = None, *, trace: dict[str, Any] | None = None,
                           prefer_model: str | None = None, max_wait_seconds: float = 0.0) -> Claim | None:
        """One transaction, so one fsync, for a job done and the next one claimed: half the commits of
        ``complete`` then ``claim``. A lost fence raises LeaseLost before anything is claimed."""
        with self._write() as conn:
            at = _now(now)
            self._complete(conn, claim, outputs, at, trace)
            taken = self._claim(conn, owner, server, lease_seconds, at, prefer_model, max_wait_seconds)
        return self._claim_from(taken)

    _HEAD = ("SELECT seq, priority FROM jobs INDEXED BY jobs_ready WHERE state = 'queued' AND run_after <= ? "
             "ORDER BY priority DESC, seq LIMIT 1")
    """The job strict order hands out. INDEXED BY: without statistics the planner picks jobs_state and sorts
    every queued row on every claim (O(queued): 3x slower at 5,000 jobs, seconds per claim at a million)."""
    _PICK = (
        "WITH head AS (" + _HEAD.replace("?", ":now") + ") "
        "SELECT head.seq, head.priority, CASE WHEN coalesce((SELECT min(at) FROM affinity_skips s "
        "  WHERE s.priority = head.priority AND s.seq_bound > head.seq), :now) > :now - :wait "
        "THEN (SELECT seq FROM jobs INDEXED BY jobs_affinity WHERE state = 'queued' AND model_key = :key "
        "  AND priority = head.priority AND run_after <= :now ORDER BY seq LIMIT 1) END FROM head")
    """The head and, unless the head has been passed over for ``wait`` seconds already, the first job of its
    priority whose model key is ``key``: one statement, three index seeks (jobs_ready, affinity_skips,
    jobs_affinity), whatever the size of the table."""

    def _claim(self, conn: sqlite3.Connection, owner: str, server: str, lease_seconds: float, at: float,
               prefer_model: str | None, max_wait_seconds: float) -> tuple[Any, ...] | None:
        self._expire_leases(conn, at)
        if prefer_model and max_wait_seconds > 0:
            row = conn.execute(self._PICK, {"now": at, "wait": max_wait_seconds, "key": prefer_model}).fetchone()
            if row is None:
                return None
            head, priority, match = row
            seq = match if match is not None else head
            self._note_passed_over(conn, priority, head, seq, at)
        else:
            row = conn.execute(self._HEAD, (at,)).fetchone()
            if row is None:
                return None
            seq = row[0]
        lease_until = at + lease_seconds
        job = conn.execute(
            "UPDATE jobs SET state = 'running', attempt = attempt + 1, owner = ?, server = ?, "
            "lease_until = ?, started_at = ?, progress = NULL WHERE seq = ? "
            "RETURNING id, attempt, last_server, last_prompt_number, reason, cancel_requested, model_key",
            (owner, server, lease_until, at, seq)).fetchone()
        spec = conn.execute("SELECT workflow_id, extra_data, params FROM job_specs WHERE seq = ?", (seq,)).fetchone()
        text = None
        if spec[0] not in self._templates:
            text = conn.execute("SELECT workflow FROM workflows WHERE id = ?", (spec[0],)).fetchone()[0]
        conn.execute("INSERT INTO attempts (job_id, attempt, owner, server, started_at) VALUES (?,?,?,?,?)",
                     (job[0], job[1], owner, server, at))
        return owner, server, lease_until, job, spec, text

    @staticmethod
    def _note_passed_over(conn: sqlite3.Connection, priority: int, head: int, taken: int, at: float) -> None:
        """Keep the staircase of affinity_skips: taking a job behind the head passes over every ready job of
        its priority before it, from now unless an older row already covers them; taking the head drops
        the rows that cover only jobs before it (claimed, or waiting to retry)."""
        if taken != head:
            conn.execute("INSERT INTO affinity_skips (priority, seq_bound, at) SELECT ?, ?, ? WHERE NOT EXISTS "
                         "(SELECT 1 FROM affinity_skips WHERE priority = ? AND seq_bound >= ?)",
                         (priority, taken, at, priority, taken))
        else:
            conn.execute("DELETE FROM affinity_skips WHERE priority = ? AND seq_bound <= ?", (priority, head))

    def _claim_from(self, taken: tuple[Any, ...] | None) -> Claim | None:
        """The Claim, built after the commit: parsing a workflow does not hold the write lock."""
        if taken is None:
            return None
        owner, server, lease_until, job, spec, text = taken
        return Claim(id=job[0], attempt=job[1], owner=owner, server=server,
                     workflow=apply_params(self._template(spec[0], text), json.loads(spec[2])),
                     extra_data=json.loads(spec[1]), lease_until=lease_until, last_server=job[2],
                     last_prompt_number=job[3], last_reason=job[4], cancel_requested=bool(job[5]), model_key=job[6])

    def _template(self, workflow_id: int, text: str | None) -> dict[str, Any]:
        """A parsed workflow by id, from this process's small cache (ids are never reused: AUTOINCREMENT)."""
        with self._lock:
            template = self._templates.get(workflow_id)
            if template is None:
                if text is None:  # evicted by another thread since the claim read it
                    text = self._read("SELECT workflow FROM workflows WHERE id = ?", (workflow_id,))[0][0]
                template = json.loads(text)
                self._templates[workflow_id] = template
                if len(self._templates) > TEMPLATE_CACHE:
                    self._templates.popitem(last=False)
            else:
                self._templates.move_to_end(workflow_id)
            return template

    def _expire_leases(self, conn: sqlite3.Connection, at: float) -> None:
        """Running jobs whose lease passed are queued again; their attempt stays counted.

        Running rows are few (one per runner), so they are read through jobs_state rather than a lease
        index that every claim, heartbeat and complete would have to rewrite. A read looks first: an
        UPDATE that changes nothing still cost a fifth of a claim's statements."""
        if conn.execute("SELECT 1 FROM jobs INDEXED BY jobs_state WHERE state = 'running' AND lease_until < ? "
                        "LIMIT 1", (at,)).fetchone() is None:
            return
        expired = conn.execute(
            "UPDATE jobs INDEXED BY jobs_state SET state = 'queued', owner = NULL, lease_until = NULL, "
            "reason = 'lease expired: the runner stopped renewing it' "
            "WHERE state = 'running' AND lease_until < ? RETURNING id, attempt", (at,)).fetchall()
        for job_id, attempt in expired:
            conn.execute("UPDATE attempts SET ended_at = ?, outcome = 'lease_expired', kind = 'lease_expired', "
                         "reason = 'lease expired' WHERE job_id = ? AND attempt = ? AND ended_at IS NULL",
                         (at, job_id, attempt))

    def _fenced(self, conn: sqlite3.Connection, claim: Claim, sql: str, args: Sequence[Any]) -> sqlite3.Cursor:
        """Run an UPDATE on the job row guarded by id + attempt + owner; zero rows means the lease is gone."""
        cur = conn.execute(sql + " WHERE id = ? AND attempt = ? AND owner = ? AND state = 'running'",
                           (*args, claim.id, claim.attempt, claim.owner))
        if cur.rowcount != 1:
            raise LeaseLost(f"job {claim.id}: attempt {claim.attempt} of {claim.owner} no longer holds the job")
        return cur

    def _end_attempt(self, conn: sqlite3.Connection, claim: Claim, at: float, outcome: str,
                     reason: str | None, kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        conn.execute("UPDATE attempts SET ended_at = ?, outcome = ?, reason = ?, kind = ?, trace = ? "
                     "WHERE job_id = ? AND attempt = ? AND owner = ? AND ended_at IS NULL",
                     (at, outcome, reason, kind, _dumps(trace), claim.id, claim.attempt, claim.owner))

    def _deliver(self, conn: sqlite3.Connection, job_id: str, at: float) -> None:
        """A terminal job's webhook, in the transaction that made it terminal: due at once."""
        default = self.default_callback_url
        conn.execute("INSERT INTO deliveries (job_id, url, created_at, next_at) "
                     "SELECT id, coalesce(nullif(callback_url, ''), ?), ?, ? FROM jobs "
                     "WHERE id = ? AND coalesce(nullif(callback_url, ''), ?) != ''",
                     (default, at, at, job_id, default))

    def set_progress(self, claim: Claim, progress: dict[str, Any] | None) -> None:
        with self._write(durable=False) as conn:
            self._fenced(conn, claim, "UPDATE jobs SET progress = ?", (_dumps(progress),))

    def heartbeat(self, claim: Claim, lease_seconds: float, now: float | None = None) -> bool:
        with self._write(durable=False) as conn:
            at = _now(now)
            self._fenced(conn, claim, "UPDATE jobs SET lease_until = ?", (at + lease_seconds,))
            row = conn.execute("SELECT cancel_requested FROM jobs WHERE id = ?", (claim.id,)).fetchone()
        return bool(row[0])

    def record_prompt(self, claim: Claim, server: str, prompt_number: int) -> None:
        with self._write(durable=False) as conn:
            self._fenced(conn, claim, "UPDATE jobs SET last_server = ?, last_prompt_number = ?",
                         (server, prompt_number))
            conn.execute("UPDATE attempts SET prompt_number = ?, server = ? "
                         "WHERE job_id = ? AND attempt = ? AND owner = ? AND ended_at IS NULL",
                         (prompt_number, server, claim.id, claim.attempt, claim.owner))

    def complete(self, claim: Claim, outputs: Sequence[Output], now: float | None = None, *,
                 trace: dict[str, Any] | None = None) -> None:
        with self._write() as conn:
            at = _now(now)
            self._complete(conn, claim, outputs, at, trace)

    def _complete(self, conn: sqlite3.Connection, claim: Claim, outputs: Sequence[Output], at: float,
                  trace: dict[str, Any] | None) -> None:
        files = json.dumps([o.__dict__ for o in outputs], separators=(",", ":"))
        self._fenced(conn, claim, "UPDATE jobs SET state = 'done', outputs = ?, finished_at = ?, reason = NULL, "
                     "owner = NULL, lease_until = NULL, machine = ?", (files, at, owner_host(claim.owner)))
        self._end_attempt(conn, claim, at, "done", None, None, trace)
        self._deliver(conn, claim.id, at)

    def retry_later(self, claim: Claim, run_after: float, reason: str, now: float | None = None, *,
                    kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        with self._write() as conn:
            at = _now(now)
            # The attempt judged its prompt: the next one must not adopt that run's failure again, so the
            # number is forgotten (a live prompt is still followed, and a success still adopted, by id).
            self._fenced(conn, claim, "UPDATE jobs SET state = 'queued', run_after = ?, reason = ?, owner = NULL, "
                         "lease_until = NULL, last_prompt_number = NULL", (run_after, reason))
            self._end_attempt(conn, claim, at, "retry", reason, kind, trace)

    def dead(self, claim: Claim, reason: str, now: float | None = None, *, kind: str | None = None,
             trace: dict[str, Any] | None = None) -> None:
        self._finish(claim, DEAD, reason, now, kind, trace)

    def cancelled(self, claim: Claim, reason: str, now: float | None = None, *,
                  trace: dict[str, Any] | None = None) -> None:
        self._finish(claim, CANCELLED, reason, now, "cancelled", trace)

    def _finish(self, claim: Claim, state: str, reason: str, now: float | None, kind: str | None,
                trace: dict[str, Any] | None) -> None:
        with self._write() as conn:
            at = _now(now)
            self._fenced(conn, claim, "UPDATE jobs SET state = ?, reason = ?, finished_at = ?, owner = NULL, "
                         "lease_until = NULL", (state, reason, at))
            self._end_attempt(conn, claim, at, state, reason, kind, trace)
            self._deliver(conn, claim.id, at)

    def release(self, claim: Claim, reason: str, count_attempt: bool = True, now: float | None = None, *,
                kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        with self._write() as conn:
            at = _now(now)
            # A runner releases only a prompt it interrupted itself: forget the number, as for a retry.
            self._fenced(conn, claim, "UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, "
                         "reason = ?, attempt = attempt - ?, last_prompt_number = NULL",
                         (reason, 0 if count_attempt else 1))
            self._end_attempt(conn, claim, at, "released" if count_attempt else "released_uncounted", reason,
                              kind, trace)

    def release_owner(self, owner: str, reason: str, count_attempt: bool = True,
                      now: float | None = None) -> list[str]:
        with self._write() as conn:
            at = _now(now)
            rows = conn.execute(
                "UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, reason = ?, "
                "attempt = attempt - ? WHERE state = 'running' AND owner = ? RETURNING id, attempt",
                (reason, 0 if count_attempt else 1, owner)).fetchall()
            outcome = "released" if count_attempt else "released_uncounted"
            kind = "runner_died" if count_attempt else "shutdown"
            for job_id, attempt in rows:
                conn.execute("UPDATE attempts SET ended_at = ?, outcome = ?, reason = ?, kind = ? "
                             "WHERE job_id = ? AND attempt = ? AND owner = ? AND ended_at IS NULL",
                             (at, outcome, reason, kind, job_id, attempt + (0 if count_attempt else 1), owner))
        return [r[0] for r in rows]

    def active_count(self) -> int:
        return self._read("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')")[0][0]

    def running_owners(self) -> list[str]:
        return [r[0] for r in self._read("SELECT DISTINCT owner FROM jobs WHERE state = 'running'")]

    # -- the people's side ------------------------------------------------------------------------------

    def cancel(self, ids: Sequence[str], now: float | None = None) -> dict[str, str]:
        at = _now(now)
        out: dict[str, str] = {}
        with self._write() as conn:
            for job_id in ids:
                row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None:
                    out[job_id] = "unknown"
                elif row[0] == QUEUED:
                    conn.execute("UPDATE jobs SET state = 'cancelled', finished_at = ?, "
                                 "reason = 'cancelled by user' WHERE id = ?", (at, job_id))
                    self._deliver(conn, job_id, at)
                    out[job_id] = "cancelled"
                elif row[0] == RUNNING:
                    conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
                    out[job_id] = "cancelling"
                else:
                    out[job_id] = f"already {row[0]}"
        return out

    _REQUEUE = ("UPDATE jobs SET state = 'queued', attempt = 0, run_after = 0, reason = NULL, finished_at = NULL, "
                "cancel_requested = 0, last_server = NULL, last_prompt_number = NULL")
    """A retried dead job runs afresh: no earlier prompt is looked for, so its old failure is not adopted."""

    def requeue_dead(self, ids: Sequence[str] | None, now: float | None = None) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._write() as conn:
            if ids is None:
                rows = conn.execute(f"{self._REQUEUE} WHERE state = 'dead' RETURNING id").fetchall()
                return {r[0]: "requeued" for r in rows}
            for job_id in ids:
                row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None:
                    out[job_id] = "unknown"
                elif row[0] != DEAD:
                    out[job_id] = f"not dead ({row[0]})"
                else:
                    conn.execute(f"{self._REQUEUE} WHERE id = ?", (job_id,))
                    out[job_id] = "requeued"
        return out

    _FROM = ("jobs JOIN job_specs ON job_specs.seq = jobs.seq "
             "JOIN workflows ON workflows.id = job_specs.workflow_id")
    _COLUMNS = ("jobs.id, state, priority, attempt, workflow, extra_data, meta, params, workflow_name, submitted_at, "
                "run_after, owner, server, lease_until, started_at, finished_at, reason, outputs, "
                "cancel_requested, machine, spec_hash, last_server, last_prompt_number, progress, callback_url, "
                "model_key")

    def _record(self, row: Sequence[Any], attempts: list[Attempt]) -> JobRecord:
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

    def _attempts(self, ids: Sequence[str]) -> dict[str, list[Attempt]]:
        out: dict[str, list[Attempt]] = {i: [] for i in ids}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            for r in self._read(
                    "SELECT job_id, attempt, owner, server, started_at, ended_at, outcome, reason, prompt_number, "
                    f"kind, trace FROM attempts WHERE job_id IN ({','.join('?' * len(chunk))}) ORDER BY rowid",
                    chunk):
                out[r[0]].append(Attempt(*r[1:9], kind=r[9], trace=_loads(r[10])))
        return out

    def get(self, job_id: str) -> JobRecord:
        rows = self.get_many([job_id])
        if not rows:
            raise NotFound(f"no job with id {job_id} in {self.path}")
        return rows[0]

    def get_many(self, ids: Sequence[str]) -> list[JobRecord]:
        ids = list(ids)
        rows: list[Any] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            rows += self._read(f"SELECT {self._COLUMNS} FROM {self._FROM} WHERE jobs.id IN ({marks})", chunk)
        attempts = self._attempts([r[0] for r in rows])
        order = {job_id: i for i, job_id in enumerate(ids)}
        return sorted((self._record(r, attempts[r[0]]) for r in rows), key=lambda j: order[j.id])

    def iter_jobs(self, states: Sequence[str] | None = None) -> Iterator[JobRecord]:
        """Every job in submission order, read in pages so memory stays flat on a large table."""
        last = 0
        where = ""
        args: list[Any] = []
        if states:
            where = f" AND state IN ({','.join('?' * len(states))})"
            args = list(states)
        while True:
            rows = self._read(f"SELECT jobs.seq, {self._COLUMNS} FROM {self._FROM} WHERE jobs.seq > ?{where} "
                              "ORDER BY jobs.seq LIMIT 500",
                              [last, *args])
            if not rows:
                return
            attempts = self._attempts([r[1] for r in rows])
            for r in rows:
                yield self._record(r[1:], attempts[r[1]])
            last = rows[-1][0]

    def status(self, now: float | None = None, dead_limit: int = 5, done_limit: int = 0) -> Status:
        at = _now(now)
        counts = dict.fromkeys(STATES, 0)
        # Finished jobs are counted as they finish (schema v6's triggers); the index is walked only over the
        # queued and running ranges, so a million finished jobs cost nothing here.
        counts.update(dict(self._read("SELECT state, count(*) FROM jobs INDEXED BY jobs_state "
                                      "WHERE state IN ('queued', 'running') GROUP BY state")))
        counts.update(dict(self._read("SELECT state, n FROM finished_counts")))
        # jobs_ready holds run_after: counting through it reads no rows (98 -> 30 ms at 200,000 queued).
        waiting = self._read("SELECT count(*) FROM jobs INDEXED BY jobs_ready WHERE state = 'queued' "
                             "AND run_after > ?", (at,))[0][0]
        counts["waiting"] = waiting
        counts[QUEUED] -= waiting
        # A queued job has no finished_at (only done, dead and cancelled set it; requeue clears it), and
        # with that equality jobs_state hands min(seq) over at once instead of scanning every queued entry.
        oldest = self._read("SELECT submitted_at FROM jobs WHERE seq = "
                            "(SELECT min(seq) FROM jobs WHERE state = 'queued' AND finished_at IS NULL)")
        running = [RunningJob(*r[:6], progress=_loads(r[6])) for r in self._read(
            "SELECT id, owner, server, attempt, started_at, lease_until, progress FROM jobs WHERE state = 'running' "
            "ORDER BY started_at")]
        dead = [tuple(r) for r in self._read(
            "SELECT id, finished_at, reason FROM jobs WHERE state = 'dead' ORDER BY finished_at DESC LIMIT ?",
            (dead_limit,))]
        done = [tuple(r) for r in self._read(
            "SELECT id, finished_at FROM jobs WHERE state = 'done' ORDER BY finished_at DESC LIMIT ?",
            (done_limit,))] if done_limit else []
        return Status(counts=counts, oldest_queued_at=oldest[0][0] if oldest else None, running=running,
                      recent_dead=dead, recent_done=done)  # type: ignore[arg-type]

    def states(self, ids: Sequence[str]) -> dict[str, str]:
        ids = list(ids)
        out: dict[str, str] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            out.update(dict(self._read(f"SELECT id, state FROM jobs WHERE id IN ({','.join('?' * len(chunk))})",
                                       chunk)))
        return out

    def finished_counts(self, since: float, now: float | None = None) -> dict[str, int]:
        return dict(self._read("SELECT state, count(*) FROM jobs WHERE state IN ('done', 'dead', 'cancelled') "
                               "AND finished_at >= ? GROUP BY state", (since,)))

    def ended_since(self, since: float, limit: int = 10000) -> list[EndedAttempt]:
        """The trace stays in the database: json_array_length counts its nodes there (0 when a list is
        missing or not a list), so metrics never hold the several KB of JSON of each attempt."""
        rows = self._read(
            "SELECT a.job_id, a.attempt, a.outcome, a.kind, a.started_at, a.ended_at, "
            "coalesce(json_array_length(a.trace, '$.nodes'), 0), coalesce(json_array_length(a.trace, '$.cached'), 0), "
            "j.workflow_name, j.submitted_at, (SELECT min(f.started_at) FROM attempts f WHERE f.job_id = a.job_id) "
            "FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.ended_at >= ? ORDER BY a.ended_at LIMIT ?",
            (since, limit))
        return [EndedAttempt(job_id=r[0], attempt=r[1], outcome=r[2], kind=r[3], started_at=r[4], ended_at=r[5],
                             nodes_run=r[6], nodes_cached=r[7], workflow_name=r[8], submitted_at=r[9],
                             first_started_at=r[10])
                for r in rows]

    def ended_count(self, since: float, until: float) -> int:
        return self._read("SELECT count(*) FROM attempts WHERE ended_at >= ? AND ended_at <= ?",
                          (since, until))[0][0]

    def ended_keys(self, since: float, until: float) -> list[tuple[str, int, float, float]]:
        return [tuple(r) for r in self._read(  # type: ignore[misc]
            "SELECT job_id, attempt, started_at, ended_at FROM attempts WHERE ended_at >= ? AND ended_at <= ? "
            "ORDER BY ended_at", (since, until))]

    # -- webhook deliveries --------------------------------------------------------------------------------

    _DELIVERY = "id, job_id, url, attempts, created_at, next_at, last_status, last_error, delivered_at"

    def deliveries(self, job_id: str) -> list[Delivery]:
        return [Delivery(*r) for r in self._read(f"SELECT {self._DELIVERY} FROM deliveries WHERE job_id = ? "
                                                 "ORDER BY id", (job_id,))]

    def pending_deliveries(self) -> int:
        return self._read("SELECT count(*) FROM deliveries WHERE next_at IS NOT NULL")[0][0]

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """A read looks first: deliverers poll every second, and an idle poll must not take the write lock
        that runners' claims and heartbeats wait for."""
        at = _now(now)
        if not self._read("SELECT 1 FROM deliveries WHERE next_at IS NOT NULL AND next_at <= ? LIMIT 1", (at,)):
            return []
        with self._write() as conn:
            rows = conn.execute(f"SELECT {self._DELIVERY} FROM deliveries WHERE next_at IS NOT NULL AND next_at <= ? "
                                "ORDER BY next_at LIMIT ?", (at, limit)).fetchall()
            conn.executemany("UPDATE deliveries SET next_at = ? WHERE id = ?",
                             [(at + hold_seconds, r[0]) for r in rows])
        return [Delivery(*r[:5], at + hold_seconds, *r[6:]) for r in rows]  # next_at: the end of the hold

    def delivery_result(self, delivery_id: int, *, delivered: bool, status: int | None, error: str | None,
                        next_at: float | None, now: float | None = None) -> None:
        at = _now(now)
        with self._write() as conn:
            conn.execute("UPDATE deliveries SET attempts = attempts + 1, last_status = ?, last_error = ?, "
                         "delivered_at = ?, next_at = ? WHERE id = ?",
                         (status, error, at if delivered else None, None if delivered else next_at, delivery_id))

    # -- prune ------------------------------------------------------------------------------------------

    def prunable(self, finished_before: float) -> int:
        return self._read("SELECT count(*) FROM jobs INDEXED BY jobs_state WHERE state IN ('done', 'dead', "
                          "'cancelled') AND finished_at < ?", (finished_before,))[0][0]

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """Up to ``limit`` terminal jobs finished before ``finished_before``, with their attempts, deliveries
        and the workflows no remaining job uses, in one short transaction. A job whose webhook is still being
        delivered stays until its delivery ends."""
        with self._write() as conn:
            rows = conn.execute(
                "SELECT seq, id, machine FROM jobs INDEXED BY jobs_state WHERE state IN ('done', 'dead', 'cancelled') "
                "AND finished_at < ? AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.job_id = jobs.id "
                "AND d.next_at IS NOT NULL) LIMIT ?", (finished_before, limit)).fetchall()
            if not rows:
                return PruneBatch(removed=[])
            seqs, ids = [r[0] for r in rows], [r[1] for r in rows]
            marks = ",".join("?" * len(rows))
            used = [r[0] for r in conn.execute(f"SELECT DISTINCT workflow_id FROM job_specs WHERE seq IN ({marks})",
                                               seqs)]
            conn.execute(f"DELETE FROM jobs WHERE seq IN ({marks})", seqs)
            conn.execute(f"DELETE FROM job_specs WHERE seq IN ({marks})", seqs)
            conn.execute(f"DELETE FROM attempts WHERE job_id IN ({marks})", ids)
            conn.execute(f"DELETE FROM deliveries WHERE job_id IN ({marks})", ids)
            gone = 0
            for workflow_id in used:
                gone += conn.execute("DELETE FROM workflows WHERE id = ? AND NOT EXISTS "
                                     "(SELECT 1 FROM job_specs WHERE workflow_id = ?)",
                                     (workflow_id, workflow_id)).rowcount
        return PruneBatch(removed=[(r[1], r[2]) for r in rows], workflows_removed=gone)

    # -- machines -----------------------------------------------------------------------------------------

    def register_machine(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                         now: float | None = None) -> None:
        at = _now(now)
        with self._write() as conn:
            conn.execute("DELETE FROM machines WHERE host = ?", (host,))
            conn.execute("INSERT INTO machines (host, pid, slots, started_at, heartbeat_at) VALUES (?,?,?,?,?)",
                         (host, pid, json.dumps(list(slots)), at, at))

    def machine_heartbeat(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                          now: float | None = None) -> None:
        at = _now(now)
        with self._write() as conn:
            conn.execute("INSERT INTO machines (host, pid, slots, started_at, heartbeat_at) VALUES (?,?,?,?,?) "
                         "ON CONFLICT (host, pid) DO UPDATE SET slots = excluded.slots, "
                         "heartbeat_at = excluded.heartbeat_at", (host, pid, json.dumps(list(slots)), at, at))

    def machines(self, now: float | None = None) -> list[Machine]:
        at = _now(now)
        return [Machine(host=r[0], pid=r[1], slots=json.loads(r[2]), started_at=r[3], heartbeat_at=r[4],
                        age_seconds=max(0.0, at - r[4]))
                for r in self._read("SELECT host, pid, slots, started_at, heartbeat_at FROM machines "
                                    "ORDER BY host, pid")]


def _dumps(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _model_key_of_text(text: str | None) -> str | None:
    try:
        return model_key(json.loads(text)) if text else None
    except ValueError:
        return None


def _loads(text: str | None) -> Any:
    return None if not text else json.loads(text)


__all__ = ["DONE", "TERMINAL", "SQLiteQueue", "filesystem_type"]
