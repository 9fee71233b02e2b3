"""The SQLite backend: the shared contract, plus what only a file on a local disk has to get right."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from pathlib import Path

import pytest
from queue_contract import T0, QueueContract, make_job

from comfysup import records
from comfysup.errors import DatabaseLocked, DatabaseMissing, QueueError
from comfysup.queue import queries, sqlite_file
from comfysup.queue import sqlite as sqlite_backend
from comfysup.queue.base import Output
from comfysup.queue.search import JobSearch
from comfysup.queue.sqlite import SCHEMA_VERSION, SQLiteDb, SQLiteQueue
from comfysup.workflows import model_key


class TestSQLiteQueue(QueueContract):
    def make_queue(self, tmp_path: Path) -> SQLiteQueue:
        return SQLiteQueue(tmp_path / "queue.db")

    def count(self, q: SQLiteQueue, table: str) -> int:  # type: ignore[override]
        return q.db._read(f"SELECT count(*) FROM {table}")[0][0]


def test_connection_is_wal_with_full_sync_and_a_busy_timeout(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db", busy_timeout_seconds=7)
    assert q.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert q.db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert q.db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 7000
    q.close()


def test_new_file_is_0600_in_a_new_0700_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "queue.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1)], now=T0)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    wal = path.with_name("queue.db-wal")
    assert wal.exists() and stat.S_IMODE(wal.stat().st_mode) == 0o600  # SQLite copies the file's mode
    q.close()


def test_schema_version_is_recorded_and_a_newer_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    SQLiteQueue(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(QueueError, match="newer than this comfysup"):
        SQLiteQueue(path)


def test_reopening_keeps_the_jobs(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(i) for i in range(3)], now=T0)
    q.close()
    again = SQLiteQueue(tmp_path / "q.db", create=False)
    assert again.reads.status(now=T0).counts["queued"] == 3
    again.close()


def test_missing_database_without_create(tmp_path: Path) -> None:
    with pytest.raises(DatabaseMissing, match="no queue database"):
        SQLiteQueue(tmp_path / "absent.db", create=False)
    assert not (tmp_path / "absent.db").exists()


def test_network_filesystem_is_refused_before_anything_is_created(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_file, "filesystem_type", lambda path: "nfs4")
    path = tmp_path / "sub" / "q.db"
    with pytest.raises(QueueError, match=r"network filesystem \(nfs4\)"):
        SQLiteQueue(path)
    assert not path.exists()


def test_filesystem_type_finds_the_mount_of_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sqlite_file.filesystem_type(tmp_path) != ""
    psutil = pytest.importorskip("psutil")
    mounts = sorted((p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True))
    assert sorted(sqlite_file._mounts()) == mounts
    fake = [("/", "ext4"), ("/mnt/my share", "nfs4"), ("/mnt/my", "xfs")]
    monkeypatch.setattr(sqlite_file, "_mounts", lambda: fake)
    assert sqlite_file.filesystem_type(Path("/mnt/my share/queue.db")) == "nfs4"
    assert sqlite_file.filesystem_type(Path("/mnt/my/queue.db")) == "xfs"
    assert sqlite_file.filesystem_type(Path("/mnt/mys/queue.db")) == "ext4"


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_write_lock_held_beyond_the_busy_timeout_is_database_locked(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    q = SQLiteQueue(path, busy_timeout_seconds=0.2)
    q.intake.submit([make_job(1)], now=T0)
    holder = _hold_write_lock(path)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseLocked, match="another process holds a write lock"):
            q.leases.claim("runner-a", "gpu0", 30, now=T0)
        assert time.monotonic() - started >= 0.15  # it waited for the busy timeout, not SQLITE_BUSY at once
        assert q.reads.status(now=T0).counts["queued"] == 1  # WAL: reads go on under a writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert q.leases.claim("runner-a", "gpu0", 30, now=T0) is not None  # and the connection is still usable
    q.close()


def test_a_retry_waits_its_backoff_after_the_write_that_records_it_even_behind_a_lock(tmp_path: Path) -> None:
    """The backoff counts from when the attempt's end is recorded: a retry_later that waited 0.3 s for the write
    lock still leaves the job its 0.2 s (chaos T1 saw a 0.1 s gap when run_after was read before the wait)."""
    import threading

    path = tmp_path / "q.db"
    q = SQLiteQueue(path, busy_timeout_seconds=5.0)
    q.intake.submit([make_job(1)])
    claim = q.leases.claim("runner-a", "gpu0", 30)
    held = threading.Event()

    def hold() -> None:  # the lock held 0.3 s by another connection: the fault, not a synchronisation
        holder = _hold_write_lock(path)
        held.set()
        time.sleep(0.3)
        holder.execute("ROLLBACK")
        holder.close()

    locker = threading.Thread(target=hold)
    locker.start()
    try:
        assert held.wait(5)
        q.leases.retry_later(claim, time.time() + 0.2, "out of memory", kind="oom")
    finally:
        locker.join(5)
    (run_after,) = q.db._read("SELECT run_after FROM jobs")[0]
    (ended_at,) = q.db._read("SELECT ended_at FROM attempts")[0]
    assert run_after - ended_at >= 0.19
    q.close()


def test_a_reconnect_never_makes_an_empty_database_where_the_queue_was_deleted(tmp_path: Path) -> None:
    """A process whose connection is gone (closed, forked, dropped after an error) once the file was deleted must
    say so, not create an empty queue at the path: the supervisor would then call the deletion a replacement, and
    a writer would carry on in a database without the jobs."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1)], now=T0)
    q.close()
    path.unlink()
    with pytest.raises(DatabaseMissing, match="deleted or moved"):
        q.reads.status(now=T0)
    assert not path.exists()


