"""Queue benchmark: what comfysup's durability and fencing cost, against a plain loop and three peers.

Run: ``.venv/bin/python bench/queue.py`` (``--quick`` for a smaller run). Not a test: it prints
figures for docs/benchmarks.md and asserts only that no job was lost or handed out twice.

What it measures, and why:

- submit: N jobs of a 10 KB workflow through ``JobsFile`` (validate, then read again) and
  ``SQLiteQueue.submit``, exactly as ``comfysup submit`` does, at two sizes, with the peak memory of
  each run: it must not grow with the file.
- claim + complete per second, 1/2/4/8 processes, every claim and every complete its own durable
  transaction (WAL, synchronous=FULL), with and without a heartbeat every 100 ms. The baseline is a
  plain WAL + synchronous=FULL claim/complete loop on a minimal table, run alternately with comfysup
  in the same process tree, so the ratio compares like with like on a noisy machine.
- the same on huey's SqliteStorage, persist-queue's SQLiteAckQueue and litequeue when installed
  (``pip install -e '.[bench]'``), each counted for duplicates (a job handed out twice) and losses.
- ``comfysup status`` on a table of a million jobs (in process, and the whole command).
- PostgreSQL (``--only postgres``; the server at ``--postgres URL``, default 127.0.0.1:5432, in a
  database the benchmark creates and drops): claim + complete per second with 8 and 32 runner
  processes beside SQLite, and the time from submit to claim for an idle runner woken by
  LISTEN/NOTIFY against one that polls every 0.25 s (the runner's idle wait).
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# This file is named queue.py, and Python puts its folder first on sys.path: move it last, or every
# ``import queue`` (multiprocessing, psycopg under huey) would import this script instead. Last, the
# folder still gives bench/workload.py.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workload import pg_database, workflow_10kb

from comfysup.jobs import JobsFile
from comfysup.queue.base import NewJob
from comfysup.queue.sqlite import SQLiteQueue

CTX = multiprocessing.get_context("fork")
LEASE_SECONDS = 60.0
HEARTBEAT_SECONDS = 0.1
PEER_MIN_JOBS = 300
PEER_RUN_SECONDS = 8


# -- the workload -------------------------------------------------------------------------------------------

WORKFLOW = workflow_10kb()
WORKFLOW_JSON = json.dumps(WORKFLOW, sort_keys=True, separators=(",", ":"))


def job_ids(n: int) -> list[str]:
    return [str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{i}")) for i in range(n)]


def new_jobs(n: int) -> list[NewJob]:
    return [NewJob(id=i, workflow=WORKFLOW, spec_hash=i, workflow_json=WORKFLOW_JSON, workflow_name="bench")
            for i in job_ids(n)]


# -- claim + complete drivers ---------------------------------------------------------------------------------

@dataclass
class Report:
    claimed: list[str] = field(default_factory=list)
    completed: int = 0
    heartbeats: int = 0
    started: float = 0.0
    ended: float = 0.0
    cpu_seconds: float = 0.0
    written_bytes: int = 0


def _written_bytes() -> int:
    """Bytes this process passed to write() (/proc/self/io wchar): WAL frames and checkpoints alike."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return 0


class Driver:
    """One queue under test: fill it in the parent, drain it in forked workers."""

    name = ""
    heartbeat = True
    """False when the library has no lease to renew; its heartbeat rows are then skipped."""

    def available(self) -> str | None:
        """None when usable, else why not (a peer that is not installed)."""
        return None

    def fill(self, directory: Path, ids: list[str]) -> None:
        raise NotImplementedError

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        raise NotImplementedError

    def check(self, directory: Path, n: int) -> str:
        """Anything the queue's own records say is wrong after a drain ('' when fine)."""
        return ""


def _tick(last: float) -> bool:
    return time.monotonic() - last >= HEARTBEAT_SECONDS


