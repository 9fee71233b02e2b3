"""bench/runner_instructions.py: one runner in this process against one fake_comfy server (5 ms prompts), the jobs
submitted by a child process, so that a count of this process's instructions is the runner's work alone.

The runner's instructions a job are deterministic where its CPU time is not (a repeat differs by about 0.05 %):
the difference of two runs over the difference of their jobs. ``--tree`` runs another checkout's runner (and its
fake), so two trees compare on one machine:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python bench/runner_instructions.py --jobs 20
    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python bench/runner_instructions.py --jobs 120
    # (instructions of the second - of the first) / 100 = a job's; add --tree ../other for the other tree
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--jobs", type=int, default=120)
parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose runner and fake run (default: this one)")
ARGS = parser.parse_args()
TREE = ARGS.tree.resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(TREE))

import tomli_w

from bench.runner import start_fake
from comfysup.runner.loop import Runner
from tests.runner_helpers import config_of

SUBMIT = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
          "from tests.runner_helpers import submit, trivial_job; "
          "submit(Path(sys.argv[2]), [trivial_job(n) for n in range(int(sys.argv[3]))]).close()")


def runner_of(config: Path, url: str, output: Path) -> Runner:
    """The runner as comfysup run launches it, in this tree's signature or the one before its options object."""
    try:
        from comfysup.runner.options import RunnerOptions
    except ImportError:  # a tree before RunnerOptions: its options were keywords
        return Runner(config_of(config), "cpu0", url, until_empty=True, output_dirs={"cpu0": output})  # type: ignore[call-arg]
    return Runner(config_of(config), "cpu0", url, RunnerOptions(until_empty=True, output_dirs={"cpu0": output}))


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="comfysup-instructions-"))
    proc, url = start_fake(tmp / "fake", 5 / 3)
    try:
        doc = {"queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store")},
               "comfyui": {"gpus": "cpu:1"}, "runner": {"queue_ahead": True}}
        (tmp / "config.toml").write_bytes(tomli_w.dumps(doc).encode())
        subprocess.run([sys.executable, "-c", SUBMIT, str(TREE), str(tmp / "config.toml"), str(ARGS.jobs)],
                       check=True, cwd=TREE)
        runner = runner_of(tmp / "config.toml", url, tmp / "fake" / "output")
        cpu = time.process_time()
        counts = runner.run()
        print(f"{dict(counts)}  N {ARGS.jobs}: runner CPU {(time.process_time() - cpu) * 1000 / ARGS.jobs:.2f} ms/job")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