def test_opening_an_existing_queue_does_not_need_the_write_lock(tmp_path: Path) -> None:
    """status and show must work while a long submit holds the write lock."""
    path = tmp_path / "q.db"
    SQLiteQueue(path).close()
    holder = _hold_write_lock(path)
    try:
        q = SQLiteQueue(path, create=False, busy_timeout_seconds=0.2)
        assert q.reads.status(now=T0).counts["queued"] == 0
        q.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _fork(child: object) -> int:
    """Run ``child()`` in a forked process; return its exit status (0 when it returned normally)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child()  # type: ignore[operator]
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.timeout(30)
def test_a_forked_child_uses_its_own_connection(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(1)], now=T0)
    parent_conn = q.db.conn

    def child() -> None:
        assert q.db.conn is not parent_conn
        q.intake.submit([make_job(2)], now=T0)
        claim = q.leases.claim("child", "gpu0", 30, now=T0)
        assert claim is not None
        q.leases.complete(claim, [], now=T0 + 1)

    assert _fork(child) == 0
    counts = q.reads.status(now=T0).counts
    assert (counts["queued"], counts["done"]) == (1, 1)
    q.close()


@pytest.mark.timeout(30)
def test_a_child_keeps_its_commits_when_the_parent_closes_first(tmp_path: Path) -> None:
    """The parent's last close must not delete the WAL under a forked child that still writes.

    A connection inherited across fork shares SQLite's in-process lock bookkeeping with the parent's,
    so the child holds none of the parent's OS locks while believing it does; when the parent then
    closes, it checkpoints and deletes the WAL that the child keeps writing to, and the child's
    commits vanish. The queue must hand the child a clean start instead.
    """
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1)], now=T0)
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            q.intake.submit([make_job(2)], now=T0)
            os.write(to_parent_w, b"1")
            os.read(to_child_r, 1)  # the parent has closed its connection
            q.intake.submit([make_job(3)], now=T0)
            q.intake.submit([make_job(4)], now=T0)
            code = 0
        finally:
            os._exit(code)
    assert os.read(to_parent_r, 1) == b"1"
    q.close()
    os.write(to_child_w, b"1")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 4
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_maintenance_checkpoints_the_wal_at_its_pace(tmp_path: Path) -> None:
    """A checkpoint copies the WAL into the database file; between two, maintenance does nothing."""
    path = tmp_path / "q.db"
    idle = SQLiteQueue(path, checkpoint_seconds=3600)
    idle.intake.submit([make_job(i) for i in range(200)], now=T0)
    before = path.stat().st_size
    idle.maintenance()
    assert path.stat().st_size == before
    eager = SQLiteQueue(path, checkpoint_seconds=1e-9)
    eager.maintenance()
    assert path.stat().st_size > before
    idle.close()
    eager.close()


def test_a_file_that_is_not_a_database_is_a_queue_error(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"this is not a database, it is a shopping list\n" * 200)
    with pytest.raises(QueueError, match="file is not a database"):
        SQLiteQueue(path, create=False)


def test_a_failed_write_rolls_back_and_the_queue_stays_usable(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(1)], now=T0)
    with pytest.raises(QueueError, match="no such table"), q.db._write() as conn:
        conn.execute("UPDATE jobs SET priority = 7")
        conn.execute("INSERT INTO no_such_table VALUES (1)")
    assert q.reads.get(make_job(1).id).priority == 0  # the first statement was rolled back with the second
    q.intake.submit([make_job(2)], now=T0)
    assert q.reads.status(now=T0).counts["queued"] == 2
    q.close()


class FakeClock:
    """time.monotonic and time.sleep for a wait: sleeping advances the clock, and ``during_sleep`` runs at
    the first sleep (another process's commit while this one waits)."""

    def __init__(self, during_sleep=lambda: None) -> None:
        self.now, self.sleeps, self.during_sleep = 1000.0, [], during_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if len(self.sleeps) > 1000:
            raise AssertionError("the wait does not end")
        if not self.sleeps:
            self.during_sleep()
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.timeout(30)
def test_wait_for_work_waits_at_most_a_quarter_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing commits: the wait is capped, so a runner's stop flag stays responsive."""
    q = SQLiteQueue(tmp_path / "q.db")
    for asked, waited in ((30, sqlite_backend.IDLE_WAIT_CAP_SECONDS), (0.05, 0.05)):
        clock = FakeClock()
        monkeypatch.setattr(sqlite_backend.time, "monotonic", clock.monotonic)
        monkeypatch.setattr(sqlite_backend.time, "sleep", clock.sleep)
        q.wait_for_work(asked)
        monkeypatch.undo()
        assert sum(clock.sleeps) == pytest.approx(waited)
        assert max(clock.sleeps) <= sqlite_backend.WAKE_CHECK_SECONDS
    q.close()


@pytest.mark.timeout(30)
def test_wait_for_work_ends_at_another_connections_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job submitted by another process while a runner waits is seen at the next check, not after the cap;
    the waiter's own commits do not end its wait."""
    q, other = SQLiteQueue(tmp_path / "q.db"), SQLiteQueue(tmp_path / "q.db")
    clock = FakeClock(during_sleep=lambda: other.intake.submit([make_job(1)], now=T0))
    monkeypatch.setattr(sqlite_backend.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(sqlite_backend.time, "sleep", clock.sleep)
    q.wait_for_work(30)
    assert clock.sleeps == [sqlite_backend.WAKE_CHECK_SECONDS]
    clock.sleeps.clear()
    clock.during_sleep = lambda: q.intake.submit([make_job(2)], now=T0)
    q.wait_for_work(30)
    assert sum(clock.sleeps) == pytest.approx(sqlite_backend.IDLE_WAIT_CAP_SECONDS)
    monkeypatch.undo()
    q.close()
    other.close()


def test_a_version_1_database_is_migrated_and_keeps_its_jobs(tmp_path: Path) -> None:
    """Schema v2 (machines, jobs.machine) is added on open; a queue made by an earlier comfysup keeps working."""
    path = tmp_path / "q.db"
    conn = sqlite3.connect(path)
    for statement in sqlite_file.named_sql()["v1"].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO jobs (id, submitted_at, spec_hash, workflow) VALUES (?, ?, 'h', '{}')",
                 (make_job(1).id, T0))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    claim = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    assert claim is not None and claim.id == make_job(1).id
    q.leases.complete(claim, [], now=T0 + 1)
    assert q.reads.get(claim.id).machine == "host-a"
    q.fleet.register_machine("host-a", 1, [], now=T0)
    assert [m.host for m in q.fleet.machines(now=T0)] == ["host-a"]
    q.close()


def test_a_version_2_database_keeps_every_jobs_workflow_and_data_through_v3(tmp_path: Path) -> None:
    """v3 moves workflow, extra_data, meta and params into job_specs; nothing may be lost on the way."""
    path = tmp_path / "q.db"
    conn = sqlite3.connect(path)
    for step in ("v1", "v2"):
        for statement in sqlite_file.named_sql()[step].split(";"):
            if statement.strip():
                conn.execute(statement)
    jobs = [make_job(n, extra={"api_key_comfy_org": f"k{n}"}, meta={"n": n, "tag": "old"}) for n in range(3)]
    for job in jobs:
        conn.execute("INSERT INTO jobs (id, priority, submitted_at, spec_hash, workflow_name, workflow, extra_data, "
                     "meta, params) VALUES (?,?,?,?,?,?,?,?,?)",
                     (job.id, job.priority, T0, job.spec_hash, "old", job.workflow_json,
                      json.dumps(job.extra_data), json.dumps(job.meta), json.dumps(job.params)))
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    for job, record in zip(jobs, q.reads.get_many([j.id for j in jobs]), strict=True):
        assert (record.workflow, record.extra_data, record.meta, record.params) == \
            (job.workflow, job.extra_data, job.meta, job.params)
    assert q.intake.submit(jobs, now=T0).existing == 3  # the same content is still recognised
    claim = q.leases.claim("runner-a", "gpu0", 30, now=T0)
    assert claim is not None and claim.workflow == jobs[0].workflow
    assert claim.extra_data == {"api_key_comfy_org": "k0"}
    q.intake.submit([make_job(9)], now=T0)  # new jobs after the migrated ones
    assert [j.id for j in q.reads.iter_jobs()] == [*(j.id for j in jobs), make_job(9).id]
    q.close()


def test_a_version_4_database_keeps_its_jobs_and_stores_each_workflow_once_in_v5(tmp_path: Path) -> None:
    """v5 moves workflows into their own table by hash: every job keeps its workflow and data, identical
    workflows are kept once, and the jobs still to run get their model key."""
    path = tmp_path / "q.db"
    conn = sqlite3.connect(path)
    for step in ("v1", "v2", "v3", "v4"):
        for statement in sqlite_file.named_sql()[step].split(";"):
            if statement.strip():
                conn.execute(statement)
    loaded = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}},
              "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "m"}}}
    jobs = [make_job(n, extra={"api_key_comfy_org": f"k{n}"}) for n in range(3)]
    texts = [j.workflow_json for j in jobs] + [json.dumps(loaded, sort_keys=True, separators=(",", ":"))] * 2
    ids = [j.id for j in jobs] + [make_job(7).id, make_job(8).id]
    states = ["done", "queued", "running", "queued", "queued"]
    for seq, (job_id, text, state) in enumerate(zip(ids, texts, states, strict=True), start=1):
        conn.execute("INSERT INTO jobs (seq, id, state, submitted_at, spec_hash, attempt, owner) "
                     "VALUES (?,?,?,?,?,?,?)", (seq, job_id, state, T0, f"h{seq}", int(state != "queued"),
                                                "r/1/gpu0/t" if state == "running" else None))
        conn.execute("INSERT INTO job_specs (seq, workflow, extra_data, meta, params) VALUES (?,?,?,?,?)",
                     (seq, text, json.dumps({"api_key_comfy_org": f"k{seq}"}), json.dumps({"n": seq}),
                      json.dumps({"1.color": seq - 1} if seq <= 3 else {})))
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.db._read("SELECT count(*) FROM workflows")[0][0] == 4  # the two identical ones stored once
    records = q.reads.get_many(ids)
    assert [r.state for r in records] == states
    assert [r.workflow for r in records] == [json.loads(t) for t in texts]
    assert [r.extra_data for r in records] == [{"api_key_comfy_org": f"k{n}"} for n in range(1, 6)]
    assert [r.meta for r in records] == [{"n": n} for n in range(1, 6)]
    key = model_key(loaded)
    assert [r.model_key for r in records] == [None, None, None, key, key]  # done: not needed any more
    claim = q.leases.claim("r2", "gpu1", 30, now=T0 + 1, prefer_model=key, max_wait_seconds=60)
    assert claim is not None and claim.id == make_job(7).id and claim.workflow == loaded
    q.close()