class ComfysupDriver(Driver):
    name = "comfysup"

    def fill(self, directory: Path, ids: list[str]) -> None:
        q = SQLiteQueue(directory / "q.db")
        q.intake.submit(NewJob(id=i, workflow=WORKFLOW, spec_hash=i, workflow_json=WORKFLOW_JSON) for i in ids)
        q.close()

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        q = SQLiteQueue(directory / "q.db", create=False)
        last = time.monotonic()
        report.started = time.time()
        while (claim := q.leases.claim(owner, "bench", LEASE_SECONDS)) is not None:
            report.claimed.append(claim.id)
            if heartbeat and _tick(last):
                q.leases.heartbeat(claim, LEASE_SECONDS)
                report.heartbeats += 1
                last = time.monotonic()
            q.leases.complete(claim, [])
            report.completed += 1
        report.ended = time.time()
        q.close()

    def check(self, directory: Path, n: int) -> str:
        conn = sqlite3.connect(directory / "q.db")
        done = conn.execute("SELECT count(*) FROM jobs WHERE state = 'done'").fetchone()[0]
        attempts = conn.execute("SELECT count(*) FROM attempts").fetchone()[0]
        conn.close()
        return "" if done == attempts == n else f"{done} done, {attempts} attempts of {n}"


class PlainDriver(Driver):
    """The floor: the least a durable claim/complete can do on SQLite (WAL, FULL, BEGIN IMMEDIATE).

    A minimal table of (id, state, owner, lease) with one partial index; the claim also reads the
    10 KB workflow, from a table of its own, since a claim that did not hand the job out would not be
    comparable. ``payload_in_row`` keeps it in the claimed row instead, which every update rewrites.
    """

    name = "plain loop"

    def __init__(self, payload_in_row: bool = False) -> None:
        self.payload_in_row = payload_in_row
        if payload_in_row:
            self.name = "plain, payload in row"

    @staticmethod
    def connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    def fill(self, directory: Path, ids: list[str]) -> None:
        conn = self.connect(directory / "plain.db")
        conn.execute("CREATE TABLE q (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, state INTEGER NOT NULL DEFAULT 0, "
                     "owner TEXT, lease_until REAL, payload TEXT)")
        conn.execute("CREATE TABLE payloads (seq INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        conn.execute("CREATE INDEX q_ready ON q (seq) WHERE state = 0")
        conn.execute("BEGIN IMMEDIATE")
        if self.payload_in_row:
            conn.executemany("INSERT INTO q (id, payload) VALUES (?, ?)", ((i, WORKFLOW_JSON) for i in ids))
        else:
            conn.executemany("INSERT INTO q (seq, id) VALUES (?, ?)", enumerate(ids, start=1))
            conn.executemany("INSERT INTO payloads (seq, payload) VALUES (?, ?)",
                             ((n, WORKFLOW_JSON) for n in range(1, len(ids) + 1)))
        conn.execute("COMMIT")
        conn.close()

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        conn = self.connect(directory / "plain.db")
        last = time.monotonic()
        report.started = time.time()
        while True:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("UPDATE q SET state = 1, owner = ?, lease_until = ? WHERE seq = "
                               "(SELECT seq FROM q WHERE state = 0 ORDER BY seq LIMIT 1) RETURNING seq, id, payload",
                               (owner, time.time() + LEASE_SECONDS)).fetchone()
            if row is not None and not self.payload_in_row:
                conn.execute("SELECT payload FROM payloads WHERE seq = ?", (row[0],)).fetchone()
            conn.execute("COMMIT")
            if row is None:
                break
            report.claimed.append(row[1])
            if heartbeat and _tick(last):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE q SET lease_until = ? WHERE seq = ? AND owner = ? AND state = 1",
                             (time.time() + LEASE_SECONDS, row[0], owner))
                conn.execute("COMMIT")
                report.heartbeats += 1
                last = time.monotonic()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE q SET state = 2 WHERE seq = ? AND owner = ? AND state = 1", (row[0], owner))
            conn.execute("COMMIT")
            report.completed += 1
        report.ended = time.time()
        conn.close()


