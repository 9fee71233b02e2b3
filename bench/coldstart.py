"""bench/coldstart.py: how long the first job takes after `comfysup run` starts, with and without `[comfyui] warmup`.

One slot (`gpus = "cpu:1"`) of fake_comfy launched by `comfysup run` exactly as ComfyUI would be, whose checkpoint
loader costs `--load-ms` the first time it loads a model (a real server's cold start: reading the weights, the first
kernels) and whose nodes take `--node-ms`. The job is a trivial image job with a CheckpointLoaderSimple linked in;
the warm-up workflow (`[comfyui] warmup`) loads the same checkpoint. Two measures, each the median of `--repeats`
fresh installations:

- **queued before the start**: the job is in the queue when `comfysup run` starts; time from the start to its
  `done`. A warm-up cannot make this faster (the server warms up, then runs the job): it shows what the warm-up
  costs when work is already waiting.
- **sent when ready**: `comfysup run` starts with an empty queue; once the machine says it is ready (GET /ready 200
  on the status server: a warm slot with the warm-up, a running one without), one job is submitted (`comfysup
  submit`, a process start included) and timed to its `done`: the first job a load balancer sends. With the
  warm-up it no longer pays the model load.

    .venv/bin/python bench/coldstart.py                      # load 2000 ms, nodes 20 ms, 5 repeats
    .venv/bin/python bench/coldstart.py --load-ms 8000 --repeats 3
    .venv/bin/python bench/coldstart.py --comfyui /work/comfyui --python /work/comfyui-venv/bin/python --repeats 3

Beside them, the **bare ComfyUI** the goal compares with: the same server started directly (the command line
comfysup gives it, from its start to its answering at 10 ms polls), the same job posted at once (POST /prompt)
and polled at 10 ms on GET /history/{id}: its start plus its first prompt. It runs alternately with the
queued-before-the-start cells, and ``comfysup - bare`` is the median of the paired differences (the goal: at
most 0.5 s without a warm-up).

With ``--comfyui`` the server is a real ComfyUI (its main.py, run with ``--python``) on the CPU, and the job a
model-free graph with real work (EmptyImage 768², ImageBlur, ImageInvert, SaveImage; the warm-up the same graph
into a PreviewImage): its cold start is ComfyUI's own start-up (torch, its nodes) and the first prompt's lazy work.
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/queue.py must not shadow the standard library's queue: this folder goes last, where it still gives real.py
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import json
import sqlite3
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

import requests
import tomli_w
from real import stop

ROOT = HERE.parent
TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
CHECKPOINT = "sd15.safetensors"


REAL = {"1": {"class_type": "EmptyImage", "inputs": {"width": 768, "height": 768, "batch_size": 1, "color": 8421504}},
        "5": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 15, "sigma": 4.0}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["5", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "coldstart"}}}
"""The job on a real ComfyUI: no model file needed, some real work for the CPU."""


def workflow(real: bool = False) -> dict[str, Any]:
    """The trivial job with a checkpoint loader linked in: the fake costs --load-ms when its model changes (on a
    real ComfyUI: REAL)."""
    if real:
        return json.loads(json.dumps(REAL))
    graph = json.loads(json.dumps(TRIVIAL))
    graph["4"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}}
    graph["2"]["inputs"]["model_hint"] = ["4", 0]  # an input ImageInvert ignores, linking the loader in
    return graph


def install(folder: Path, warmup: bool, load_ms: float, node_ms: float, real: tuple[str, str] | None = None) -> Path:
    """``real``: (a ComfyUI checkout, its Python), else fake_comfy."""
    (folder / "warmup.json").write_text(json.dumps({**workflow(real is not None), "3": {
        "class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}))
    fake = ["--node-ms", str(node_ms), "--load-ms", str(load_ms), "--models", f"checkpoints={CHECKPOINT}"]
    comfyui: dict[str, Any] = {"main": str(ROOT / "fake_comfy" / "main.py"), "gpus": "cpu:1",
                               "base_port": free_base_port(), "extra_args": fake, "startup_seconds": 60.0}
    if real is not None:
        comfyui.update(main=str(Path(real[0]) / "main.py"), python=real[1], extra_args=[], startup_seconds=180.0)
    if warmup:
        comfyui["warmup"] = "warmup.json"
    doc = {"queue": {"path": "var/queue.db"}, "store": {"dir": "var/results"}, "comfyui": comfyui,
           "runner": {"poll_seconds": 0.2}, "metrics": {"listen": "127.0.0.1:0"}, "api": {"listen": ""}}
    path = folder / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path


def free_base_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def submit(config: Path, job: str, real: bool = False) -> None:
    jobs = config.parent / f"jobs-{job[:8]}.jsonl"
    jobs.write_text(json.dumps({"id": job, "workflow": workflow(real)}) + "\n")
    out = subprocess.run([sys.executable, "-m", "comfysup", "submit", str(jobs), "--config", str(config)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"submit failed: {out.stderr}")


def wait(condition: Any, seconds: float, what: str, step: float = 0.01) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise SystemExit(f"timed out waiting for {what}")


def done(config: Path, job: str) -> bool:
    try:
        with sqlite3.connect(f"file:{config.parent / 'var' / 'queue.db'}?mode=ro", uri=True, timeout=1) as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job,)).fetchone()
    except sqlite3.Error:
        return False
    if row and row[0] not in ("queued", "running", "done"):
        raise SystemExit(f"job {job} ended {row[0]}")
    return bool(row and row[0] == "done")


def ready(config: Path) -> bool:
    try:
        state = json.loads((config.parent / "var" / "supervisor.json").read_text())
        url = state.get("metrics_url")
        return bool(url) and requests.get(f"{url}ready", timeout=1).status_code == 200
    except (OSError, ValueError, requests.RequestException):
        return False


def once(warmup: bool, queued_first: bool, load_ms: float, node_ms: float,
         real: tuple[str, str] | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        config = install(Path(tmp), warmup, load_ms, node_ms, real)
        job = str(uuid.uuid4())
        if queued_first:
            submit(config, job, real is not None)
        with open(Path(tmp) / "run.log", "wb") as log:
            start = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(config)], cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                return measure(config, job, queued_first, start, real is not None)
            finally:
                stop(proc)


def bare_once(load_ms: float, node_ms: float, real: tuple[str, str] | None = None) -> dict[str, float]:
    """A bare ComfyUI: started as comfysup starts it, the job posted as soon as it answers, timed to its history
    entry: a user's script with nothing between it and the server."""
    with tempfile.TemporaryDirectory(prefix="coldstart-bare-") as tmp:
        base = Path(tmp) / "comfyui"
        (base / "custom_nodes").mkdir(parents=True)
        port = free_base_port()
        main_py = str(Path(real[0]) / "main.py") if real else str(ROOT / "fake_comfy" / "main.py")
        extra = [] if real else ["--node-ms", str(node_ms), "--load-ms", str(load_ms), "--models",
                                 f"checkpoints={CHECKPOINT}"]
        command = [real[1] if real else sys.executable, main_py, "--listen", "127.0.0.1", "--port", str(port),
                   "--cpu", "--base-directory", str(base), "--database-url", f"sqlite:///{base / 'comfyui.db'}",
                   *extra]
        url = f"http://127.0.0.1:{port}"
        with open(Path(tmp) / "comfyui.log", "wb") as log:
            start = time.monotonic()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                with requests.Session() as http:
                    wait(lambda: answering(http, url), 300, "the bare ComfyUI")
                    answered = time.monotonic() - start
                    prompt_id = http.post(f"{url}/prompt", json={"prompt": workflow(real is not None)},
                                          timeout=30).json()["prompt_id"]
                    wait(lambda: http.get(f"{url}/history/{prompt_id}", timeout=30).json(), 300, "its prompt")
                return {"answered": answered, "run_to_done": time.monotonic() - start}
            finally:
                stop(proc)