def test_finished_counts_follow_every_transition(tmp_path: Path) -> None:
    """Schema v6 counts finished jobs with triggers: after any mix of what runners and people do, the counts
    that status shows must equal a full count of the table."""
    import random

    rng = random.Random(11)
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(n) for n in range(120)], now=T0)
    held = []
    for step in range(400):
        at = T0 + step
        action = rng.choice(["claim", "claim", "end", "end", "cancel", "requeue", "prune", "release"])
        if action == "claim" and (claim := q.leases.claim(f"r{step}", "gpu0", 1e6, now=at)) is not None:
            held.append(claim)
        elif action == "end" and held:
            claim, how = held.pop(rng.randrange(len(held))), rng.choice(["done", "dead", "cancelled", "retry"])
            if how == "done":
                q.leases.complete(claim, [], now=at)
            elif how == "dead":
                q.leases.dead(claim, "x", now=at)
            elif how == "cancelled":
                q.leases.cancelled(claim, "x", now=at)
            else:
                q.leases.retry_later(claim, at, "x", now=at)
        elif action == "release" and held:
            q.leases.release(held.pop(), "x", now=at)
        elif action == "cancel":
            q.intake.cancel([make_job(rng.randrange(120)).id], now=at)
        elif action == "requeue":
            q.intake.requeue_dead([make_job(rng.randrange(120)).id], now=at)
        elif action == "prune":
            q.intake.prune(at - 50, limit=5)
        full = dict(q.db._read("SELECT state, count(*) FROM jobs GROUP BY state"))
        shown = q.reads.status(now=at).counts
        assert {s: shown[s] + (shown["waiting"] if s == "queued" else 0) for s in full} == full, (step, action)
    assert set(dict(q.db._read("SELECT state, n FROM finished_counts"))) == {"done", "dead", "cancelled"}
    q.close()