class HueyDriver(Driver):
    """huey's SqliteStorage: dequeue deletes the task (no lease); complete stores its result, as huey does."""

    name = "huey SqliteStorage"
    heartbeat = False

    def available(self) -> str | None:
        try:
            import huey.storage  # noqa: F401
        except ImportError:
            return "not installed (pip install huey)"
        return None

    @staticmethod
    def storage(directory: Path) -> Any:
        from huey.storage import SqliteStorage

        return SqliteStorage(name="bench", filename=str(directory / "huey.db"), fsync=True, timeout=60)

    def fill(self, directory: Path, ids: list[str]) -> None:
        s = self.storage(directory)
        for i in ids:
            s.enqueue(f"{i}\n{WORKFLOW_JSON}".encode())
        s.close()

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        s = self.storage(directory)
        report.started = time.time()
        while (data := s.dequeue()) is not None:
            job = bytes(data).split(b"\n", 1)[0].decode()
            report.claimed.append(job)
            s.put_data(job, b"done")
            report.completed += 1
        report.ended = time.time()
        s.close()


class PersistQueueDriver(Driver):
    """persist-queue's SQLiteAckQueue: get marks the row unacked, ack marks it done."""

    name = "persist-queue SQLiteAckQueue"
    heartbeat = False

    def available(self) -> str | None:
        try:
            import persistqueue  # noqa: F401
        except ImportError:
            return "not installed (pip install persist-queue)"
        return None

    @staticmethod
    def queue(directory: Path) -> Any:
        from persistqueue import SQLiteAckQueue

        # auto_resume=False: each worker opening the queue would otherwise re-ready every unacked row.
        return SQLiteAckQueue(str(directory / "pq"), auto_resume=False, multithreading=True, timeout=60)

    def fill(self, directory: Path, ids: list[str]) -> None:
        q = self.queue(directory)
        for i in ids:
            q.put({"id": i, "workflow": WORKFLOW_JSON})

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        from persistqueue import Empty

        q = self.queue(directory)
        report.started = time.time()
        while True:
            try:
                item = q.get(block=False, raw=True)
            except Empty:
                break
            report.claimed.append(item["data"]["id"])
            q.ack(id=item["pqid"])
            report.completed += 1
        report.ended = time.time()


class LiteQueueDriver(Driver):
    """litequeue: pop locks a message (with its lock time, the lease), done marks it done."""

    name = "litequeue"
    heartbeat = False

    def available(self) -> str | None:
        try:
            import litequeue  # noqa: F401
        except ImportError:
            return "not installed (pip install litequeue)"
        return None

    @staticmethod
    def queue(directory: Path) -> Any:
        from litequeue import LiteQueue

        q = LiteQueue(str(directory / "lite.db"), timeout=60)
        q.conn.execute("PRAGMA synchronous = FULL")  # litequeue sets NORMAL; compare durable with durable
        return q

    def fill(self, directory: Path, ids: list[str]) -> None:
        q = self.queue(directory)
        q.conn.execute("BEGIN IMMEDIATE")
        for i in ids:
            q.put(f"{i}\n{WORKFLOW_JSON}")
        q.conn.execute("COMMIT")
        q.close()

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        q = self.queue(directory)
        report.started = time.time()
        while (message := q.pop()) is not None:
            report.claimed.append(message.data.split("\n", 1)[0])
            q.done(message.message_id)
            report.completed += 1
        report.ended = time.time()
        q.close()


def _worker(driver: Driver, directory: str, owner: str, heartbeat: bool, barrier: Any, out: str) -> None:
    report = Report()
    barrier.wait()
    cpu, written = time.process_time(), _written_bytes()
    driver.drain(Path(directory), owner, heartbeat, report)
    report.cpu_seconds, report.written_bytes = time.process_time() - cpu, _written_bytes() - written
    Path(out).write_text(json.dumps(report.__dict__))


@dataclass
class Drain:
    jobs_per_second: float
    duplicates: int
    lost: int
    heartbeats: int
    problem: str
    cpu_us_per_job: float = 0.0
    """CPU time of the workers (user + system, fsync's share included) per job: steadier than jobs/s on a
    busy machine."""
    written_kib_per_job: float = 0.0


