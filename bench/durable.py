"""bench/durable.py: durable queue transactions against the disk's own fsync rate, in one run.

Every claim and every done is an fsync'd commit (WAL, synchronous=FULL), so the disk's fsync rate bounds
the queue. This measures that rate here (a loop of a small write + fsync on the disk the databases use)
and reports, for 1, 4 and 8 processes:

- comfysup as runners used it before complete_and_claim: claim, then complete, two transactions per job;
  transactions/s as a fraction of the fsync rate;
- comfysup with ``complete_and_claim``: a runner that records a done and wants the next job does both in
  one transaction, one fsync per job (leases, fencing and attempt rows as always);
- huey's SqliteStorage at the same synchronous=FULL, which deletes a task when it is read (a crash
  loses it), and the plain WAL loop of bench/queue.py (the least a durable claim/complete can do).

The disk's rate drifts with whatever else the machine does (3,800 fsync/s before a run and 1,100 after
it, once, on a shared 2-CPU machine), so one figure taken before and after the whole run can make the same
drain look twice as good or half as good. So a probe of PROBE_SECONDS runs between drains, each drain is
set against the mean of the probes just before and just after it, and a cell is the median over its
rounds. CPU µs per job (workers' user + system time, fsync included) is printed too: it
moves far less with the load than jobs/s does.

Each run asserts nothing was lost or handed out twice. Databases go under ./var (the disk the queue
would use) unless --dir says otherwise.

    .venv/bin/python bench/durable.py                 # 3,000 jobs, median of 3 alternating rounds
    .venv/bin/python bench/durable.py --quick         # 1,000 jobs, one round
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
        claim = q.leases.claim(owner, "bench", bq.LEASE_SECONDS)
        while claim is not None:
            report.claimed.append(claim.id)
            nxt, _ = q.leases.complete_and_claim(claim, [], owner, "bench", bq.LEASE_SECONDS)
            report.completed += 1
            claim = nxt
        report.ended = time.time()
        q.close()


PROBE_SECONDS = 1.0
"""Each probe between two drains: about 3,000 fsyncs on an idle disk here, enough for a rate."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs and one round per cell")
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
        two, one, huey, plain = bq.ComfysupDriver(), ChainDriver(), bq.HueyDriver(), bq.PlainDriver()
        peers = [d for d in (huey, plain) if d.available() is None]
        probes = [fsync_rate(workdir, PROBE_SECONDS)]

        def drain(driver: Any, processes: int) -> tuple[Any, float]:
            """A drain and the disk's rate around it: the mean of the probes just before and just after."""
            result = bq.drain(driver, workdir, n, processes, False)
            probes.append(fsync_rate(workdir, PROBE_SECONDS))
            return result, (probes[-2] + probes[-1]) / 2

        rows = []
        problems: list[str] = []
        for processes in (1, 4, 8):
            runs: dict[str, list[Any]] = {"two": [], "one": [], **{d.name: [] for d in peers}}
            for _ in range(repeats):  # alternate, so drift in the machine's load hits all alike
                runs["two"].append(drain(two, processes))
                runs["one"].append(drain(one, processes))
                for d in peers:
                    runs[d.name].append(drain(d, processes))
            for name, rs in runs.items():
                problems += [f"{name} {processes}p: {r.duplicates} dup, {r.lost} lost {r.problem}"
                             for r, _ in rs if r.duplicates or r.lost or r.problem]
            rows.append((processes, statistics.median(limit for rs in runs.values() for _, limit in rs), {
                name: (statistics.median(r.jobs_per_second for r, _ in rs),
                       statistics.median(r.jobs_per_second / limit for r, limit in rs),
                       statistics.median(r.cpu_us_per_job for r, _ in rs))
                for name, rs in runs.items()}))
        load = os.getloadavg()
        print(f"disk: {min(probes):,.0f}–{max(probes):,.0f} fsync/s over {len(probes)} probes of {PROBE_SECONDS:g} s "
              f"(100-byte write + fsync loop; first {probes[0]:,.0f}, last {probes[-1]:,.0f}); load average now "
              f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
        print(f"{n:,} jobs a run, median of {repeats} rounds; tx = durable transactions (claim, complete, or both "
              "in one); of fsync = tx/s over the probes around the same drain; cpu = µs per job")
        print(f"{'procs':>5} {'fsync/s':>7} | {'claim+complete jobs/s':>21} {'tx/s':>6} {'of fsync':>8} {'cpu':>5} | "
              f"{'complete_and_claim jobs/s':>25} {'of fsync':>8} {'cpu':>5} | {'huey jobs/s':>11} "
              f"{'ours/huey':>9} | {'plain loop jobs/s':>17} {'of fsync':>8}")
        for processes, limit, r in rows:
            (two_rate, two_of, two_cpu), (one_rate, one_of, one_cpu) = r["two"], r["one"]
            h, p = r.get(huey.name), r.get(plain.name)
            huey_text = f"{h[0]:,.0f}" if h else "-"
            ratio = f"{one_rate / h[0]:.2f}" if h else "-"
            plain_text, plain_of = (f"{p[0]:,.0f}", f"{2 * p[1]:.2f}") if p else ("-", "-")
            print(f"{processes:>5} {limit:>7,.0f} | {two_rate:>21,.0f} {2 * two_rate:>6,.0f} {2 * two_of:>8.2f} "
                  f"{two_cpu:>5,.0f} | {one_rate:>25,.0f} {one_of:>8.2f} {one_cpu:>5,.0f} | {huey_text:>11} "
                  f"{ratio:>9} | {plain_text:>17} {plain_of:>8}", flush=True)
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