def test_a_label_search_walks_the_label_index_without_sorting(tmp_path: Path) -> None:
    """A label's page is read from job_labels (key=?, value=?) newest first, the jobs joined by seq (no scan of
    every job, no sort), first page and later; a second label is a probe of the same index."""
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(n, meta={"run": "r7" if n % 2 else "r1", "team": "a"}) for n in range(6)], now=T0)
    statements: list[str] = []
    q.db.conn.set_trace_callback(lambda sql: statements.append(sql) if "l0.key =" in sql else None)
    first = q.search.search(JobSearch(labels=(("run", "r7"),), limit=2))
    q.search.search(JobSearch(labels=(("run", "r7"), ("team", "a")), after=first.cursor, limit=2))
    q.db.conn.set_trace_callback(None)
    assert len(statements) == 2
    for sql in statements:
        plan = " ".join(r[3] for r in q.db.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SEARCH l0 USING PRIMARY KEY (key=? AND value=?" in plan and "TEMP B-TREE" not in plan, plan
        assert "SCAN" not in plan, plan
    q.close()


def test_prune_removes_the_labels_of_the_jobs_it_removes(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(n, meta={"run": "r7", "n": n, "team": str(n)}) for n in range(3)], now=T0)
    claim = q.leases.claim("r", "gpu0", 30, now=T0)
    q.leases.complete(claim, [], now=T0 + 1)
    assert q.db._read("SELECT count(*) AS n FROM job_labels")[0]["n"] == 6
    assert len(q.intake.prune(T0 + 2).removed) == 1
    labels = q.db._read("SELECT key, value, seq FROM job_labels ORDER BY seq, key")
    assert [(r["key"], r["value"]) for r in labels] == [("run", "r7"), ("team", "1"), ("run", "r7"), ("team", "2")]
    q.close()


def test_v20_indexes_the_labels_of_the_jobs_already_there(tmp_path: Path) -> None:
    """A v19 queue opened by this comfysup: every job's string labels fill job_labels, and new jobs add theirs."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(n, meta={"run": "r7" if n % 2 else "r1", "n": n}) for n in range(4)], now=T0)
    q.close()
    _back_to(path, 19)
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    q.intake.submit([make_job(9, meta={"run": "r7"})], now=T0 + 1)
    assert [r.id for r in q.search.search(JobSearch(labels=(("run", "r7"),))).rows] == \
        [make_job(n).id for n in (9, 3, 1)]
    assert q.db._read("SELECT count(*) AS n FROM job_labels")[0]["n"] == 5
    q.close()


def test_v21_counts_running_jobs_in_the_share_and_ends_the_ones_already_running(tmp_path: Path) -> None:
    """A v20 queue with a tenant's job running opened by this comfysup: that attempt expected nothing, so its end
    takes nothing back and charges what it executed; the claims after it hold their tenants' shares."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([records.replace(make_job(n), tenant="ab"[n % 2]) for n in range(6)], now=T0)
    running = q.leases.claim("r", "gpu0", 30, now=T0)
    q.close()
    _back_to(path, 20)
    q = SQLiteQueue(path, create=False)
    q.leases.complete(running, [], now=T0 + 20)
    shares = {r["name"]: (r["gpu_seconds"], r["running_seconds"], r["last_seconds"])
              for r in q.db._read("SELECT * FROM tenants WHERE name <> 'default'")}
    assert shares == {"a": (20.0, 0.0, 20.0), "b": (0.0, 0.0, 0.0)}
    served = [q.leases.claim(f"r{i}", "gpu0", 30, now=T0 + 20) for i in range(4)]
    assert [q.reads.get(c.id).tenant for c in served] == ["b", "b", "b", "a"]  # b at 0 s, a at 20
    held = {r["name"]: r["running_seconds"] for r in q.db._read("SELECT * FROM tenants WHERE name <> 'default'")}
    assert held == {"a": pytest.approx(20.0), "b": pytest.approx(0.003)}  # a's last took 20 s; b has none yet
    q.close()


WHOLE = Path(sqlite_file.__file__).parent / SQLiteDb.WHOLE_SCHEMA
WHOLE_HEADER = """\
-- The schema that every step of schema.sql makes, at the version this block is named for: a new SQLite queue is
-- made from it in one step (comfysup.queue.db.SQLDb.schema_steps); an older queue is brought forward by the steps.
-- Written from the steps, never by hand, after a step is added or changed:
--     COMFYSUP_WRITE_WHOLE_SCHEMA=1 .venv/bin/python -m pytest tests/integration/test_queue_sqlite.py -k made_whole
"""


def _dump(path: Path) -> list[str]:
    """The database as SQL (its schema and its rows, sqlite3's iterdump), without the dump's own transaction."""
    conn = sqlite3.connect(path)
    try:
        return [line for line in conn.iterdump() if line not in ("BEGIN TRANSACTION;", "COMMIT;")]
    finally:
        conn.close()


def test_a_new_queue_made_whole_is_the_queue_the_steps_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema, its rows and its version of a new queue made from comfysup/queue/schema_whole.sql are those of
    one made by every step of schema.sql; a step added without writing the file again fails here."""
    with monkeypatch.context() as patched:
        patched.setattr(SQLiteDb, "WHOLE_SCHEMA", "")
        SQLiteQueue(tmp_path / "steps.db").close()
    stepped = _dump(tmp_path / "steps.db")
    if os.environ.get("COMFYSUP_WRITE_WHOLE_SCHEMA"):
        WHOLE.write_text(f"{WHOLE_HEADER}-- name: v{SCHEMA_VERSION}\n" + "\n".join(stepped) + "\n", encoding="utf-8")
    assert queries.read(SQLiteDb.WHOLE_SCHEMA).keys() == {f"v{SCHEMA_VERSION}"}, \
        f"{WHOLE} is not this version's schema: write it again (its first lines say how)"
    SQLiteQueue(tmp_path / "whole.db").close()
    assert _dump(tmp_path / "whole.db") == stepped, f"{WHOLE} is not what the steps make: write it again"
    for name in ("steps.db", "whole.db"):
        conn = sqlite3.connect(tmp_path / name)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        conn.close()


UNDO = {
    21: "DROP TRIGGER attempts_ended_charge; DROP INDEX tenants_share; "
        "ALTER TABLE tenants DROP COLUMN running_seconds; ALTER TABLE tenants DROP COLUMN last_seconds; "
        "ALTER TABLE attempts DROP COLUMN expected_seconds; "
        "CREATE INDEX tenants_share ON tenants (gpu_seconds / weight, name); "
        "CREATE TRIGGER attempts_ended_charge AFTER UPDATE OF ended_at ON attempts "
        "WHEN old.ended_at IS NULL AND new.ended_at IS NOT NULL AND (EXISTS (SELECT 1 FROM tenants "
        "WHERE name < 'default') OR EXISTS (SELECT 1 FROM tenants WHERE name > 'default')) BEGIN "
        "UPDATE tenants SET gpu_seconds = gpu_seconds + max(0.0, coalesce(json_extract(new.trace, '$.run_s'), "
        "new.ended_at - new.started_at)), done = done + (new.outcome IS 'done') "
        "WHERE name = (SELECT tenant FROM jobs WHERE id = new.job_id); END",
    20: "DROP TRIGGER job_labels_insert; DROP TRIGGER job_labels_delete; DROP TABLE job_labels",
    19: "DROP INDEX jobs_tenant",
    18: "DROP TRIGGER attempts_ended_charge; DROP TABLE tenants; "
        "DROP INDEX jobs_tenant_ready; DROP INDEX jobs_tenant_affinity; DROP INDEX jobs_tenant_running; "
        "ALTER TABLE jobs DROP COLUMN tenant; ALTER TABLE api_assets DROP COLUMN tenant; DROP TABLE affinity_skips; "
        "CREATE TABLE affinity_skips (priority "
        "INTEGER NOT NULL, seq_bound INTEGER NOT NULL, at REAL NOT NULL, PRIMARY KEY (priority, seq_bound)) "
        "WITHOUT ROWID",
    17: "DROP INDEX jobs_workflow_name; DROP TABLE slot_orders",
    16: "DROP INDEX jobs_storing; ALTER TABLE jobs DROP COLUMN staged_at; ALTER TABLE jobs DROP COLUMN staged_in; "
        "ALTER TABLE jobs DROP COLUMN staged_bytes",
    15: "DROP TABLE output_assets; DROP TABLE job_previews",
    14: "ALTER TABLE jobs DROP COLUMN waiting_since",
    13: "DROP TABLE api_endpoints",
    12: "DROP TABLE api_assets",
    11: "DROP TABLE announcements",
    10: "DROP TABLE assets; DROP TABLE job_assets; DROP TABLE asset_chunks; DROP TABLE server_assets",
    9: "ALTER TABLE attempts DROP COLUMN url",
    8: "DROP TABLE catalogues; DROP TABLE server_catalogues; DROP TABLE job_refusals",
    7: "CREATE TRIGGER jobs_finished_insert AFTER INSERT ON jobs WHEN new.state IN ('done', 'dead', 'cancelled') "
       "BEGIN UPDATE finished_counts SET n = n + 1 WHERE state = new.state; END",
    6: "DROP TRIGGER IF EXISTS jobs_finished_insert; DROP TRIGGER IF EXISTS jobs_finished_into; "
       "DROP TRIGGER IF EXISTS jobs_finished_out_of; DROP TRIGGER IF EXISTS jobs_finished_delete; "
       "DROP TABLE finished_counts",
}
"""What each schema step from v6 on added, taken away again (v7 dropped a trigger: its undo puts it back)."""


def _back_to(path: Path, version: int) -> None:
    """The queue file as the comfysup of schema ``version`` left it: every later step undone, newest first."""
    assert set(UNDO) == set(range(6, SCHEMA_VERSION + 1)), "a new schema step needs its undo here"
    conn = sqlite3.connect(path)
    for step in range(SCHEMA_VERSION, version, -1):
        conn.executescript(UNDO[step])
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


def test_a_version_5_database_counts_its_finished_jobs_in_v6(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(n) for n in range(6)], now=T0)
    q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [], now=T0 + 1)
    q.leases.dead(q.leases.claim("r", "gpu0", 30, now=T0), "x", now=T0 + 1)
    q.intake.cancel([make_job(5).id], now=T0 + 2)
    q.leases.claim("r", "gpu0", 30, now=T0)
    q.close()
    _back_to(path, 5)  # as a queue made by the comfysup before this one left it
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.reads.status(now=T0 + 3).counts == {"queued": 2, "waiting": 0, "posted": 0, "running": 1, "storing": 0,
                                                 "done": 1, "dead": 1, "cancelled": 1}
    assert [j.state for j in q.reads.iter_jobs()].count("queued") == 2  # every job kept
    q.close()


def test_v7_drops_the_insert_trigger_and_counts_stay_right(tmp_path: Path) -> None:
    """A v6 queue (with the per-row insert trigger that made submit slow) opened by this comfysup: the
    trigger is gone, and the finished counts still follow every finish, removal and fresh submit."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(n) for n in range(4)], now=T0)
    q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [], now=T0 + 1)
    q.close()
    _back_to(path, 6)  # as the comfysup before this one left it, with the per-row insert trigger
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.db._read("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name = 'jobs_finished_insert'") == []
    q.intake.submit([make_job(n) for n in range(4, 8)], now=T0 + 2)
    q.leases.dead(q.leases.claim("r", "gpu0", 30, now=T0 + 2), "x", now=T0 + 3)
    q.intake.cancel([make_job(7).id], now=T0 + 4)
    assert q.reads.status(now=T0 + 5).counts == {"queued": 5, "waiting": 0, "posted": 0, "running": 0, "storing": 0,
                                                 "done": 1, "dead": 1, "cancelled": 1}
    q.close()


