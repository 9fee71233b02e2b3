"""bench/real_profile.py: where `comfysup work`'s runner spends its CPU per job, on a real ComfyUI or the fake.

`comfysup work` (bench/real.py's ``Work``: the CLI, its defaults) against one fresh server, warmed up by 4
jobs; then N trivial jobs (bench/real.py's, ~2-5 ms in ComfyUI) twice: first plain, for the CPU time per job
of the runner process and of `work`'s own process (psutil), then again with py-spy sampling the runner
(``py-spy record --nonblocking``, on-CPU samples only, as py-spy does without ``--idle``). Printed: the
share of the runner's CPU samples under each comfysup function that is the deepest one on the stack (what
comfysup code is responsible for, library calls below it included), and the functions that burn it
themselves. The bare client's CPU per job is in bench/real.py's table.

    COMFYUI_DIR=... COMFYUI_PYTHON=... .venv/bin/python bench/real_profile.py         # a real ComfyUI
    .venv/bin/python bench/real_profile.py --fake                                      # fake_comfy, 1 ms nodes
    .venv/bin/python bench/real_profile.py --fake --ahead --jobs 1000 --raw /tmp/runner.txt
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # last on sys.path (bench/queue.py would shadow the stdlib's queue)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter

import psutil
import real
from runner import start_fake


def cpu(p: psutil.Process) -> float:
    return sum(p.cpu_times()[:2])


def summarise(raw: Path, top: int) -> None:
    """py-spy's raw (collapsed) stacks: ``frame;frame;... count``, a frame ``func (path:line)``."""
    responsible: Counter[str] = Counter()
    itself: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += n
        itself[_short(frames[-1])] += n
        ours = [f for f in frames if "comfysup/" in f and "bench/" not in f]
        responsible[_short(ours[-1]) if ours else "(outside comfysup: start-up, interpreter)"] += n
    print(f"{total} samples of the runner\n\nthe deepest comfysup function on the stack:")
    for name, n in responsible.most_common(top):
        print(f"  {n / total * 100:5.1f}%  {name}")
    print("\nthe function on the CPU itself:")
    for name, n in itself.most_common(top):
        print(f"  {n / total * 100:5.1f}%  {name}")


def _short(frame: str) -> str:
    """``func (/long/path/comfysup/runner/loop.py)`` -> ``func (comfysup/runner/loop.py)``."""
    return re.sub(r"\((?:.*/)?((?:comfysup|site-packages|python3\.\d+)/)", r"(\1", frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", action="store_true", help="fake_comfy (1 ms a node) instead of a real ComfyUI")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workload", choices=("trivial", "slow"), default="trivial",
                        help="bench/real.py's workloads: trivial (a few ms in ComfyUI) or slow (a chain of blurs)")
    parser.add_argument("--ahead", action="store_true", help="[runner] queue_ahead = true (default: false)")
    parser.add_argument("--local", action="store_true", help="the server's output_dir in the config (a real "
                        "ComfyUI only): the files are read from its output folder instead of through /view")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples a second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL (py-spy --gil): Python's own "
                        "work, without the time in system calls (socket sends, fsync) that release it")
    parser.add_argument("--idle", action="store_true", help="every sample, off the CPU too (py-spy --idle): where "
                        "the runner's wall time goes, waits for the server and the disk included")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the servers it started
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(prefix="comfysup-profile-") as name:
        tmp = Path(name)
        if args.fake:
            server, url = start_fake(tmp / "fake", 1.0)
        else:
            if not os.environ.get("COMFYUI_DIR"):
                parser.error("set COMFYUI_DIR (and COMFYUI_PYTHON), or give --fake")
            server, url = real.start_comfyui(Path(os.environ["COMFYUI_DIR"]),
                                             os.environ.get("COMFYUI_PYTHON", sys.executable), tmp / "comfyui")
        work = real.Work(url, tmp, args.ahead, tmp / "comfyui" / "output" if args.local and not args.fake else None)
        try:
            work.submit("warm", real.prompts("trivial", "warm", 4))
            work.start()
            work.wait("comfysup work's warm-up")
            parent = psutil.Process(work.proc.pid)
            runner = next(c for c in parent.children() if c.name().startswith("comfysup-"))
            before, split = (cpu(runner), cpu(parent)), runner.cpu_times()
            work.submit("plain", real.prompts(args.workload, "plain", args.jobs))
            work.wait("comfysup work")
            per_job = [(cpu(runner) - before[0]) / args.jobs * 1000, (cpu(parent) - before[1]) / args.jobs * 1000]
            user, system = (now - then for now, then in zip(runner.cpu_times()[:2], split[:2], strict=True))
            raw = args.raw or tmp / "runner.txt"
            sampler = subprocess.Popen([spy, "record", "--pid", str(runner.pid), "--rate", str(args.rate), "--format",
                                        "raw", "--output", str(raw), "--nonblocking", *(["--gil"] if args.gil else []),
                                        *(["--idle"] if args.idle else [])],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            sampler.stdout.readline()  # "py-spy> Sampling process ..." once it is attached
            work.submit("profiled", real.prompts(args.workload, "profiled", args.jobs))
            work.wait("comfysup work")
            sampler.send_signal(signal.SIGINT)
            sampler.wait(60)
            load = os.getloadavg()
            print(f"`comfysup work` on {'fake_comfy (1 ms nodes)' if args.fake else 'a real ComfyUI'}, {args.jobs} "
                  f"{args.workload} jobs, queue_ahead = {str(args.ahead).lower()}, output_dir "
                  f"{'set' if args.local else 'unset'}; load average {load[0]:.1f}; CPU ms per "
                  f"job without the profiler: runner {per_job[0]:.2f} (user {user / args.jobs * 1000:.2f}, system "
                  f"{system / args.jobs * 1000:.2f}), work's own process {per_job[1]:.2f}\n")
            summarise(raw, args.top)
        finally:
            work.stop()
            real.stop(server)


if __name__ == "__main__":
    main()
