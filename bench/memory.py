"""bench/memory.py: the resident memory of the supervisor and its runners over 10,000 jobs.

`comfysup run` on K fake ComfyUI servers (prompts of --t-ms), N trivial jobs submitted at once. Every
second the resident set (RSS) of the supervisor, of each runner and of the monitor is sampled (runners'
USS too: the pages only that process holds, since a forked runner shares its parent's). Reported: each
process's RSS once the first 5% of the jobs are done (warm: every code path has run) and at the end,
the growth between the two, and the peak. Goal: each under 60 MB, flat.

    .venv/bin/python bench/memory.py                  # 10,000 jobs on 2 servers
    .venv/bin/python bench/memory.py --jobs 2000      # a quicker look
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import uuid

import psutil
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(sup: psutil.Process) -> dict[str, tuple[float, float]]:
    """name -> (RSS, USS) in MiB, for the supervisor and its comfysup-* children (runners, the monitor)."""
    out = {"supervisor": (sup.memory_info().rss / MIB, sup.memory_full_info().uss / MIB)}
    for child in sup.children():
        try:
            name = child.name()
            if name.startswith("comfysup-"):
                info = child.memory_full_info()
                out[name] = (info.rss / MIB, info.uss / MIB)
        except psutil.Error:
            continue
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--k", type=int, default=2, help="fake servers (and runners)")
    parser.add_argument("--t-ms", type=float, default=0.0, help="each prompt's time on the fake")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# memory over {args.jobs:,} jobs on {args.k} fake servers (prompts of {args.t_ms:g} ms); "
          f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    with tempfile.TemporaryDirectory(prefix="comfysup-memory-") as name:
        tmp = Path(name)
        config = tmp / "config.toml"
        config.write_bytes(tomli_w.dumps({
            "queue": {"path": str(tmp / "var" / "queue.db")}, "store": {"dir": str(tmp / "var" / "results")},
            "comfyui": {"main": str(ROOT / "fake_comfy" / "main.py"), "python": sys.executable,
                        "gpus": f"cpu:{args.k}", "base_port": free_port(),
                        "base_directory": str(tmp / "var" / "comfyui"),
                        "extra_args": ["--node-ms", str(args.t_ms / len(TRIVIAL))], "startup_seconds": 30.0},
            "runner": {"jitter": False}, "metrics": {"listen": "127.0.0.1:0"}}).encode())
        jobs = tmp / "jobs.jsonl"
        with open(jobs, "w") as f:
            for i in range(args.jobs):
                f.write(json.dumps({"id": str(uuid.uuid4()), "workflow": "workflow.json",
                                    "set": {"1.color": i % 16777216, "3.filename_prefix": f"m{i}"}}) + "\n")
        (tmp / "workflow.json").write_text(json.dumps(TRIVIAL))
        subprocess.run([sys.executable, "-m", "comfysup", "submit", str(jobs), "--config", str(config)], check=True,
                       capture_output=True, cwd=ROOT)
        log = open(tmp / "supervisor.log", "wb")  # noqa: SIM115 - closed below, after the process ends
        proc = subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        sup = psutil.Process(proc.pid)
        warm_at = max(1, args.jobs // 20)
        warm: dict[str, tuple[float, float]] = {}
        last: dict[str, tuple[float, float]] = {}
        peak: dict[str, float] = {}
        started = time.monotonic()
        try:
            while True:
                time.sleep(1.0)
                with sqlite3.connect(tmp / "var" / "queue.db") as db:
                    done = db.execute("SELECT count(*) FROM jobs WHERE state IN ('done', 'dead')").fetchone()[0]
                try:
                    now = sample(sup)
                except psutil.Error:
                    raise SystemExit(f"the supervisor exited; see {tmp / 'supervisor.log'}") from None
                for k, v in now.items():
                    peak[k] = max(peak.get(k, 0.0), v[0])
                if done >= warm_at and not warm:
                    warm = now
                if done > warm_at:
                    last = now
                if done >= args.jobs:
                    break
                if time.monotonic() - started > 60 + args.jobs * 0.2:
                    raise SystemExit(f"not done in time ({done} of {args.jobs}); see {tmp / 'supervisor.log'}")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            log.close()
        seconds = time.monotonic() - started
        print(f"{args.jobs:,} jobs done in {seconds:.0f} s; RSS (USS) in MiB, warm = after {warm_at:,} jobs")
        print(f"{'process':>18} {'warm RSS':>9} {'end RSS':>8} {'growth':>7} {'peak RSS':>9} {'warm USS':>9} "
              f"{'end USS':>8}")
        for key in sorted(last, key=lambda k: (k != "supervisor", k)):
            w, e = warm.get(key, (float("nan"), float("nan"))), last[key]
            print(f"{key:>18} {w[0]:>9.1f} {e[0]:>8.1f} {e[0] - w[0]:>+7.1f} {peak[key]:>9.1f} {w[1]:>9.1f} "
                  f"{e[1]:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