def test_v9_adds_the_attempts_server_url(tmp_path: Path) -> None:
    """A v8 queue opened by this comfysup: attempts gain the URL of their server, kept by
    record_prompt; earlier attempts have none."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1)], now=T0)
    old = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    q.close()
    _back_to(path, 8)
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.leases.attempt_urls(old.id) == []
    q.leases.record_prompt(old, "gpu0", 3, "http://10.0.0.1:8188")
    assert q.leases.attempt_urls(old.id) == [("http://10.0.0.1:8188", 3)]
    q.close()


def test_v12_adds_api_upload_records_and_keeps_the_inputs_jobs_have(tmp_path: Path) -> None:
    """A v11 queue opened by this comfysup: the upload records' table is added; the stored inputs and
    the jobs that need them are kept, and prune still keeps what a queued job needs."""
    from tests.queue_assets_contract import asset_file

    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    cat = asset_file(tmp_path, b"cat bytes")
    q.intake.submit([records.replace(make_job(1), assets=(cat,))], now=T0)
    q.close()
    _back_to(path, 11)
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.assets.prune_assets(now=T0 + 10**6) == (0, 0)
    assert q.assets.read_asset(cat.hash) == b"cat bytes"
    record, created_new = q.assets.add_api_asset(cat, "image/png", 3600.0, now=T0)
    assert not created_new and q.assets.api_asset(record.id) == record
    q.close()


def test_v13_adds_the_api_registry_and_keeps_the_jobs(tmp_path: Path) -> None:
    """A v12 queue opened by this comfysup: the registry of machines' APIs is added, the jobs stay."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1)], now=T0)
    q.close()
    _back_to(path, 12)
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.reads.get(make_job(1).id).state == "queued"
    q.endpoints.advertise_api("render-07", "http://10.0.0.7:9189", 100, now=T0)
    endpoint = q.endpoints.api_endpoint("render-07", now=T0 + 1)
    assert endpoint is not None and endpoint.url == "http://10.0.0.7:9189"
    q.close()


