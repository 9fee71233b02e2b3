"""bench/console.py: the operator console's reads on a queue of a million jobs, and what live viewers cost.

- Builds a queue of ``--jobs`` jobs (default 1,000,000) in SQLite (a recursive CTE) and in PostgreSQL
  (``generate_series``), written with SQL directly: 70% done, 15% queued, 5% waiting to retry, 5% dead, 5%
  cancelled; ten workflow names and one rare one (a job in 10,000); a ``team`` label of twenty values; one job in
  ten is tenant ``studio-a``'s, the others ``default``'s.
- Times each read the console makes, ``--repeat`` times (p50 and p95, milliseconds): the overview (what the
  live stream reads each tick), a job's page, and searches: the newest page, a page deep in the list (by its
  cursor), one state's newest and deep pages, a workflow, the rare workflow, a label, a label no job has (the
  worst case: every row is looked at), an id prefix, an hour of submissions, the count a bulk retry
  confirms, and a tenant's newest and deep pages.
- Starts ``comfysup api`` on the SQLite million and holds ``--viewers`` overview streams open for
  ``--seconds``: the API process's CPU seconds per minute and its resident memory, against the same time with
  no viewer.

    .venv/bin/python bench/console.py                      # the figures in docs/console.md
    .venv/bin/python bench/console.py --jobs 100000 --seconds 20 --repeat 10   # a quick look
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import argparse
import asyncio
import json
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import psutil
import tomli_w

from comfysup.api.console_live import Hub
from comfysup.config import load_config
from comfysup.queue.search import JobSearch
from comfysup.queue.sqlite import SQLiteQueue

T_BASE = 1.7e9
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_DB = "comfysup_bench_console"
STATE = ("CASE WHEN i % 100 < 70 THEN 'done' WHEN i % 100 < 90 THEN 'queued' WHEN i % 100 < 95 THEN 'dead' "
         "ELSE 'cancelled' END")
FINISHED = "CASE WHEN i % 100 < 70 OR i % 100 >= 90 THEN {t} + i + 60 END"
STARTED = "CASE WHEN i % 100 < 70 OR i % 100 >= 85 THEN {t} + i + 1 END"
WORKFLOW_NAME = "CASE WHEN i % 10000 = 7 THEN 'rare' ELSE 'wf' || (i % 10) END"
TENANT = "CASE WHEN i % 10 = 3 THEN 'studio-a' ELSE 'default' END"
ATTEMPT = ("SELECT id, 1, 'host/1/' || server || '/t', server, started_at, coalesce(finished_at, started_at + 30), "
           "CASE state WHEN 'queued' THEN 'retry' ELSE state END, reason ")
REASON = "CASE WHEN i % 100 BETWEEN 90 AND 94 THEN 'gave up after 4 attempts, last: out of memory' END"


def build_sqlite(path: Path, rows: int) -> float:
    """The million in SQLite (see the module's docstring); seconds it took."""
    started = time.perf_counter()
    SQLiteQueue(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO workflows (id, hash, workflow) VALUES (1, 'bench', '{}')")
    t = str(T_BASE)
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
        "INSERT INTO jobs (seq, id, state, priority, run_after, attempt, server, started_at, submitted_at, "
        "finished_at, reason, spec_hash, workflow_name, tenant) "
        f"SELECT i + 1, printf('%08x-0000-4000-8000-%012x', i, i), {STATE}, i % 3, "
        "CASE WHEN i % 100 BETWEEN 85 AND 89 THEN 4e9 ELSE 0 END, CASE WHEN i % 100 BETWEEN 70 AND 84 THEN 0 "
        f"ELSE 1 END, 'gpu' || (i % 8), {STARTED.format(t=t)}, {t} + i, {FINISHED.format(t=t)}, {REASON}, "
        f"'h' || i, {WORKFLOW_NAME}, {TENANT} FROM n", (rows,))
    conn.execute("INSERT INTO job_specs (seq, workflow_id, extra_data, meta, params) "
                 "SELECT seq, 1, '{}', '{\"team\": \"t' || (seq % 20) || '\"}', '{}' FROM jobs")
    conn.execute("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome, reason) "
                 + ATTEMPT +
                 "FROM jobs WHERE attempt = 1")
    conn.execute("UPDATE finished_counts SET n = (SELECT count(*) FROM jobs WHERE jobs.state = finished_counts.state)")
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


def build_postgres(rows: int) -> tuple[str, float]:
    """The million in a fresh PostgreSQL database; its URL and the seconds it took."""
    import psycopg

    from comfysup.queue.postgres import PostgresQueue

    started = time.perf_counter()
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PG_DB}")
        admin.execute(f"CREATE DATABASE {PG_DB}")
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + PG_DB
    PostgresQueue(url).close()
    t = str(T_BASE)
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO workflows (id, hash, workflow) OVERRIDING SYSTEM VALUE VALUES (1, 'bench', '{}')")
        conn.execute(
            "INSERT INTO jobs (id, state, priority, run_after, attempt, server, started_at, submitted_at, "
            "finished_at, reason, spec_hash, workflow_name, workflow_id, meta, tenant) "
            f"SELECT lpad(to_hex(i), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(i), 12, '0'), {STATE}, i % 3, "
            "CASE WHEN i % 100 BETWEEN 85 AND 89 THEN 4e9 ELSE 0 END, CASE WHEN i % 100 BETWEEN 70 AND 84 "
            f"THEN 0 ELSE 1 END, 'gpu' || (i % 8), {STARTED.format(t=t)}, {t} + i, {FINISHED.format(t=t)}, "
            f"{REASON}, 'h' || i, {WORKFLOW_NAME}, 1, '{{\"team\": \"t' || (i % 20) || '\"}}', {TENANT} "
            f"FROM generate_series(0, {int(rows) - 1}) AS i ORDER BY i")  # no parameters: '%' is SQL's modulo
        conn.execute("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome, reason) "
                     + ATTEMPT +
                     "FROM jobs WHERE attempt = 1")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return url, time.perf_counter() - started


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    fn()  # warm the caches once: a console's reads are of a database in use
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return {"p50_ms": round(statistics.median(took), 2),
            "p95_ms": round(took[min(len(took) - 1, int(0.95 * len(took)))], 2)}