def drain(driver: Driver, workdir: Path, n: int, processes: int, heartbeat: bool) -> Drain:
    directory = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    ids = job_ids(n)
    driver.fill(directory, ids)
    barrier = CTX.Barrier(processes)
    procs = []
    for p in range(processes):
        out = directory / f"report-{p}.json"
        proc = CTX.Process(target=_worker, args=(driver, str(directory), f"bench-{p}", heartbeat, barrier, str(out)))
        proc.start()
        procs.append((proc, out))
    reports = []
    for proc, out in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"{driver.name}: a worker exited with {proc.exitcode}")
        reports.append(Report(**json.loads(out.read_text())))
    claimed = [c for r in reports for c in r.claimed]
    seconds = max(r.ended for r in reports) - min(r.started for r in reports)
    result = Drain(jobs_per_second=n / seconds, duplicates=len(claimed) - len(set(claimed)),
                   lost=len(set(ids) - set(claimed)), heartbeats=sum(r.heartbeats for r in reports),
                   problem=driver.check(directory, n),
                   cpu_us_per_job=sum(r.cpu_seconds for r in reports) / n * 1e6,
                   written_kib_per_job=sum(r.written_bytes for r in reports) / n / 1024)
    shutil.rmtree(directory)
    return result


# -- submit ---------------------------------------------------------------------------------------------------

def _submit_child(directory: str, lines: int, out: str) -> None:
    base = Path(directory)
    jobs = JobsFile(base / "jobs.jsonl")
    started = time.perf_counter()
    checked = jobs.validate()
    validated = time.perf_counter()
    assert checked.ok, checked.problems[:3]
    q = SQLiteQueue(base / "q.db")
    result = q.intake.submit(jobs.jobs())
    q.close()
    done = time.perf_counter()
    assert result.inserted == lines
    Path(out).write_text(json.dumps({
        "validate_s": validated - started, "insert_s": done - validated, "total_s": done - started,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "db_mb": (base / "q.db").stat().st_size / 2**20}))


def submit(workdir: Path, lines: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="submit-", dir=workdir))
    (directory / "workflow.json").write_text(json.dumps(WORKFLOW, indent=1))
    with open(directory / "jobs.jsonl", "w") as f:
        for n, i in enumerate(job_ids(lines)):
            f.write(json.dumps({"id": i, "workflow": "workflow.json", "set": {"3.seed": n, "9.filename_prefix": i},
                                "meta": {"n": n}}) + "\n")
    out = directory / "result.json"
    proc = CTX.Process(target=_submit_child, args=(str(directory), lines, str(out)))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"submit of {lines} lines failed")
    result = json.loads(out.read_text())
    shutil.rmtree(directory)
    return result


# -- status on a big table --------------------------------------------------------------------------------------

