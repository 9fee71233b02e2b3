"""``comfysup demo``: the whole pipeline on the bundled example, with no GPU and no ComfyUI installed.

It writes its own config in a folder (two fake ComfyUI servers on the CPU, launched by the supervisor
exactly as it launches ComfyUI), submits the example jobs, starts ``comfysup run`` as a child, shows
progress until every job of the file has ended, prints the results and where the files are, and stops
the supervisor with SIGTERM as systemd would. A real installation changes only ``[comfyui] main`` and
``gpus``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from comfysup.commands import submit
from comfysup.commands.results import _ids_of, _table, row
from comfysup.config import Config, load_config
from comfysup.errors import ComfysupError, UsageError
from comfysup.queue import open_queue
from comfysup.queue.base import TERMINAL
from comfysup.supervisor.process import die_with_parent
from comfysup.supervisor.server import port_holder

POLL_SECONDS = 0.5
CATALOGUE_WAIT_SECONDS = 60.0
FIRST_PORT = 8188


class DemoFailed(ComfysupError):
    """The demo could not finish."""


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", help="run the example jobs end to end on two fake ComfyUI servers (no GPU)",
                       description="Write a config in --dir with two fake ComfyUI servers on the CPU, submit "
                                   "the jobs file, run the supervisor until every job has ended, print the "
                                   "results and where the files are, then stop it. Installs nothing, runs from "
                                   "any directory, and starts afresh each time: a folder of an earlier demo is "
                                   "emptied first.")
    p.add_argument("--dir", default=None, help="folder for the config, queue, results and logs (default: "
                   f"{default_dir()}, or $XDG_CACHE_HOME/comfysup/demo)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--jobs", default=None, help="jobs file (default: the example that ships with comfysup, "
                       f"{EXAMPLES / 'jobs.jsonl'})")
    which.add_argument("--example", default=None, choices=example_names(),
                       help="a bundled example by name, from any directory (image-to-image: two input images "
                            "inverted, LoadImage → ImageInvert → SaveImage; text-to-image: four SD1.5 prompts, "
                            "CheckpointLoaderSimple → CLIPTextEncode → KSampler → VAEDecode → SaveImage)")
    p.add_argument("--timeout-seconds", type=float, default=600.0, help="give up after this long (default 600)")
    p.set_defaults(func=run)


EXAMPLES = Path(str(resources.files("comfysup") / "data" / "examples"))
"""The example jobs and workflows, shipped in the package (the repository's examples/ links here)."""



def example_names() -> list[str]:
    """The bundled jobs files by name (``jobs``, ``image-to-image``, ``text-to-image``): ``--example`` runs one from
    anywhere, its workflows and input files found next to it in the package."""
    return sorted(p.stem for p in EXAMPLES.glob("*.jsonl"))


def jobs_path(args: argparse.Namespace) -> Path:
    if args.jobs:
        return Path(args.jobs)
    return EXAMPLES / f"{getattr(args, 'example', None) or 'jobs'}.jsonl"


FAKE_ARGS = ["--models", "checkpoints=v1-5-pruned-emaonly.safetensors", "--step-ms", "25"]
"""The fake servers' model files (the checkpoint the text-to-image example names; a job naming another is refused
at submit, as a real server without it would refuse it) and the time of each sampler step."""

MARKER = "# Written by comfysup demo"
"""The first line of a demo's config: a folder that holds one may be emptied by the next demo."""


def default_dir() -> Path:
    """The user's cache folder, never the current directory: a demo run in a checkout leaves nothing in it."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "comfysup" / "demo"


def fresh_dir(directory: Path) -> None:
    """``directory`` empty of an earlier demo, so a second run is as clean as the first; a folder that holds
    anything else is refused rather than touched."""
    if not directory.exists():
        directory.mkdir(parents=True)
        return
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a folder")
    config = directory / "config.toml"
    if config.is_file() and config.read_text(errors="replace").startswith(MARKER):
        for name in ("var", "config.toml", "supervisor.log"):
            path = directory / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    if any(directory.iterdir()):
        raise UsageError(f"{directory}: not empty and not an earlier demo's folder; give an empty or new --dir")


def fake_main() -> Path:
    """fake_comfy's main.py, found without importing the package (the demo runs it, never loads it)."""
    spec = importlib.util.find_spec("fake_comfy")
    if spec is None or not spec.submodule_search_locations:
        raise ComfysupError("the demo needs fake_comfy, which comes with comfysup's source; it is not importable here")
    return Path(next(iter(spec.submodule_search_locations))).resolve() / "main.py"


def free_ports(count: int, first: int = FIRST_PORT, tries: int = 200) -> int:
    """The first port of ``count`` consecutive free ones, so the demo never collides with a real ComfyUI."""
    for base in range(first, first + tries):
        if all(port_holder("127.0.0.1", base + i) is None for i in range(count)):
            return base
    raise DemoFailed(f"no {count} consecutive free ports between {first} and {first + tries}")


def write_config(directory: Path, base_port: int) -> Path:
    doc: dict[str, Any] = {
        "queue": {"path": "var/queue.db"},
        "store": {"dir": "var/results"},
        "comfyui": {"main": str(fake_main()), "gpus": "cpu:2", "base_port": base_port,
                    "base_directory": "var/comfyui", "startup_seconds": 60.0, "extra_args": FAKE_ARGS},
        "runner": {"grace_seconds": 10.0, "base_delay_seconds": 0.5, "timeout_seconds": 120.0},
    }
    path = directory / "config.toml"
    text = (f"{MARKER}: two fake ComfyUI servers on the CPU. For a real installation set\n"
            "# [comfyui] main to ComfyUI's main.py and gpus = \"auto\" (or run comfysup init).\n")
    path.write_text(text + tomli_w.dumps(doc))
    return path


def start_supervisor(config_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """``comfysup run`` as a child in its own session (Ctrl-C reaches the demo, which stops it once),
    dying with the demo."""
    parent = os.getpid()
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(config_path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=lambda: die_with_parent(parent))


def stop_supervisor(proc: subprocess.Popen[bytes], wait_seconds: float) -> int | None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def progress_line(counts: Counter[str], total: int) -> str:
    ended = sum(counts[s] for s in TERMINAL)
    width = 24
    bar = "#" * (width * ended // max(total, 1))
    return (f"[{bar:<{width}}] {ended}/{total} ended: {counts['done']} done, {counts['dead']} dead · "
            f"{counts['running']} running · {counts['posted']} posted · {counts['queued']} queued")


def follow(config_path: Path, ids: list[str], proc: subprocess.Popen[bytes], timeout_seconds: float,
           log_path: Path) -> Counter[str]:
    """Poll the queue until every job of the file has ended; fail if the supervisor dies first."""
    queue = open_queue(load_config(str(config_path), env={}), create=False)
    tty = sys.stderr.isatty()
    last = ""
    deadline = time.monotonic() + timeout_seconds
    try:
        while True:
            counts = Counter(queue.reads.states(ids).values())  # as status counts them: posted apart from running
            line = progress_line(counts, len(ids))
            if line != last:
                print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
                last = line
            if sum(counts[s] for s in TERMINAL) >= len(ids):
                break
            if proc.poll() is not None:
                raise DemoFailed(f"the supervisor exited ({proc.returncode}); see {log_path}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"not finished after {timeout_seconds:g} s; see {log_path}")
            time.sleep(POLL_SECONDS)
    finally:
        if tty:
            print(file=sys.stderr)
        queue.close()
    return counts


def wait_for_catalogues(config: Config, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Return once a server has recorded its node catalogue in the queue (its runner does when it starts), or
    after CATALOGUE_WAIT_SECONDS (then submit checks without one, and says so); fail if the supervisor dies."""
    queue = open_queue(config, create=False)
    deadline = time.monotonic() + CATALOGUE_WAIT_SECONDS
    try:
        while not queue.fleet.catalogues() and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DemoFailed(f"the supervisor exited ({proc.returncode}); see {log_path}")
            time.sleep(POLL_SECONDS)
    finally:
        queue.close()


def report(config_path: Path, ids: list[str]) -> str:
    config = load_config(str(config_path), env={})
    queue = open_queue(config, create=False)
    try:
        jobs = queue.reads.get_many(ids)
    finally:
        queue.close()
    params = sorted({k for job in jobs for k in job.params})
    by_id = {job.id: job for job in jobs}
    return _table(row(by_id[i], params, full=False) for i in ids if i in by_id)


def run(args: argparse.Namespace) -> int:
    jobs = jobs_path(args)
    if not jobs.is_file():
        raise UsageError(f"{jobs}: no such jobs file")
    directory = (Path(args.dir) if args.dir else default_dir()).absolute()
    fresh_dir(directory)
    config_path = write_config(directory, free_ports(2))
    log_path = directory / "supervisor.log"
    print(f"demo in {directory}: two fake ComfyUI servers on the CPU, config {config_path}", file=sys.stderr)
    config = load_config(str(config_path), env={})
    open_queue(config, create=True).close()
    proc = start_supervisor(config_path, log_path)
    print(f"supervisor started (pid {proc.pid}), log {log_path}", file=sys.stderr)
    try:
        # Submitted once the servers recorded their node catalogues, which a UI-format workflow is converted with.
        wait_for_catalogues(config, proc, log_path)
        code = submit.run(argparse.Namespace(config=str(config_path), file=str(jobs), dry_run=False, wait=False))
        ids = [] if code else _ids_of(jobs)
        counts = follow(config_path, ids, proc, args.timeout_seconds, log_path) if ids else Counter[str]()
    finally:
        stopped = stop_supervisor(proc, config.runner.grace_seconds + 30)
        print(f"supervisor stopped ({'exit code ' + str(stopped) if stopped is not None else '?'})",
              file=sys.stderr)
    if code:
        return code
    print(report(config_path, ids))
    print()
    print(f"files:   {config.resolve(config.store.dir)}/<job id>/")
    print(f"queue:   {config.resolve(config.queue.path)}   (comfysup status --config {config_path})")
    print(f"logs:    {log_path}, {config.resolve(config.comfyui.base_directory)}/<slot>/comfyui.log")
    done = counts["done"]
    print(f"{done} of {len(ids)} job(s) done")
    return 0 if done == len(ids) else 1