def config_for(tmp: Path, queue: dict[str, str]) -> Any:
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps({"queue": queue, "store": {"dir": str(tmp / "store")},
                                    "comfyui": {"gpus": "cpu:1"},
                                    "api": {"listen": f"127.0.0.1:{free_port()}"}}).encode())
    return load_config(str(path), env={})


def reads(queue: Any, config: Any, rows: int, repeat: int) -> dict[str, dict[str, float]]:
    """Each of the console's reads, timed (see the module's docstring)."""
    search = queue.search
    mid = rows // 2
    deep_dead = search.search(JobSearch(state="dead", after=(T_BASE + mid + 60, mid), limit=1)).rows[0]
    hub = Hub(None, queue, config)
    some = f"{mid:08x}-0000-4000-8000-{mid:012x}"
    cases: dict[str, Callable[[], Any]] = {
        "overview, whole (with the hour's charts)": lambda: Hub(None, queue, config).read(T_BASE + rows + 120),
        "overview, a live tick": lambda: hub.read(T_BASE + rows + 120),
        "a job's page": lambda: (queue.reads.get(some), queue.reads.queue_position(some)),
        "newest page": lambda: search.search(JobSearch()),
        "a page half-way down (cursor)": lambda: search.search(JobSearch(after=(mid,))),
        "state=dead, newest": lambda: search.search(JobSearch(state="dead")),
        "state=dead, half-way down": lambda: search.search(JobSearch(state="dead", after=(deep_dead.finished_at,
                                                                                            mid))),
        "state=queued, newest": lambda: search.search(JobSearch(state="queued")),
        "workflow=wf3": lambda: search.search(JobSearch(workflow="wf3")),
        "workflow=rare (1 in 10,000)": lambda: search.search(JobSearch(workflow="rare")),
        "label team=t7": lambda: search.search(JobSearch(labels=(("team", "t7"),))),
        "label no job has (every row read)": lambda: search.search(JobSearch(labels=(("team", "none"),))),
        "id prefix": lambda: search.search(JobSearch(id_prefix=some[:6])),
        "an hour of submissions, mid-list": lambda: search.search(JobSearch(since=T_BASE + mid, until=T_BASE + mid
                                                                            + 3600)),
        "count of dead (bulk retry's confirmation)": lambda: search.count(JobSearch(state="dead"), 10_000),
        "tenant=studio-a (1 in 10), newest": lambda: search.search(JobSearch(tenant="studio-a")),
        "tenant=studio-a, half-way down (cursor)": lambda: search.search(JobSearch(tenant="studio-a", after=(mid,))),
    }
    return {name: timed(fn, repeat) for name, fn in cases.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _view(url: str, stop: asyncio.Event, frames: list[int]) -> None:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(None)) as r:
        while not stop.is_set():
            line = await r.content.readline()
            if line.startswith(b"event: overview"):
                frames[0] += 1


