"""bench/scale.py: what the queue costs as it grows, in one run.

- claim, heartbeat, complete and complete_and_claim, each its own transaction as a runner makes it, on a
  queue of 1,000 jobs and on one of 1,000,000 (70% done, 15% queued over three priorities, 5% waiting to
  retry, 5% dead, 5% cancelled, every started job with its attempt row), measured alternately in rounds
  so drift in the machine's load hits both alike: the median wall and CPU time of each, and the ratio
  big/small (goal: at most 1.3);
- ``comfysup status`` on the million (goal: under 200 ms), in process and as the whole command;
- submit of 100,000 lines of one 10 KB workflow with different ``set`` values, through JobsFile and
  SQLiteQueue.submit as ``comfysup submit`` does (goal: under 10 s), and the database's size per job
  after it (goal: under 1 KB, each distinct workflow stored once);
- prune of 100,000 of the million's finished jobs in batches of 500, while a runner process claims and
  completes jobs: the runner's worst and 99th-percentile transaction time before and during the prune.

    .venv/bin/python bench/scale.py              # the figures in docs/benchmarks.md
    .venv/bin/python bench/scale.py --quick      # 100,000 jobs instead of a million, 20,000 lines, 20,000 pruned
    .venv/bin/python bench/scale.py --only fleet --backend postgres --own-postgres --procs 64 \
        --slots 1024,4096,8192 --job-s 5         # the fleet on a 16-core machine, a PostgreSQL of its own
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it: this
# folder goes last on sys.path, where it still gives bench/workload.py.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import contextlib
import gc
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from own_postgres import own_postgres
from workload import workflow_10kb

from comfysup.jobs import JobsFile
from comfysup.queue.sqlite import SQLiteQueue

CTX = multiprocessing.get_context("fork")
LEASE = 60.0
T_BASE = 1.7e9


WORKFLOW = workflow_10kb()


# -- a big queue, written with SQL ---------------------------------------------------------------------------

def build(path: Path, rows: int) -> float:
    """``rows`` jobs of one stored 10 KB workflow, in every state, each started one with its attempt row.
    Written with SQL directly: going through submit and runners would take hours and measure them, not
    the table. Returns the seconds it took."""
    started = time.perf_counter()
    SQLiteQueue(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    text = json.dumps(WORKFLOW, sort_keys=True, separators=(",", ":"))
    conn.execute("INSERT INTO workflows (id, hash, workflow) VALUES (1, 'bench', ?)", (text,))
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
        "INSERT INTO jobs (seq, id, state, priority, run_after, attempt, owner, server, lease_until, started_at, "
        "submitted_at, finished_at, reason, spec_hash, workflow_name, outputs, machine) "
        "SELECT i + 1, printf('%08x-0000-4000-8000-%012x', i, i), "
        "CASE WHEN i % 100 < 70 THEN 'done' WHEN i % 100 < 90 THEN 'queued' "
        "     WHEN i % 100 < 95 THEN 'dead' ELSE 'cancelled' END, "
        "i % 3, CASE WHEN i % 100 BETWEEN 85 AND 89 THEN 4e9 ELSE 0 END, "
        "CASE WHEN i % 100 BETWEEN 70 AND 84 THEN 0 ELSE 1 END, NULL, "
        "CASE WHEN i % 100 < 70 OR i % 100 >= 85 THEN 'gpu' || (i % 8) END, NULL, "
        "CASE WHEN i % 100 < 70 OR i % 100 >= 85 THEN ?2 + i END, ?2 + i, "
        "CASE WHEN i % 100 < 70 OR i % 100 >= 90 THEN ?2 + i + 60 END, "
        "CASE WHEN i % 100 BETWEEN 90 AND 94 THEN 'gave up after 4 attempts, last: out of memory' END, "
        "'h' || i, 'bench', "
        "CASE WHEN i % 100 < 70 THEN '[{\"name\":\"bench_00001_.png\",\"size\":1234567,\"sha256\":\"' || "
        "     printf('%064x', i) || '\",\"path\":\"\"}]' END, "
        "CASE WHEN i % 100 < 70 THEN 'host' END FROM n", (rows, T_BASE))
    conn.execute("INSERT INTO job_specs (seq, workflow_id, extra_data, meta, params) "
                 "SELECT seq, 1, '{}', '{}', '{\"3.seed\":' || seq || '}' FROM jobs")
    conn.execute("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome, reason, "
                 "prompt_number) SELECT id, 1, 'host/1/' || server || '/t', server, started_at, finished_at, "
                 "CASE state WHEN 'done' THEN 'done' WHEN 'dead' THEN 'dead' WHEN 'cancelled' THEN 'cancelled' "
                 "ELSE 'retry' END, reason, seq FROM jobs WHERE attempt = 1")
    # comfysup counts a job as it finishes, never on insert (schema v7): rows inserted finished are counted here.
    conn.execute("UPDATE finished_counts SET n = (SELECT count(*) FROM jobs WHERE jobs.state = finished_counts.state)")
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


# -- per-operation cost ---------------------------------------------------------------------------------------

OPS = ("claim", "heartbeat", "complete", "complete_and_claim")


def measure_round(q: SQLiteQueue, ops: int, out: dict[str, list[tuple[float, float]]]) -> None:
    """``ops`` of each operation, each its own transaction, as a runner makes them."""
    for _ in range(ops):
        t, c = time.perf_counter(), time.process_time()
        claim = q.leases.claim("bench/1/gpu9/t", "gpu9", LEASE)
        out["claim"].append((time.perf_counter() - t, time.process_time() - c))
        assert claim is not None
        t, c = time.perf_counter(), time.process_time()
        q.leases.heartbeat(claim, LEASE)
        out["heartbeat"].append((time.perf_counter() - t, time.process_time() - c))
        t, c = time.perf_counter(), time.process_time()
        q.leases.complete(claim, [])
        out["complete"].append((time.perf_counter() - t, time.process_time() - c))
    claim = q.leases.claim("bench/1/gpu9/t", "gpu9", LEASE)
    for _ in range(ops):
        t, c = time.perf_counter(), time.process_time()
        claim, _ = q.leases.complete_and_claim(claim, [], "bench/1/gpu9/t", "gpu9", LEASE)
        out["complete_and_claim"].append((time.perf_counter() - t, time.process_time() - c))
        assert claim is not None
    q.leases.complete(claim, [])


def op_costs(small: Path, big: Path, rounds: int, ops: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    got: dict[str, dict[str, list[tuple[float, float]]]] = {"small": {o: [] for o in OPS}, "big": {o: [] for o in OPS}}
    queues = {"small": SQLiteQueue(small, create=False), "big": SQLiteQueue(big, create=False)}
    for q in queues.values():  # warm: the first claim reads the schema and the workflow
        q.leases.complete(q.leases.claim("warm/1/gpu9/t", "gpu9", LEASE), [])
    for _ in range(rounds):
        for name in ("small", "big"):
            measure_round(queues[name], ops, got[name])
    for q in queues.values():
        q.close()
    return got


# -- status, submit, prune ----------------------------------------------------------------------------------

def status_times(path: Path) -> tuple[float, float, float]:
    """(first, median of 5) SQLiteQueue.status() in process, and the median whole `comfysup status`."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        q = SQLiteQueue(path, create=False)
        q.reads.status()
        q.close()
        times.append(time.perf_counter() - t)
    config = path.parent / "config.toml"
    config.write_text(f'[queue]\npath = "{path}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")} | {"PYTHONPATH": str(REPO)}
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "comfysup", "status", "--config", str(config)], env=env, check=True,
                       capture_output=True)
        runs.append(time.perf_counter() - t)
    return times[0], statistics.median(times), statistics.median(runs)