def answering(http: requests.Session, url: str) -> bool:
    try:
        return http.get(f"{url}/system_stats", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def measure(config: Path, job: str, queued_first: bool, start: float, real: bool = False) -> dict[str, float]:
    out: dict[str, float] = {}
    if not queued_first:
        wait(lambda: ready(config), 300, "GET /ready 200", step=0.02)
        out["run_to_ready"] = time.monotonic() - start
        sent = time.monotonic()
        submit(config, job, real)
        wait(lambda: done(config, job), 300, "the job")
        out["submit_to_done"] = time.monotonic() - sent
    else:
        wait(lambda: done(config, job), 300, "the job")
    out["run_to_done"] = time.monotonic() - start
    return out


def cell_of(samples: dict[bool, list[dict[str, float]]], warmup: bool) -> list[float]:
    return [s["run_to_done"] for s in samples[warmup]]


def spread(values: list[float]) -> str:
    return f"run→done {min(values):.2f}-{max(values):.2f}" if values else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-ms", type=float, default=2000.0, help="the fake's first model load (default 2000)")
    parser.add_argument("--node-ms", type=float, default=20.0, help="each node's time (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="fresh installations per cell (default 5)")
    parser.add_argument("--comfyui", metavar="DIR", help="a real ComfyUI checkout instead of fake_comfy (on the CPU)")
    parser.add_argument("--python", default=sys.executable, help="the Python of --comfyui's environment")
    args = parser.parse_args()
    real = (args.comfyui, args.python) if args.comfyui else None
    if real:
        print(f"ComfyUI at {args.comfyui} (--cpu), 1 slot, the REAL graph, median of {args.repeats}")
    else:
        print(f"fake_comfy, 1 slot, load {args.load_ms:g} ms, nodes {args.node_ms:g} ms, median of {args.repeats}")
    print(f"{'measure':<22} {'warm-up':<8} {'run→ready s':>12} {'submit→done s':>14} {'run→done s':>11}  spread")
    print("(bare ComfyUI: run→ready is its start to its first answer; run→done its start to the job's history entry)")
    bare: list[dict[str, float]] = []
    for queued_first in (True, False):
        samples: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            if queued_first:  # the bare ComfyUI beside the cells it is the goal of
                bare.append(bare_once(args.load_ms, args.node_ms, real))
            for warmup in (False, True):  # alternated, so a slow moment of the machine hits both alike
                samples[warmup].append(once(warmup, queued_first, args.load_ms, args.node_ms, real))
        for warmup in (False, True):
            def median(key: str, cell: list[dict[str, float]] = samples[warmup]) -> str:
                values = [s[key] for s in cell if key in s]
                return f"{statistics.median(values):.2f}" if values else "-"

            name = "queued before start" if queued_first else "sent when ready"
            print(f"{name:<22} {'yes' if warmup else 'no':<8} {median('run_to_ready'):>12} "
                  f"{median('submit_to_done'):>14} {median('run_to_done'):>11}  {spread(cell_of(samples, warmup))}",
                  flush=True)
        if queued_first:
            done_s = [b["run_to_done"] for b in bare]
            print(f"{'bare ComfyUI':<22} {'-':<8} {statistics.median(b['answered'] for b in bare):>12.2f} {'-':>14} "
                  f"{statistics.median(done_s):>11.2f}  {spread(done_s)}")
            paired = [s["run_to_done"] - b for s, b in zip(samples[False], done_s, strict=True)]
            print(f"comfysup - bare (no warm-up, paired): median {statistics.median(paired):+.2f} s "
                  f"({min(paired):+.2f} to {max(paired):+.2f}); goal at most +0.50 s: "
                  f"{'met' if statistics.median(paired) <= 0.5 else 'not met'}", flush=True)


if __name__ == "__main__":
    main()
