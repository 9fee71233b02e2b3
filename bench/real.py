"""bench/real.py: comfysup against a bare client and Comfy's own proxy + SDK on a real ComfyUI.

Opt-in like the real test tier: COMFYUI_DIR names a ComfyUI checkout that runs with --cpu, COMFYUI_PYTHON
the Python of its environment. Each tool, in each run, gets its OWN fresh ComfyUI server (a new base
directory, ``--cpu``, as comfysup launches servers), warms it up with 2 prompts of each workload, then runs
the measured batches, trivial first, then slow:

- ``bare``: bench/real_drivers.py ``bare``, a process that posts one prompt, waits on the WebSocket for its
  end, reads /history and downloads each image through /view; nothing durable. ``bare-fsync`` (not run unless
  named): the same with each file fsynced before the next prompt, the floor ("the bare client plus one
  fsync"), beside the plain one. ``bare-ahead`` (not run unless named): the next prompt posted as one starts,
  as comfysup's queue-ahead does, nothing durable: what overlapping a prompt with the client's work costs.
- ``comfysup`` and ``comfysup-ahead``: ``comfysup work`` (the CLI, its defaults) with a config that names the
  server, ``[runner] queue_ahead = false`` and ``true`` respectively; the clock starts when ``comfysup
  submit jobs.jsonl`` starts (the command is part of handing the jobs over) and stops at the last job's
  ``done`` (files in the store, renamed, hashed).
- ``proxy``: ``comfy-api-proxy run --comfyui URL --port P`` (its defaults: no --state-dir) and comfy-sdk's
  ``Comfy()`` submitting every job first, then ``job.result()`` and ``to_file`` each (bench/real_drivers.py
  ``sdk``). ``proxy-run`` (not run unless named) is the SDK's getting-started ``client.run(wf)`` one job at a
  time. Both from PyPI, in a virtual environment this bench makes on first use (``--proxy-venv``).
- ``--cold`` (the tools ``bare-cold``, ``comfysup-ahead`` and ``proxy-cold``): the bare client's and the SDK's
  processes above are started before the warm-up and kept, so their batches do not pay for an interpreter,
  imports and connections, while comfysup's pays for ``comfysup submit``'s. Cold, each batch of the bare client
  and of the SDK runs in a process started for it, timed (wall and CPU) from that start, as a user's script is:
  every tool then pays for the command that hands its jobs over.

Workloads: ``trivial`` (examples/workflows/trivial.json, 64x64: ~2-5 ms in ComfyUI) and ``slow``
(examples/workflows/slow.json at 768x768: ~0.4-0.8 s). The order of the tools turns by one each run. Every
batch is verified: each prompt has exactly one history entry and one file in the server's output folder
(none ran twice), succeeded, and its file is on the client's side (a PNG). Reported per tool: wall s, jobs/s,
the ratio to the bare client of the same run, ComfyUI's own execution time (history timestamps) and the time
beyond it, the server's median idle time between two prompts, the CPU seconds of the tool's own processes
(children included, never the ComfyUI server) and their memory at the peak (RSS and PSS summed over them).

    COMFYUI_DIR=/path/to/ComfyUI COMFYUI_PYTHON=/path/to/venv/bin/python .venv/bin/python bench/real.py
    ... bench/real.py --quick                                 # 2 runs, 100 trivial and 10 slow prompts

Each batch's own line is printed as it ends; the tables at the end give, for every figure, the median over the
runs and its spread (min–max), and the ratios to the bare client paired run by run (at least 7
runs, the default). CPU is every process of the tool, the submitting command included; for comfysup also without
its ``comfysup submit`` (the runner alone, the point 2), and against ``bare-fsync`` when it ran.
    ... bench/real.py --slow 30 --trivial 0 --slow-size 1024  # the realistic cell (0.3-1 s prompts)
    ... bench/real.py --runs 4 --tools bare,comfysup-ahead    # some of the tools
    ... bench/real.py --cold                                  # every client started for its batch
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and bench/queue.py would shadow the standard
# library's queue module for everything imported after it: it goes last, where it still gives real_report.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psutil
import requests
import tomli_w
from real_report import COLUMNS, SUBMIT_CPU, prefix_of, row_line, run_by_run, summary, verify

from comfysup.comfy import probe

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = HERE / "real_drivers.py"
WORKFLOWS = ROOT / "examples" / "workflows"
TOOLS = ("bare", "comfysup", "comfysup-ahead", "proxy")
ALL_TOOLS = (*TOOLS, "comfysup-view", "bare-cold", "bare-fsync", "bare-ahead", "proxy-cold", "proxy-run")
COLD = ("bare-cold", "comfysup-ahead", "proxy-cold")
"""``--cold``: every tool's batch timed from the start of the command a user runs for it."""
MIB = 2**20