def _submit_child(directory: str, out: str) -> None:
    base = Path(directory)
    gc.disable()  # as `comfysup submit` does while it reads and inserts
    started = time.perf_counter()
    jobs = JobsFile(base / "jobs.jsonl")
    checked = jobs.validate()
    assert checked.ok, checked.problems[:3]
    validated = time.perf_counter()
    q = SQLiteQueue(base / "q.db")
    result = q.intake.submit(jobs.jobs())
    done = time.perf_counter()  # committed (durable): what `comfysup submit` waits for
    q.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # only to measure the database's size in one file
    q.close()
    Path(out).write_text(json.dumps({"validate_s": validated - started, "insert_s": done - validated,
                                     "inserted": result.inserted,
                                     "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def submit_batch(workdir: Path, lines: int) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="submit-", dir=workdir))
    (directory / "workflow.json").write_text(json.dumps(WORKFLOW, indent=1))
    with open(directory / "jobs.jsonl", "w") as f:
        for n in range(lines):
            f.write(json.dumps({"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"scale/{n}")), "workflow": "workflow.json",
                                "set": {"3.seed": n * 7919, "9.filename_prefix": f"batch/{n:06d}"}}) + "\n")
    out = directory / "result.json"
    proc = CTX.Process(target=_submit_child, args=(str(directory), str(out)))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError("submit failed")
    result = json.loads(out.read_text())
    assert result["inserted"] == lines
    # The command itself, as a person runs it (start-up, imports, output included), on a queue of its own.
    (directory / "config.toml").write_text(f'[queue]\npath = "{directory / "cli.db"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")} | {"PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "submit", str(directory / "jobs.jsonl"), "--config",
                             str(directory / "config.toml")], env=env, stdout=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    result["command_s"] = time.perf_counter() - started
    result["command_rss_mb"] = usage.ru_maxrss / 1024
    if status != 0 or f"submitted {lines} job(s)".encode() not in proc.stdout.read():
        raise RuntimeError("comfysup submit failed")
    proc.stdout.close()
    db = directory / "q.db"
    result["db_bytes"] = sum(p.stat().st_size for p in directory.glob("q.db*"))
    conn = sqlite3.connect(db)
    result["workflows"] = conn.execute("SELECT count(*) FROM workflows").fetchone()[0]
    conn.close()
    shutil.rmtree(directory)
    return result


JOB_SECONDS = 0.02
"""The runner's job in the prune part: a very fast GPU job. A runner that claimed again the instant it
recorded a done would hold SQLite's write lock nearly all the time, and SQLite's lock is not fair: a waiting
prune would starve (no runner does that; each waits for its server)."""


def _runner_during(path: str, stop: Any, out: str) -> None:
    """A runner's transactions while the parent prunes: claim, then complete after JOB_SECONDS, timed."""
    q = SQLiteQueue(path, create=False)
    times: list[tuple[float, float]] = []
    while not stop.is_set():
        t = time.perf_counter()
        claim = q.leases.claim("live/1/gpu0/t", "gpu0", LEASE)
        if claim is None:
            break
        claimed = time.perf_counter() - t
        time.sleep(JOB_SECONDS)
        t2 = time.perf_counter()
        q.leases.complete(claim, [])
        times.append((t, claimed))
        times.append((t2, time.perf_counter() - t2))
    q.close()
    Path(out).write_text(json.dumps(times))


def prune_under_load(path: Path, jobs: int) -> dict[str, float]:
    """Prune ``jobs`` finished jobs in batches of 500 while a runner works; the runner's worst waits."""
    q = SQLiteQueue(path, create=False)
    # The oldest ``jobs`` finished jobs: finished_at is T_BASE + i + 60 for done/cancelled/dead rows.
    before = T_BASE + jobs / 0.8 + 60
    stop, out = CTX.Event(), path.parent / "runner.json"
    proc = CTX.Process(target=_runner_during, args=(str(path), stop, str(out)))
    proc.start()
    time.sleep(2.0)  # the runner alone first: its own baseline
    started = time.perf_counter()
    mark = time.perf_counter()
    removed = 0
    while removed < jobs and (batch := q.intake.prune(before, limit=500).removed):
        removed += len(batch)
        time.sleep(0.02)  # as comfysup prune does between batches
    seconds = time.perf_counter() - started
    time.sleep(0.5)
    stop.set()
    proc.join()
    q.close()
    times = json.loads(out.read_text())
    alone = sorted(d for t, d in times if t < mark - 0.2)
    during = sorted(d for t, d in times if mark <= t <= mark + seconds)

    def p99(xs: list[float]) -> float:
        return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("nan")

    return {"removed": removed, "seconds": seconds, "alone_max": max(alone, default=float("nan")),
            "alone_p99": p99(alone), "during_max": max(during, default=float("nan")), "during_p99": p99(during),
            "during_n": len(during), "alone_n": len(alone)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100,000 jobs instead of a million; smaller parts")
    parser.add_argument("--dir", help="where the databases go (default: a temporary folder under ./var)")
    parser.add_argument("--only", choices=["ops", "status", "submit", "prune", "fleet"], action="append",
                        help="run only these parts (repeatable); fleet runs only when named")
    fleet = parser.add_argument_group("fleet: the queue driven as N runners would (see bench/scale_fleet.py)")
    fleet.add_argument("--slots", default="8,64,256", help="simulated GPUs, comma-separated (default 8,64,256)")
    fleet.add_argument("--job-s", default="1,5", help="job lengths in seconds, comma-separated (default 1,5)")
    fleet.add_argument("--lease", type=float, help="lease seconds; heartbeats every lease/3 (default 15: every 5 s, "
                       "the runner's default heartbeat_seconds)")
    fleet.add_argument("--tenants", default="0", help="tenants the jobs are spread over, comma-separated (default "
                       "0: every job the default tenant's; 0,1000 runs both, alternating; 1000,0,1000,0 two pairs)")
    fleet.add_argument("--seconds", type=float, default=20.0, help="measured window per cell (default 20)")
    fleet.add_argument("--backend", choices=["sqlite", "postgres"], action="append",
                       help="default both; they alternate within each cell")
    fleet.add_argument("--processes", "--procs", type=int, default=32,
                       help="most worker processes (one queue connection each; default 32, PostgreSQL's "
                            "max_connections is 100 by default)")
    fleet.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test",
                       help="a server where the bench may create and drop a database of its own")
    fleet.add_argument("--own-postgres", action="store_true",
                       help="start a PostgreSQL of the run's own (initdb in a temporary folder, its own port, "
                            "max_connections for --processes) instead of --postgres: its CPU is all the bench's")
    fleet.add_argument("--pg-cores", type=float, default=float(os.cpu_count() or 1),
                       help="cores the capacity estimate gives the PostgreSQL server (default: this machine's)")
    args = parser.parse_args()
    big_rows = 100_000 if args.quick else 1_000_000
    lines = 20_000 if args.quick else 100_000
    prune_jobs = 20_000 if args.quick else 100_000
    parts = set(args.only or ["ops", "status", "submit", "prune"])
    if "fleet" in parts:
        from scale_fleet import run_fleet

        (REPO / "var").mkdir(exist_ok=True)  # a fresh clone has no var/ yet
        workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-", dir=REPO / "var"))
        load = os.getloadavg()
        print(f"# fleet: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
              f"SQLite {sqlite3.sqlite_version}, window {args.seconds:g} s a cell")
        try:
            with contextlib.ExitStack() as stack:
                url, postmaster = args.postgres, None
                if args.own_postgres:
                    url, postmaster = stack.enter_context(own_postgres(max_connections=args.processes + 20))
                    print(f"# PostgreSQL of this run's own at {url} (max_connections {args.processes + 20})")
                run_fleet(workdir, args.backend or ["sqlite", "postgres"], [int(x) for x in args.slots.split(",")],
                          [float(x) for x in args.job_s.split(",")], args.lease, args.seconds, args.processes,
                          url, args.pg_cores, postmaster, tuple(int(x) for x in args.tenants.split(",")))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        parts.discard("fleet")
        if not parts:
            return 0
    base = Path(args.dir) if args.dir else REPO / "var"
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=base))
    load = os.getloadavg()
    print(f"# queue cost as it grows; {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
          f"SQLite {sqlite3.sqlite_version}, databases in {workdir}")
    try:
        big = workdir / "big" / "queue.db"
        small = workdir / "small" / "queue.db"
        if parts & {"ops", "status", "prune"}:
            big.parent.mkdir()
            print(f"built {big_rows:,} jobs in {build(big, big_rows):.0f} s "
                  f"({sum(p.stat().st_size for p in big.parent.glob('queue.db*')) / 2**20:,.0f} MiB)")
        if "ops" in parts:
            small.parent.mkdir()
            build(small, 1000)
            rounds, ops = 6, 10  # the small queue has 150 ready jobs: 6 x (10 + 11) of them
            got = op_costs(small, big, rounds, ops)
            print(f"\n## one transaction each, {rounds * ops} of each per table (alternating rounds); median µs")
            print(f"{'operation':>20} {'1,000 wall':>11} {f'{big_rows:,} wall':>15} {'ratio':>6}   "
                  f"{'1,000 CPU':>10} {f'{big_rows:,} CPU':>14} {'ratio':>6}")
            for op in OPS:
                sw, bw = (statistics.median(x[0] for x in got[k][op]) * 1e6 for k in ("small", "big"))
                sc, bc = (statistics.median(x[1] for x in got[k][op]) * 1e6 for k in ("small", "big"))
                print(f"{op:>20} {sw:>11,.0f} {bw:>15,.0f} {bw / sw:>6.2f}   {sc:>10,.0f} {bc:>14,.0f} {bc / sc:>6.2f}",
                      flush=True)
        if "status" in parts:
            first, median, command = status_times(big)
            print(f"\n## status on {big_rows:,} jobs: SQLiteQueue.status() first {first * 1000:.0f} ms, median of 5 "
                  f"{median * 1000:.0f} ms; `comfysup status` (whole command, Python start-up included) "
                  f"{command * 1000:.0f} ms")
        if "submit" in parts:
            r = submit_batch(workdir, lines)
            total = r["validate_s"] + r["insert_s"]
            print(f"\n## submit {lines:,} lines of one {len(json.dumps(WORKFLOW)):,}-byte workflow with different set "
                  f"values: {total:.1f} s (validate {r['validate_s']:.1f} s, insert {r['insert_s']:.1f} s), "
                  f"{lines / total:,.0f} jobs/s, peak RSS {r['max_rss_mb']:.0f} MB; database "
                  f"{r['db_bytes'] / 2**20:.1f} MiB = {r['db_bytes'] / lines:,.0f} bytes per job, "
                  f"{r['workflows']} stored workflow(s)")
            print(f"`comfysup submit` of the same file (the whole command, on an empty queue): {r['command_s']:.1f} s, "
                  f"peak RSS {r['command_rss_mb']:.0f} MB")
        if "prune" in parts:
            r = prune_under_load(big, prune_jobs)
            print(f"\n## prune {r['removed']:,.0f} finished jobs of {big_rows:,} in batches of 500 while a runner "
                  f"claims and completes: {r['seconds']:.1f} s ({r['removed'] / r['seconds']:,.0f} jobs/s)")
            print(f"runner's claim or complete (jobs of {JOB_SECONDS * 1000:.0f} ms), ms: alone p99 "
                  f"{r['alone_p99'] * 1000:.1f}, max "
                  f"{r['alone_max'] * 1000:.1f} ({r['alone_n']:.0f} transactions); during the prune p99 "
                  f"{r['during_p99'] * 1000:.1f}, max {r['during_max'] * 1000:.1f} ({r['during_n']:.0f} transactions)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