def big_table(path: Path, rows: int) -> None:
    """``rows`` jobs in every state (70% done, 15% queued, 5% waiting, 5% dead, 5% cancelled, 8 running),
    written with SQL directly: going through submit would take minutes and test submit, not status."""
    SQLiteQueue(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
        "INSERT INTO jobs (id, state, priority, run_after, attempt, owner, server, lease_until, started_at, "
        "submitted_at, finished_at, reason, spec_hash) "
        "SELECT printf('%08x-0000-4000-8000-%012x', i, i), "
        "CASE WHEN i < 8 THEN 'running' WHEN i % 100 < 70 THEN 'done' WHEN i % 100 < 90 THEN 'queued' "
        "     WHEN i % 100 < 95 THEN 'dead' ELSE 'cancelled' END, "
        "i % 3, CASE WHEN i % 100 BETWEEN 85 AND 89 THEN 4e9 ELSE 0 END, 1, "
        "CASE WHEN i < 8 THEN 'runner-' || i END, CASE WHEN i < 8 THEN 'gpu' || i END, "
        "CASE WHEN i < 8 THEN 4e9 END, 1.7e9 + i, 1.7e9 + i, "
        "CASE WHEN i >= 8 AND (i % 100 < 70 OR i % 100 >= 90) THEN 1.7e9 + i + 60 END, "
        "CASE WHEN i >= 8 AND i % 100 BETWEEN 90 AND 94 THEN 'gave up after 4 attempts, last: out of memory' END, "
        "'h' || i FROM n", (rows,))
    conn.execute("INSERT INTO workflows (id, hash, workflow) VALUES (1, 'bench', '{}')")  # schema v5: shared
    conn.execute("INSERT INTO job_specs (seq, workflow_id) SELECT seq, 1 FROM jobs")
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def status_times(workdir: Path, rows: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="status-", dir=workdir))
    path = directory / "var" / "queue.db"
    path.parent.mkdir()
    built = time.perf_counter()
    big_table(path, rows)
    built = time.perf_counter() - built
    (directory / "config.toml").write_text('[queue]\npath = "var/queue.db"\n')
    out: dict[str, float] = {"build_s": built}
    times = []
    for _ in range(5):
        started = time.perf_counter()
        q = SQLiteQueue(path, create=False)
        status = q.reads.status()
        q.close()
        times.append(time.perf_counter() - started)
    assert status.counts["running"] == 8 and sum(status.counts.values()) == rows, status.counts
    out["status_in_process_first_s"], out["status_in_process_median_s"] = times[0], statistics.median(times)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")} | {"PYTHONPATH": str(REPO)}
    for flag in ("", "--json"):
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "comfysup", "status", "--config", str(directory / "config.toml"),
                            *([flag] if flag else [])], env=env, check=True, capture_output=True)
            runs.append(time.perf_counter() - started)
        out[f"command{flag.replace('--', '_')}_s"] = statistics.median(runs)
    q = SQLiteQueue(path, create=False)
    started = time.perf_counter()
    for _ in range(200):
        claim = q.leases.claim("bench", "gpu9", LEASE_SECONDS)
        assert claim is not None
        q.leases.complete(claim, [])
    out["claim_complete_on_big_table_per_s"] = 200 / (time.perf_counter() - started)
    q.close()
    shutil.rmtree(directory)
    return out


# -- PostgreSQL ---------------------------------------------------------------------------------------------------

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
POLL_SECONDS = 0.25
"""What an idle runner waits between claims without NOTIFY (comfysup.runner.loop: min(poll_seconds, 0.25))."""


class PostgresDriver(Driver):
    """comfysup's PostgreSQL queue: the same claim + complete loop as ComfysupDriver, in the database ``url``."""

    name = "comfysup PostgreSQL"

    def __init__(self, url: str) -> None:
        self.url = url

    def fill(self, directory: Path, ids: list[str]) -> None:
        import psycopg

        from comfysup.queue.postgres import PostgresQueue

        PostgresQueue(self.url).close()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("TRUNCATE jobs, attempts, machines RESTART IDENTITY")
            conn.execute("VACUUM ANALYZE jobs")
        q = PostgresQueue(self.url)
        q.intake.submit(NewJob(id=i, workflow=WORKFLOW, spec_hash=i, workflow_json=WORKFLOW_JSON) for i in ids)
        q.close()

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Report) -> None:
        from comfysup.queue.postgres import PostgresQueue

        q = PostgresQueue(self.url)
        last = time.monotonic()
        report.started = time.time()
        while (claim := q.leases.claim(owner, "bench", LEASE_SECONDS)) is not None:
            report.claimed.append(claim.id)
            if heartbeat and _tick(last):
                q.leases.heartbeat(claim, LEASE_SECONDS)
                report.heartbeats += 1
                last = time.monotonic()
            q.leases.complete(claim, [])
            report.completed += 1
        report.ended = time.time()
        q.close()

    def check(self, directory: Path, n: int) -> str:
        import psycopg

        with psycopg.connect(self.url) as conn:
            done = conn.execute("SELECT count(*) FROM jobs WHERE state = 'done'").fetchone()[0]
            attempts = conn.execute("SELECT count(*) FROM attempts").fetchone()[0]
        return "" if done == attempts == n else f"{done} done, {attempts} attempts of {n}"