SLOW_SIZE = 768
"""The slow workload's image side (``--slow-size``)."""


def workflow(workload: str, slow_size: int = SLOW_SIZE) -> dict[str, Any]:
    wf = json.loads((WORKFLOWS / f"{workload}.json").read_text())
    if workload == "slow":
        wf["1"]["inputs"]["width"] = wf["1"]["inputs"]["height"] = slow_size
    return wf


def prompts(workload: str, tag: str, n: int, slow_size: int = SLOW_SIZE) -> list[dict[str, Any]]:
    """n prompts, each with its own colour (ComfyUI's cache never serves one) and its own filename_prefix
    (``tag_0007``), which names the job in the history, in the output folder and on the client's side."""
    template, out = workflow(workload, slow_size), []
    for i in range(n):
        wf = json.loads(json.dumps(template))
        wf["1"]["inputs"]["color"] = (hash(tag) + i * 7919) % 16777216
        next(node for node in wf.values() if node["class_type"] == "SaveImage")["inputs"]["filename_prefix"] = \
            f"{tag}_{i:04d}"
        out.append(wf)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, what: str, seconds: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: exited with {proc.returncode}" + (f"; see {log}" if log else ""))
        try:
            if check():
                return
        except (requests.RequestException, sqlite3.Error):
            pass
        time.sleep(0.02)
    raise SystemExit(f"{what}: not ready within {seconds:g} s" + (f"; see {log}" if log else ""))


