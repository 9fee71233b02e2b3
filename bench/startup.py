"""bench/startup.py: how long ``comfysup submit`` and ``comfysup status`` take beyond a bare ``python -c pass``
(within 0.1 s), medians of alternating runs so the machine's drift hits every command alike.

    .venv/bin/python bench/startup.py              # 15 rounds
    .venv/bin/python bench/startup.py --rounds 31

Each round runs, in turn: ``python -c pass``, ``comfysup status`` on a queue of one job, ``comfysup submit`` of a
one-line file on a fresh queue (the whole command: start-up, imports, config, creating the queue's schema, the
output) and ``comfysup submit`` of a new one-line file to a queue that exists (the common case: the queue a
supervisor serves; start-up, imports, config, the insert, the output).
Where the time goes: ``python -X importtime -m comfysup status …``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "startup"}}}


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole command; CPU (user + system) moves less with the machine's load."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({status})")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="comfysup-startup-") as folder:  # its queues and files go with it
        return measure(args.rounds, Path(folder))


def measure(rounds: int, tmp: Path) -> int:
    # Without PYTHONDONTWRITEBYTECODE (set on some machines, CI images and containers), as bench/real.py: with it,
    # every command compiled comfysup's modules again (~30 ms of status's 78 beyond bare here), which no installed
    # copy does (pip compiles at install). The first submit below writes the bytecode.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    (tmp / "jobs.jsonl").write_text(json.dumps({"id": str(uuid.uuid4()), "workflow": WORKFLOW}) + "\n")
    (tmp / "config.toml").write_text(f'[queue]\npath = "{tmp / "status.db"}"\n')
    comfysup = [sys.executable, "-m", "comfysup"]
    subprocess.run([*comfysup, "submit", "jobs.jsonl", "--config", "config.toml"], env=env, cwd=tmp, check=True,
                   capture_output=True)
    runs: dict[str, list[tuple[float, float]]] = {"python -c pass": [], "comfysup status": [], "comfysup submit": [],
                                                  "submit, queue exists": []}
    for n in range(rounds):
        runs["python -c pass"].append(timed([sys.executable, "-c", "pass"], env, tmp))
        runs["comfysup status"].append(timed([*comfysup, "status", "--config", "config.toml"], env, tmp))
        (tmp / f"submit{n}.toml").write_text(f'[queue]\npath = "{tmp / f"submit{n}.db"}"\n')
        runs["comfysup submit"].append(timed([*comfysup, "submit", "jobs.jsonl", "--config", f"submit{n}.toml"], env,
                                             tmp))
        (tmp / f"more{n}.jsonl").write_text(json.dumps({"id": str(uuid.uuid4()), "workflow": WORKFLOW}) + "\n")
        runs["submit, queue exists"].append(timed([*comfysup, "submit", f"more{n}.jsonl", "--config", "config.toml"],
                                                  env, tmp))
    load = os.getloadavg()
    print(f"# {rounds} alternating rounds; {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} "
          f"{load[2]:.1f}")
    bare = [statistics.median(x[i] for x in runs["python -c pass"]) for i in (0, 1)]
    print(f"{'command':>20} {'wall median ms':>15} {'min':>7} {'max':>7} {'beyond bare':>12}   "
          f"{'CPU median ms':>14} {'min':>7} {'max':>7} {'beyond bare':>12}")
    for name, xs in runs.items():
        cells = []
        for i in (0, 1):
            got = [x[i] * 1e3 for x in xs]
            median = statistics.median(got)
            cells.append(f"{median:>{15 - i}.1f} {min(got):>7.1f} {max(got):>7.1f} {median - bare[i] * 1e3:>12.1f}")
        print(f"{name:>20} {cells[0]}   {cells[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