def _idle_runner(open_queue: Any, how: str, jobs: int, ready: Any) -> None:
    """Claim ``jobs`` jobs one by one, waiting between claims as an idle runner does: ``notify`` with
    wait_for_work (LISTEN on PostgreSQL), ``poll`` with a plain sleep of POLL_SECONDS."""
    q = open_queue()
    if how == "notify":
        q.wait_for_work(0)  # LISTEN from here on, as a runner that has been idle for a while
    ready.set()
    taken = 0
    while taken < jobs:
        claim = q.leases.claim("bench-idle", "bench", LEASE_SECONDS)
        if claim is None:
            if how == "notify":
                q.wait_for_work(POLL_SECONDS)
            else:
                time.sleep(POLL_SECONDS)
            continue
        q.leases.complete(claim, [])
        taken += 1
    q.close()


def submit_to_claim(open_queue: Any, how: str, jobs: int) -> list[float]:
    """Seconds from each submit to its claim (both stamped by the queue's clock) for an idle runner: each
    job is submitted a random 50-300 ms after the previous one was done, so the runner is waiting."""
    import random

    q = open_queue()
    ready = CTX.Event()
    proc = CTX.Process(target=_idle_runner, args=(open_queue, how, jobs, ready))
    proc.start()
    ready.wait(30)
    rng = random.Random(7)
    ids = [str(uuid.uuid4()) for _ in range(jobs)]
    for job_id in ids:
        time.sleep(rng.uniform(0.05, 0.3))
        q.intake.submit([NewJob(id=job_id, workflow=WORKFLOW, spec_hash=job_id, workflow_json=WORKFLOW_JSON)])
        deadline = time.monotonic() + 10
        while q.reads.get(job_id).state != "done":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{how}: job {job_id} not done after 10 s")
            time.sleep(0.002)
    proc.join(30)
    waits = [j.attempts[0].started_at - j.submitted_at for j in q.reads.get_many(ids)]
    q.close()
    return waits


def run_postgres(workdir: Path, admin_url: str, n: int, repeats: int, latency_jobs: int) -> None:
    try:
        import psycopg

        with psycopg.connect(admin_url, connect_timeout=5) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
    except Exception as exc:  # the section is skipped, the rest of the benchmark still runs
        print(f"\n## PostgreSQL: skipped ({str(exc).strip().splitlines()[0]})")
        return
    url, _name, drop = pg_database(admin_url)
    try:
        with psycopg.connect(url) as conn:
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
            fsync = conn.execute("SHOW fsync").fetchone()[0]
        pg = PostgresDriver(url)
        print(f"\n## PostgreSQL {version} (local, fsync={fsync}, synchronous_commit={sync}): claim + complete, "
              f"{n:,} jobs, median of {repeats} alternating run(s); jobs/s")
        print(f"{'procs':>5} {'SQLite':>9} {'PostgreSQL':>11} {'PG/SQLite':>9}")
        sqlite = ComfysupDriver()
        problems = []
        for processes in (1, 8, 32):
            runs: dict[str, list[Drain]] = {"sqlite": [], "pg": []}
            for _ in range(repeats):
                runs["sqlite"].append(drain(sqlite, workdir, n, processes, False))
                runs["pg"].append(drain(pg, workdir, n, processes, False))
            for name, rs in runs.items():
                problems += [f"{name} {processes}p: {r.duplicates} dup, {r.lost} lost {r.problem}"
                             for r in rs if r.duplicates or r.lost or r.problem]
            s_ = statistics.median(r.jobs_per_second for r in runs["sqlite"])
            p_ = statistics.median(r.jobs_per_second for r in runs["pg"])
            print(f"{processes:>5} {fmt(s_):>9} {fmt(p_):>11} {p_ / s_:>9.2f}", flush=True)
        if problems:
            print("PROBLEMS (a job handed out twice or lost):")
            for line in problems:
                print("  " + line)

        from comfysup.queue.postgres import PostgresQueue

        sqlite_path = workdir / "latency.db"
        print(f"\n## submit to claim, one idle runner, {latency_jobs} jobs each submitted 50-300 ms after the "
              "previous one was done; ms")
        print(f"{'queue':>12} {'idle wait':>24} {'median':>7} {'p90':>7} {'max':>7}")
        cases = [("PostgreSQL", "LISTEN/NOTIFY", lambda: PostgresQueue(url), "notify"),
                 ("PostgreSQL", f"poll every {POLL_SECONDS:g} s", lambda: PostgresQueue(url), "poll"),
                 ("SQLite", f"poll every {POLL_SECONDS:g} s", lambda: SQLiteQueue(sqlite_path), "poll")]
        for queue_name, wait_name, opener, how in cases:
            waits = sorted(w * 1000 for w in submit_to_claim(opener, how, latency_jobs))
            p90 = waits[min(len(waits) - 1, int(len(waits) * 0.9))]
            print(f"{queue_name:>12} {wait_name:>24} {statistics.median(waits):>7.1f} {p90:>7.1f} {waits[-1]:>7.1f}",
                  flush=True)
    finally:
        drop()