async def _viewers(url: str, viewers: int, seconds: float) -> int:
    stop = asyncio.Event()
    frames = [0]
    tasks = [asyncio.create_task(_view(url, stop, frames)) for _ in range(viewers)]
    await asyncio.sleep(seconds)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return frames[0]


def viewers_cost(config: Any, viewers: int, seconds: float) -> dict[str, Any]:
    """``comfysup api`` on the queue: its CPU a minute and memory with no viewer, then with ``viewers``."""
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "api", "--existing-queue", "--config", config.source],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://{config.api.listen}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(tuple(config.api.listen.rsplit(":", 1)), timeout=1):  # type: ignore[arg-type]
                    break
            except OSError:
                time.sleep(0.2)
        time.sleep(3)  # past the API's own start (imports, the first look at the queue's file)
        api = psutil.Process(proc.pid)
        out: dict[str, Any] = {}
        for label, n in (("no viewer", 0), (f"{viewers} viewers", viewers)):
            cpu = sum(api.cpu_times()[:2])
            started = time.monotonic()
            frames = asyncio.run(_viewers(f"{base}/console/api/events", n, seconds)) if n else time.sleep(seconds)
            spent = sum(api.cpu_times()[:2]) - cpu
            minutes = (time.monotonic() - started) / 60
            out[label] = {"cpu_seconds_per_minute": round(spent / minutes, 2),
                          "rss_mb": round(api.memory_info().rss / 2**20, 1), "frames": frames or 0}
        return out
    finally:
        proc.terminate()
        proc.wait(20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30, help="times each read is timed")
    parser.add_argument("--viewers", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the viewers watch")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()

    report: dict[str, Any] = {"jobs": args.jobs}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        report["sqlite_build_seconds"] = round(build_sqlite(tmp / "queue.db", args.jobs), 1)
        config = config_for(tmp, {"path": str(tmp / "queue.db")})
        queue = SQLiteQueue(tmp / "queue.db")
        report["sqlite"] = reads(queue, config, args.jobs, args.repeat)
        queue.close()
        if not args.no_postgres:
            from comfysup.queue.postgres import PostgresQueue

            url, seconds = build_postgres(args.jobs)
            report["postgres_build_seconds"] = round(seconds, 1)
            queue = PostgresQueue(url)
            report["postgres"] = reads(queue, config, args.jobs, args.repeat)
            queue.close()
        report["live viewers (SQLite)"] = viewers_cost(config, args.viewers, args.seconds)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