def test_v14_adds_when_a_running_job_began_to_wait_and_keeps_the_jobs(tmp_path: Path) -> None:
    """A v13 queue opened by this comfysup: a running job is shown running, as it was counted; one posted
    behind another from now on is shown posted."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1), make_job(2)], now=T0)
    running = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    q.close()
    _back_to(path, 13)
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert q.reads.states([running.id]) == {running.id: "running"}
    behind = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    q.leases.record_prompt(behind, "gpu0", 2, waiting=True)
    assert q.reads.status(now=T0 + 1).counts["posted"] == 1
    q.close()


def test_v15_gives_outputs_asset_ids_and_keeps_earlier_outputs(tmp_path: Path) -> None:
    """A v14 queue with a job done before: its output keeps no id (the API names it <job id>.<n>); a
    job done now gets an asset id per file, found by output_asset."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path)
    q.intake.submit([make_job(1), make_job(2)], now=T0)
    q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [Output("a.png", 1, "00")], now=T0 + 1)
    q.db.conn.execute("UPDATE jobs SET outputs = '[{\"name\": \"a.png\", \"size\": 1, \"sha256\": \"00\"}]'")
    q.db.conn.commit()
    q.close()
    _back_to(path, 14)
    q = SQLiteQueue(path, create=False)
    assert q.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [o.id for o in q.reads.get(make_job(1).id).outputs] == [""]
    q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [Output("b.png", 1, "00")], now=T0 + 2)
    (made,) = q.reads.get(make_job(2).id).outputs
    assert made.id and q.reads.output_asset(made.id) == (q.reads.get(make_job(2).id), 0)
    q.close()