# -- main -------------------------------------------------------------------------------------------------------

def fmt(x: float) -> str:
    return f"{x:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition (about a minute)")
    parser.add_argument("--dir", help="where the databases go (default: a temporary folder under ./var); use "
                        "the disk the queue will live on")
    parser.add_argument("--only", choices=["submit", "drain", "status", "postgres"], action="append",
                        help="run only these parts (repeatable)")
    parser.add_argument("--postgres", default=ADMIN_URL, metavar="URL",
                        help=f"a PostgreSQL server where this user may create a database (default {ADMIN_URL})")
    args = parser.parse_args()
    quick = args.quick
    parts = set(args.only or ["submit", "drain", "status", "postgres"])
    drain_jobs = 1000 if quick else 4000
    repeats = 1 if quick else 3
    submit_sizes = (2_000, 20_000) if quick else (10_000, 100_000)
    status_rows = 200_000 if quick else 1_000_000
    base = Path(args.dir) if args.dir else REPO / "var"
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-queue-", dir=base))
    print(f"# comfysup queue benchmark{' (--quick)' if quick else ''}")
    print(f"python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
          f"databases in {workdir}")
    print(f"workflow {len(WORKFLOW_JSON):,} bytes; every claim and complete is its own transaction, WAL, "
          "synchronous=FULL")
    try:
        if "submit" in parts:
            print("\n## submit (JobsFile validate + read again + SQLiteQueue.submit, as `comfysup submit`)")
            print(f"{'lines':>8} {'validate s':>11} {'insert s':>9} {'total s':>8} {'jobs/s':>8} {'peak RSS MB':>12}"
                  f" {'db MB':>7}")
            for lines in submit_sizes:
                r = submit(workdir, lines)
                print(f"{lines:>8,} {r['validate_s']:>11.1f} {r['insert_s']:>9.1f} {r['total_s']:>8.1f} "
                      f"{fmt(lines / r['total_s']):>8} {r['max_rss_mb']:>12.0f} {r['db_mb']:>7.0f}")
        if "drain" in parts:
            run_drains(workdir, drain_jobs, repeats)
        if "postgres" in parts:
            run_postgres(workdir, args.postgres, drain_jobs, repeats, 20 if quick else 40)
        if "status" in parts:
            print(f"\n## status on {status_rows:,} jobs")
            r = status_times(workdir, status_rows)
            print(f"table built in {r['build_s']:.1f} s (SQL, not submit)")
            print(f"SQLiteQueue.status(): first {r['status_in_process_first_s'] * 1000:.0f} ms, "
                  f"median of 5 {r['status_in_process_median_s'] * 1000:.0f} ms")
            print(f"`comfysup status` (whole command, with Python start-up): {r['command_s'] * 1000:.0f} ms; "
                  f"`--json`: {r['command_json_s'] * 1000:.0f} ms")
            print(f"claim + complete on that table, 1 process: {fmt(r['claim_complete_on_big_table_per_s'])}/s")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def run_drains(workdir: Path, n: int, repeats: int) -> None:
    plain, ours = PlainDriver(), ComfysupDriver()
    peers: list[Driver] = [HueyDriver(), PersistQueueDriver(), LiteQueueDriver()]
    print(f"\n## claim + complete, {n:,} jobs, median of {repeats} alternating run(s); jobs/s")
    for peer in peers:
        why = peer.available()
        if why:
            print(f"note: {peer.name} skipped: {why}")
    peers = [p for p in peers if p.available() is None]
    # A peer much slower than comfysup would take minutes per run at n jobs: it gets as many as it
    # drains in about PEER_RUN_SECONDS at one process (at least PEER_MIN_JOBS), said below the table.
    peer_jobs: dict[str, int] = {}
    for peer in peers:
        rate = drain(peer, workdir, PEER_MIN_JOBS, 1, False).jobs_per_second
        peer_jobs[peer.name] = min(n, max(PEER_MIN_JOBS, int(rate * PEER_RUN_SECONDS)))
    header = f"{'procs':>5} {'heartbeat':>9} {'plain loop':>10} {'comfysup':>9} {'ratio':>6}"
    for peer in peers:
        header += f" | {peer.name[:22]:>22} {'dup':>4} {'lost':>4} {'us/them':>7}"
    print(header)
    problems: list[str] = []
    costs: dict[str, Drain] = {}
    for heartbeat in (False, True):
        for processes in (1, 2, 4, 8):
            runs: dict[str, list[Drain]] = {"plain": [], "ours": []}
            for _ in range(repeats):  # alternate, so drift in the machine's load hits both alike
                runs["plain"].append(drain(plain, workdir, n, processes, heartbeat))
                runs["ours"].append(drain(ours, workdir, n, processes, heartbeat))
            if processes == 1 and not heartbeat:
                costs[plain.name] = min(runs["plain"], key=lambda r: r.cpu_us_per_job)
                costs[ours.name] = min(runs["ours"], key=lambda r: r.cpu_us_per_job)
            p = statistics.median(r.jobs_per_second for r in runs["plain"])
            o = statistics.median(r.jobs_per_second for r in runs["ours"])
            for name, rs in runs.items():
                for r in rs:
                    if r.duplicates or r.lost or r.problem:
                        problems.append(f"{name} {processes}p: {r.duplicates} dup, {r.lost} lost {r.problem}")
            row = f"{processes:>5} {'100 ms' if heartbeat else 'no':>9} {fmt(p):>10} {fmt(o):>9} {o / p:>6.2f}"
            for peer in peers:
                if heartbeat and not peer.heartbeat:
                    row += f" | {'(no lease to renew)':>22} {'':>4} {'':>4} {'':>7}"
                    continue
                r = drain(peer, workdir, peer_jobs[peer.name], processes, False)
                if processes == 1:
                    costs[peer.name] = r
                row += f" | {fmt(r.jobs_per_second):>22} {r.duplicates:>4} {r.lost:>4} {o / r.jobs_per_second:>7.2f}"
            print(row, flush=True)
    print("\nper job at 1 process, no heartbeat (least CPU of the runs): CPU us (user + system), KiB written "
          "(WAL and checkpoints)")
    for name, r in costs.items():
        print(f"  {name:30} {r.cpu_us_per_job:7,.0f} us  {r.written_kib_per_job:6.1f} KiB")
    for peer in peers:
        if peer_jobs[peer.name] < n:
            print(f"note: {peer.name} drained {peer_jobs[peer.name]:,} jobs a run (about {PEER_RUN_SECONDS} s at "
                  "one process), not " + f"{n:,}")
    if problems:
        print("PROBLEMS (comfysup or the plain loop handed a job out twice or lost one):")
        for line in problems:
            print("  " + line)


if __name__ == "__main__":
    raise SystemExit(main())