def start_comfyui(comfyui_dir: Path, python: str, base: Path) -> tuple[subprocess.Popen, str]:
    """A fresh ComfyUI with comfysup's own flags for a CPU slot (supervisor/server.py command_line)."""
    (base / "custom_nodes").mkdir(parents=True)
    port = free_port()
    log = base / "comfyui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([python, str(comfyui_dir / "main.py"), "--listen", "127.0.0.1", "--port", str(port),
                                 "--cpu", "--base-directory", str(base), "--database-url",
                                 f"sqlite:///{base / 'comfyui.db'}", "--disable-auto-launch"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: probe.answers(url, timeout_seconds=1), "ComfyUI", 300, proc, log)
    return proc, url


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Tree:
    """The processes of one tool (roots and their children): CPU seconds and peak memory while sampled."""

    def __init__(self, *pids: int) -> None:
        self.roots = [psutil.Process(pid) for pid in pids]
        self.rss = self.pss = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def processes(self) -> list[psutil.Process]:
        out = []
        for root in self.roots:
            try:
                out += [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        return out

    def cpu(self) -> float:
        """CPU seconds so far, from each thread's /proc/PID/task/TID/schedstat (nanoseconds: psutil's
        cpu_times counts 10 ms ticks, as coarse as the bare client's whole batch of trivial prompts)."""
        total = 0
        for p in self.processes():
            try:
                for tid in os.listdir(f"/proc/{p.pid}/task"):
                    with open(f"/proc/{p.pid}/task/{tid}/schedstat") as f:
                        total += int(f.read().split()[0])
            except (OSError, ValueError):
                continue  # a thread or process that ended meanwhile
        return total / 1e9

    def sample(self) -> None:
        rss = pss = 0
        for p in self.processes():
            try:
                info = p.memory_full_info()
                rss, pss = rss + info.rss, pss + info.pss
            except psutil.Error:
                continue
        self.rss, self.pss = max(self.rss, rss / MIB), max(self.pss, pss / MIB)

    def __enter__(self) -> Tree:
        self.rss = self.pss = 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass
class Measured:
    t0: float
    t1: float
    files: dict[str, list[str]]
    cpu: float
    rss: float
    pss: float
    notes: dict[str, float] = field(default_factory=dict)


class ToolFailed(Exception):
    """A tool's batch did not finish (its driver died): reported, and the run goes on with the next tool."""


class Driver:
    """bench/real_drivers.py in its own process: its warm-up at start, then one measured batch per ``go``."""

    def __init__(self, python: str, kind: str, spec: dict[str, Any], tmp: Path, env: dict[str, str],
                 others: tuple[int, ...] = (), name: str = "") -> None:
        path = tmp / f"{name or kind}-spec.json"
        path.write_text(json.dumps(spec))
        self.log = tmp / f"{name or kind}.log"
        self.stderr = open(self.log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([python, str(DRIVERS), kind, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        self.tree = Tree(self.proc.pid, *others)
        self.cpu_at_start = self.tree.cpu()
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {kind} driver failed its warm-up; see {self.log}")

    def batch(self, from_start: bool = False) -> Measured:
        """The next batch; ``from_start``: its CPU counted from the process's start (imports, connection)."""
        before = self.cpu_at_start if from_start else self.tree.cpu()
        with self.tree:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        cpu = self.tree.cpu() - before
        if not line:
            self.stderr.flush()
            raise ToolFailed(f"the driver ended early; its log ends: {self.log.read_text()[-1500:]}")
        answer = json.loads(line)
        return Measured(answer["t0"], answer["t1"], answer["files"], cpu, self.tree.rss, self.tree.pss)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def driven(python: str, kind: str, spec: dict[str, Any], tmp: Path, env: dict[str, str], others=()):
    driver = Driver(python, kind, spec, tmp, env, others)
    try:
        for _ in spec["batches"]:
            yield driver.batch()
    finally:
        driver.close()


def driven_cold(python: str, kind: str, spec: dict[str, Any], tmp: Path, env: dict[str, str], others=()):
    """Each batch in a process of its own, timed (wall and CPU) from that process's start, as a user runs a
    script: the interpreter, its imports and its connections count, as ``comfysup submit``'s do. The server's
    warm-up runs first in a process of its own, not measured."""
    Driver(python, kind, {**spec, "batches": []}, tmp, env, others, name=f"{kind}-warm").close()
    for n, batch in enumerate(spec["batches"]):
        t0 = time.time()
        driver = Driver(python, kind, {**spec, "warm": [], "batches": [batch]}, tmp, env, others,
                        name=f"{kind}-cold{n}")
        try:
            measured = driver.batch(from_start=True)
        finally:
            driver.close()
        yield Measured(t0, measured.t1, measured.files, measured.cpu, measured.rss, measured.pss,
                       {"start s": measured.t0 - t0})


def bare_tool(url: str, tmp: Path, warm: list, batches: list, cold: bool = False, fsync: bool = False,
              ahead: bool = False, **_: Any):
    out = tmp / "bare-out"
    out.mkdir()
    yield from (driven_cold if cold else driven)(
        sys.executable, "bare", {"url": url, "warm": warm, "batches": batches, "out": str(out), "fsync": fsync,
                                 "ahead": ahead}, tmp, os.environ.copy())


def proxy_python(venv: Path) -> Path:
    """The bench's own environment for Comfy's proxy and SDK, made on first use from PyPI."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making {venv}: pip install comfy-api-proxy comfy-sdk (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "comfy-api-proxy", "comfy-sdk"], check=True)
    return python


def proxy_versions(venv: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('comfy-api-proxy'), m.version('comfy-sdk'))"
    api, sdk = subprocess.run([str(proxy_python(venv)), "-c", code], check=True, capture_output=True,
                              text=True).stdout.split()
    return f"comfy-api-proxy {api} + comfy-sdk {sdk}"


def proxy_tool(url: str, tmp: Path, warm: list, batches: list, *, kind: str = "sdk", venv: Path, cold: bool = False,
               **_: Any):
    python = proxy_python(venv)
    port = free_port()
    log = tmp / "proxy.log"
    with open(log, "wb") as out:
        proxy = subprocess.Popen([str(venv / "bin" / "comfy-api-proxy"), "run", "--comfyui", url, "--port", str(port)],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/api/v2/health", timeout=1).ok, "comfy-api-proxy",
                   60, proxy, log)
        out = tmp / "sdk-out"
        out.mkdir()
        env = {**os.environ, "COMFY_BASE_URL": f"http://127.0.0.1:{port}"}
        yield from (driven_cold if cold else driven)(str(python), kind, {"warm": warm, "batches": batches,
                                                                         "out": str(out)}, tmp, env, (proxy.pid,))
    finally:
        stop(proxy, signal.SIGINT)


class Work:
    """``comfysup work --config C`` (the CLI, its defaults) against one server; jobs go in through ``comfysup
    submit``. Also bench/real_profile.py's subject."""

    def __init__(self, url: str, tmp: Path, ahead: bool, output_dir: Path | None = None) -> None:
        self.tmp, self.config, self.db = tmp, tmp / "config.toml", tmp / "var" / "queue.db"
        server = {"name": "real", "url": url, **({"output_dir": str(output_dir)} if output_dir else {})}
        self.config.write_bytes(tomli_w.dumps({
            "queue": {"path": str(self.db)}, "store": {"dir": str(tmp / "var" / "results")},
            "servers": [server], "runner": {"queue_ahead": ahead}}).encode())
        self.cli = [sys.executable, "-m", "comfysup"]
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "work.log"

    def submit(self, name: str, batch: list) -> dict[str, str]:
        """Job id -> its filename_prefix, once ``comfysup submit`` has committed them."""
        ids = {str(uuid.uuid4()): prefix_of(p) for p in batch}
        path = self.tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": i, "workflow": p}) + "\n" for i, p in zip(ids, batch, strict=True)))
        subprocess.run([*self.cli, "submit", str(path), "--config", str(self.config)], check=True, capture_output=True)
        return ids

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*self.cli, "work", "--config", str(self.config)], stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def all_ended(self) -> bool:
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'dead', 'cancelled')"
                                ).fetchone()[0] == 0

    def wait(self, what: str) -> None:
        wait_until(self.all_ended, what, 600, self.proc, self.log)

    def records(self, ids: dict[str, str]) -> list:
        from comfysup.config import load_config
        from comfysup.queue import open_queue

        queue = open_queue(load_config(str(self.config), env={}), create=False)
        try:
            return [queue.reads.get(i) for i in ids]
        finally:
            queue.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def comfysup_tool(url: str, tmp: Path, warm: list, batches: list, *, ahead: bool, local: bool = False, **_: Any):
    """Warmed up by its own jobs; each batch measured from the start of ``comfysup submit`` (handing the jobs
    over) to the last job's ``done`` (files in the store, renamed, hashed). ``local``: the server's entry names
    its output folder (``output_dir``), as for a server on the same machine, and the files are read from it."""
    work = Work(url, tmp, ahead, tmp / "comfyui" / "output" if local else None)
    work.submit("warm", warm)
    work.start()
    try:
        work.wait("comfysup work's warm-up")
        tree = Tree(work.proc.pid)
        for n, batch in enumerate(batches):
            before = tree.cpu()
            with tree:
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the submit command, once it is reaped
                t0 = time.time()
                ids = work.submit(f"batch{n}", batch)
                submitted = time.time()
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                work.wait("comfysup work")
            submit_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            cpu = tree.cpu() - before + submit_cpu
            records = work.records(ids)
            files = {ids[r.id]: [o.path for o in r.outputs] for r in records if r.state == "done"}
            yield Measured(t0, max(r.finished_at or 0 for r in records), files, cpu, tree.rss, tree.pss,
                           {"submit s": submitted - t0, SUBMIT_CPU: submit_cpu})
    finally:
        work.stop()


TOOL_RUNS = {
    "bare": bare_tool,
    "bare-cold": lambda *a, **k: bare_tool(*a, cold=True, **k),
    "bare-fsync": lambda *a, **k: bare_tool(*a, fsync=True, **k),
    "bare-ahead": lambda *a, **k: bare_tool(*a, ahead=True, **k),
    "proxy-cold": lambda *a, **k: proxy_tool(*a, kind="sdk", cold=True, **k),
    "comfysup": lambda *a, **k: comfysup_tool(*a, ahead=False, **k),
    "comfysup-ahead": lambda *a, **k: comfysup_tool(*a, ahead=True, local=True, **k),
    "comfysup-view": lambda *a, **k: comfysup_tool(*a, ahead=True, **k),
    "proxy": lambda *a, **k: proxy_tool(*a, kind="sdk", **k),
    "proxy-run": lambda *a, **k: proxy_tool(*a, kind="sdk-run", **k),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="alternating runs (default 7: the tables are medians)")
    parser.add_argument("--trivial", type=int, default=300, help="trivial prompts a run (0: none)")
    parser.add_argument("--slow", type=int, default=30, help="slow prompts a run (0: none)")
    parser.add_argument("--slow-size", type=int, default=768,
                        help="the slow workload's image side in pixels (default 768: ~0.2 s a prompt on this project's "
                             "machine of 2026-12-04; 1024 for the realistic cell of 0.3-1 s)")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(ALL_TOOLS)}")
    parser.add_argument("--quick", action="store_true", help="2 runs, 100 trivial and 10 slow prompts")
    parser.add_argument("--cold", action="store_true",
                        help=f"the tools {', '.join(COLD)}: every batch timed from the start of its client's process "
                             "(the bare client's and the SDK's scripts started for it, as comfysup submit is)")
    parser.add_argument("--proxy-venv", type=Path, default=Path.home() / ".cache" / "comfysup-bench" / "proxy-venv",
                        help="where the proxy and the SDK are installed from PyPI on first use")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the servers it started
    # Every process this bench starts caches its bytecode, as on a user's machine (pip compiles it at install):
    # with PYTHONDONTWRITEBYTECODE set (some CI images and containers do), every `comfysup submit` compiled its
    # modules again, 0.07-0.09 s of a 2 s batch that no other tool's measured batch pays.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.quick:
        args.runs, args.trivial, args.slow = 2, 100, 10
    comfyui_dir = os.environ.get("COMFYUI_DIR")
    if not comfyui_dir:
        parser.error("set COMFYUI_DIR to a ComfyUI checkout that runs with --cpu (and COMFYUI_PYTHON to its Python)")
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    tools = list(COLD) if args.cold else [t for t in args.tools.split(",") if t]
    if unknown := set(tools) - set(ALL_TOOLS):
        parser.error(f"unknown tools: {', '.join(sorted(unknown))}")
    sizes = {w: n for w, n in (("trivial", args.trivial), ("slow", args.slow)) if n > 0}
    workloads = list(sizes)
    proxy = proxy_versions(args.proxy_venv) if {"proxy", "proxy-run", "proxy-cold"} & set(tools) else ""
    labels = {"bare": "bare client (post, socket, /history, /view; nothing durable)",
              "comfysup": "`comfysup work`, queue_ahead = false",
              "comfysup-ahead": "`comfysup work`, queue_ahead = true, output_dir (files read from disk)",
              "comfysup-view": "`comfysup work`, queue_ahead = true, no output_dir (files through /view)",
              "proxy": f"{proxy} (all jobs submitted at once)", "proxy-run": f"{proxy} (client.run, one at a time)",
              "bare-cold": "bare client, its script started for the batch",
              "bare-fsync": "bare client, each file fsynced (the floor: the bare client plus one fsync)",
              "bare-ahead": "bare client, the next prompt posted as one starts (queue-ahead, nothing durable)",
              "proxy-cold": f"{proxy} (all at once), the SDK's script started for the batch"}
    version = subprocess.run([python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import comfyui_version; "
                              "print(comfyui_version.__version__)", comfyui_dir], capture_output=True, text=True)
    load = os.getloadavg()
    print(f"real ComfyUI {version.stdout.strip() or '?'} --cpu ({comfyui_dir}); {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {args.runs} runs; {proxy or 'no proxy'}; slow prompts "
          f"{args.slow_size}x{args.slow_size}")
    print("wall: from handing the jobs over to the last file on disk; exec: ComfyUI's own execution (history "
          "timestamps); beyond = wall - exec; 1st: until ComfyUI started the first prompt; idle: between two "
          "prompts; CPU and memory: the tool's own processes (never the ComfyUI server)\n")
    print(COLUMNS, flush=True)
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for run in range(args.runs):
        turn = run % len(tools)
        for tool in tools[turn:] + tools[:turn]:
            with tempfile.TemporaryDirectory(prefix="comfysup-real-") as name:
                tmp = Path(name)
                base = tmp / "comfyui"
                server, url = start_comfyui(Path(comfyui_dir), python, base)
                warm = [p for w in workloads for p in prompts(w, f"warm{run}_{tool}_{w}", 2, args.slow_size)]
                batches = [prompts(w, f"r{run}_{tool}_{w}", sizes[w], args.slow_size) for w in workloads]
                measured = TOOL_RUNS[tool](url, tmp, warm, batches, venv=args.proxy_venv)
                posted = len(warm)
                try:
                    for workload, batch in zip(workloads, batches, strict=True):
                        load = os.getloadavg()[0]
                        try:
                            m = next(measured)
                        except ToolFailed as exc:
                            failed.append(f"run {run + 1} {workload} {tool}: {exc}")
                            print(f"{run + 1:>3} {workload:<8} {tool:<15} FAILED (see the end)", flush=True)
                            break
                        posted += len(batch)
                        row = {"run": run + 1, "workload": workload, "tool": tool, "n": len(batch), "wall": m.t1 - m.t0,
                               "cpu": m.cpu, "rss": m.rss, "pss": m.pss, "load": load, "notes": m.notes,
                               **verify(url, base, batch, m, posted)}
                        rows.append(row)
                        print(row_line(row), flush=True)
                finally:
                    measured.close()
                    stop(server)
    summary(rows, tools, workloads, labels)
    run_by_run(rows, tools, workloads)
    for line in failed:
        print(f"\nFAILED {line}")
    if failed or any(r["problems"] for r in rows):
        raise SystemExit("some batches failed their verification (see PROBLEMS above)")


if __name__ == "__main__":
    main()
