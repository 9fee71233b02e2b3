"""bench/profile_runner.py: one runner in this process against one fake_comfy server (its own process) whose
prompts take T ms, with the runner's CPU time per job, its efficiency (ideal N*T / wall), and a profile.

    .venv/bin/python bench/profile_runner.py --t-ms 20 --jobs 300                 # queue_ahead on (the default)
    .venv/bin/python bench/profile_runner.py --t-ms 20 --jobs 300 --queue-ahead false
    .venv/bin/python bench/profile_runner.py --t-ms 20 --profile wall             # pyinstrument: wall time
    .venv/bin/python bench/profile_runner.py --t-ms 20 --profile cpu              # cProfile on process time
    SORT=cumulative TOP=90 .venv/bin/python bench/profile_runner.py --profile cpu # another order, more rows
    .venv/bin/python bench/profile_runner.py --t-ms 20 --jobs 300 --durable off   # what durability costs
    .venv/bin/python bench/profile_runner.py --t-ms 5 --jobs 300 --log 2>/dev/null # with comfysup work's log lines

``--durable off`` is a measurement, never a setting comfysup has: the runner's fsyncs become no-ops (the result
file's and its folder's) and its SQLite commits run with ``synchronous = OFF``, so the CPU per job beside the
default run's is what the promise costs (a claim durable before its POST, a done only when its files are). The
background checkpoint's own fsync of the database, about once a second, stays in both.

The efficiency is against T as asked of the fake; the fake's own executions take a little longer (its
record says how much), so 1.0 is out of reach here. Run it with nothing else on the machine.
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import cProfile
import io
import itertools
import json
import os
import pstats
import tempfile
import time

import tomli_w
import urllib3

from bench.runner import start_fake
from tests.runner_helpers import config_of, submit, trivial_job


def without_durability() -> None:
    """The runner in this process without its fsyncs: os.fsync does nothing, and every SQLite commit it makes
    runs with synchronous = OFF (its durable ones and the others alike)."""
    from comfysup.queue.sqlite import SQLiteDb

    os.fsync = lambda fd: None
    SQLiteDb.DURABLE_SYNC = SQLiteDb.CHEAP_SYNC = "OFF"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--t-ms", type=float, default=20.0, help="a prompt's time (three nodes of T/3 ms)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--queue-ahead", choices=("true", "false"), default="true")
    parser.add_argument("--profile", choices=("none", "wall", "cpu"), default="none")
    parser.add_argument("--durable", choices=("on", "off"), default="on",
                        help="off: no fsync and synchronous = OFF in the runner (a measurement of their cost)")
    parser.add_argument("--log", action="store_true",
                        help="log as comfysup work does (INFO lines on stderr, plain): their cost is the runner's too")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="comfysup-profile-"))
    proc, url = start_fake(tmp / "fake", args.t_ms / 3)
    try:
        doc = {"queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store")},
               "comfyui": {"gpus": "cpu:1"}, "runner": {"queue_ahead": args.queue_ahead == "true"}}
        (tmp / "config.toml").write_bytes(tomli_w.dumps(doc).encode())
        submit(tmp / "config.toml", [trivial_job(n) for n in range(args.jobs)]).close()
        from comfysup.runner.loop import Runner
        from comfysup.runner.options import RunnerOptions

        if args.durable == "off":
            without_durability()
        if args.log:
            from comfysup.logs import setup_logging

            setup_logging()

        # As comfysup run launches it: the runner sees the server's output folder (files read from the disk).
        runner = Runner(config_of(tmp / "config.toml"), "cpu0", url,
                        RunnerOptions(until_empty=True, output_dirs={"cpu0": tmp / "fake" / "output"}))
        profiler: object = None
        if args.profile == "wall":
            import pyinstrument

            profiler = pyinstrument.Profiler(interval=0.0005)
            profiler.start()
        elif args.profile == "cpu":
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
        wall, cpu, split = time.perf_counter(), time.process_time(), os.times()
        counts = runner.run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        user, system = os.times().user - split.user, os.times().system - split.system
        stats = json.loads(urllib3.request("GET", f"{url}/fake/stats", timeout=10.0).data)
        runs = sorted((r["started_at"], r["ended_at"]) for p in stats["prompts"].values() for r in p["executions"])
        executing = sum(end - start for start, end in runs)
        gaps = sorted((b[0] - a[1]) * 1000 for a, b in itertools.pairwise(runs))
        ideal = args.jobs * args.t_ms / 1000
        print(f"{dict(counts)}  queue_ahead {args.queue_ahead}  durable {args.durable}  T {args.t_ms:g} ms  "
              f"N {args.jobs}: wall {wall:.2f} s, "
              f"efficiency {ideal / wall:.3f} (against the fake's own execution time {executing / wall:.3f}), "
              f"runner CPU {cpu * 1000 / args.jobs:.2f} ms/job (user {user * 1000 / args.jobs:.2f}, system "
              f"{system * 1000 / args.jobs:.2f}), server idle between prompts median "
              f"{gaps[len(gaps) // 2]:.2f} ms")
        if args.profile == "wall":
            print(profiler.output_text(unicode=False, color=False))  # type: ignore[attr-defined]
        elif args.profile == "cpu":
            out = io.StringIO()
            stats_of = pstats.Stats(profiler, stream=out)  # type: ignore[arg-type]
            stats_of.sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "40")))
            if os.environ.get("CALLERS"):
                stats_of.print_callers(os.environ["CALLERS"])
            print(out.getvalue())
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
