"""bench/durable.py: durable queue transactions against the disk's own fsync rate, in one run.

Every claim and every done is an fsync'd commit (WAL, synchronous=FULL), so the disk's fsync rate bounds
the queue. This measures that rate here (a loop of a small write + fsync on the disk the databases use,
before and after the drains) and reports, for 1, 4 and 8 processes:

- comfysup as runners used it before issue 7: claim, then complete, two transactions per job;
  transactions/s as a fraction of the fsync rate;
- comfysup with ``complete_and_claim``: a runner that records a done and wants the next job does both in
  one transaction, one fsync per job (leases, fencing and attempt rows as always);
- huey's SqliteStorage at the same synchronous=FULL, which deletes a task when it is read (a crash
  loses it), and the plain WAL loop of bench/queue.py (the least a durable claim/complete can do).

Each run asserts nothing was lost or handed out twice. Databases go under ./var (the disk the queue
would use) unless --dir says otherwise.

    .venv/bin/python bench/durable.py                 # 3,000 jobs, median of 3 alternating runs
    .venv/bin/python bench/durable.py --quick         # 1,000 jobs, one run
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import importlib.util
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _bench_queue() -> Any:
    """bench/queue.py's drivers and drain harness, loaded by path under another name."""
    spec = importlib.util.spec_from_file_location("bench_queue", Path(__file__).resolve().parent / "queue.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_queue"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


bq = _bench_queue()

from comfysup.queue.sqlite import SQLiteQueue


def fsync_rate(directory: Path, seconds: float = 3.0) -> float:
    """fsyncs per second of a small write + fsync loop on ``directory``'s disk: what a commit costs at least."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            os.write(fd, b"x" * 100)
            os.fsync(fd)
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


class ChainDriver(bq.ComfysupDriver):
    """comfysup with complete_and_claim: one transaction (one fsync) per job after the first claim."""

    name = "comfysup, done + next claim in one transaction"

    def drain(self, directory: Path, owner: str, heartbeat: bool, report: Any) -> None:
        q = SQLiteQueue(directory / "q.db", create=False)
        report.started = time.time()
        claim = q.claim(owner, "bench", bq.LEASE_SECONDS)
        while claim is not None:
            report.claimed.append(claim.id)
            nxt = q.complete_and_claim(claim, [], owner, "bench", bq.LEASE_SECONDS)
            report.completed += 1
            claim = nxt
        report.ended = time.time()
        q.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs and one run per cell")
    parser.add_argument("--jobs", type=int, help="jobs per run (default 3,000; 1,000 with --quick)")
    parser.add_argument("--dir", help="where the databases go (default: a temporary folder under ./var)")
    args = parser.parse_args()
    n = args.jobs or (1000 if args.quick else 3000)
    repeats = 1 if args.quick else 3
    base = Path(args.dir) if args.dir else REPO / "var"
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-durable-", dir=base))
    load = os.getloadavg()
    print(f"# durable transactions against the disk's fsync rate; {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, SQLite {sqlite3.sqlite_version}, databases in {workdir}")
    try:
        before = fsync_rate(workdir)
        print(f"disk: {before:,.0f} fsync/s (100-byte write + fsync loop, 3 s)")
        two, one, huey, plain = bq.ComfysupDriver(), ChainDriver(), bq.HueyDriver(), bq.PlainDriver()
        peers = [d for d in (huey, plain) if d.available() is None]
        rows = []
        problems: list[str] = []
        for processes in (1, 4, 8):
            runs: dict[str, list[Any]] = {"two": [], "one": [], **{d.name: [] for d in peers}}
            for _ in range(repeats):  # alternate, so drift in the machine's load hits all alike
                runs["two"].append(bq.drain(two, workdir, n, processes, False))
                runs["one"].append(bq.drain(one, workdir, n, processes, False))
                for d in peers:
                    runs[d.name].append(bq.drain(d, workdir, n, processes, False))
            for name, rs in runs.items():
                problems += [f"{name} {processes}p: {r.duplicates} dup, {r.lost} lost {r.problem}"
                             for r in rs if r.duplicates or r.lost or r.problem]
            rows.append((processes, {k: statistics.median(r.jobs_per_second for r in rs) for k, rs in runs.items()}))
        after = fsync_rate(workdir)
        limit = (before + after) / 2
        print(f"disk again after the drains: {after:,.0f} fsync/s; fractions below use the mean, {limit:,.0f}/s\n")
        print(f"{n:,} jobs a run, median of {repeats}; tx = durable transactions (claim, complete, or both in one)")
        print(f"{'procs':>5} | {'claim+complete jobs/s':>21} {'tx/s':>7} {'of fsync':>8} | "
              f"{'complete_and_claim jobs/s':>25} {'tx/s':>7} {'of fsync':>8} | {'huey jobs/s':>11} "
              f"{'ours/huey':>9} | {'plain loop jobs/s':>17}")
        for processes, r in rows:
            two_rate, one_rate = r["two"], r["one"]
            h, p = r.get(huey.name), r.get(plain.name)
            huey_text = f"{h:,.0f}" if h else "-"
            ratio = f"{one_rate / h:.2f}" if h else "-"
            plain_text = f"{p:,.0f}" if p else "-"
            print(f"{processes:>5} | {two_rate:>21,.0f} {2 * two_rate:>7,.0f} {2 * two_rate / limit:>8.2f} | "
                  f"{one_rate:>25,.0f} {one_rate:>7,.0f} {one_rate / limit:>8.2f} | {huey_text:>11} {ratio:>9} | "
                  f"{plain_text:>17}", flush=True)
        if problems:
            print("PROBLEMS (a job lost or handed out twice):")
            for line in problems:
                print("  " + line)
            return 1
        print("no job lost or handed out twice in any run")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