def test_a_write_waits_for_the_lock_in_short_steps_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not SQLite's busy handler (sleeps of 1, 2, 5, 10, 15, 20, 25 ms): a runner that met another's short commit
    slept on long after the lock was free, while its server waited for the next prompt."""
    path = tmp_path / "q.db"
    q = SQLiteQueue(path, busy_timeout_seconds=30)
    q.intake.submit([make_job(1)], now=T0)
    holder = _hold_write_lock(path)
    steps: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        steps.append(seconds)
        if len(steps) == 8:
            holder.execute("ROLLBACK")  # the lock is let go while the write waits
        real_sleep(seconds)

    monkeypatch.setattr(sqlite_backend.time, "sleep", sleep)
    try:
        assert q.leases.claim("runner-a", "gpu0", 30, now=T0) is not None
    finally:
        holder.close()
    assert len(steps) == 8 and max(steps) <= sqlite_backend.BUSY_STEP_SECONDS, steps
    assert steps == sorted(steps)  # growing from BUSY_FIRST_STEP_SECONDS, capped
    assert q.db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000  # every other statement keeps it
    q.close()


def test_a_runner_s_commits_leave_the_checkpoint_to_a_thread_of_its_own(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_file, "BACKGROUND_CHECKPOINT_SECONDS", 0.02)
    path = tmp_path / "q.db"
    q = SQLiteQueue(path, checkpoint_seconds=3600)
    assert q.db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000  # SQLite's own, in line
    q.checkpoint_in_background()
    assert q.db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    before = path.stat().st_size
    q.intake.submit([make_job(i) for i in range(300)], now=T0)
    deadline = time.monotonic() + 20
    while path.stat().st_size <= before:  # the thread copies the WAL into the database file
        assert time.monotonic() < deadline, "no checkpoint came from the thread"
        time.sleep(0.01)
    q.db._conn.close()
    q.db._conn = None  # a reconnect (after a fork, say) keeps it off for this process's commits
    assert q.db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    thread = q.db._checkpointer.thread
    q.close()
    assert not thread.is_alive()


@pytest.mark.timeout(60)
def test_the_checkpoint_thread_is_woken_by_its_process_s_commits(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Not by the clock alone: after CHECKPOINT_COMMITS commits the thread checkpoints at once (here the clock
    never would: an hour), so a fast runner's WAL stays short while a slow one is checkpointed seldom."""
    monkeypatch.setattr(sqlite_file, "BACKGROUND_CHECKPOINT_SECONDS", 3600.0)
    monkeypatch.setattr(sqlite_file, "CHECKPOINT_COMMITS", 3)
    path = tmp_path / "q.db"
    q = SQLiteQueue(path, checkpoint_seconds=3600)
    q.checkpoint_in_background()
    before = path.stat().st_size
    for n in range(3):
        q.intake.submit([make_job(100 * n + i) for i in range(100)], now=T0)
    deadline = time.monotonic() + 20
    while path.stat().st_size <= before:  # the thread copied the WAL into the database file
        assert time.monotonic() < deadline, "three commits did not wake the checkpoint thread"
        time.sleep(0.01)
    thread = q.db._checkpointer.thread
    q.close()
    assert not thread.is_alive()  # a stop wakes it from its hour-long wait


def test_a_tenants_search_walks_its_index_without_sorting(tmp_path: Path) -> None:
    """A tenant's page is read from jobs_tenant in seq order (no scan of every job, no sort), first page and later."""
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([records.replace(make_job(n), tenant="acme" if n % 2 else "default") for n in range(6)],
                    now=T0)
    statements: list[str] = []
    q.db.conn.set_trace_callback(lambda sql: statements.append(sql) if "jobs.tenant =" in sql else None)
    first = q.search.search(JobSearch(tenant="acme", limit=2))
    q.search.search(JobSearch(tenant="acme", after=first.cursor, limit=2))
    q.db.conn.set_trace_callback(None)
    assert len(statements) == 2
    for sql in statements:
        plan = " ".join(r[3] for r in q.db.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING INDEX jobs_tenant (tenant=?" in plan and "TEMP B-TREE" not in plan, plan
    q.close()
