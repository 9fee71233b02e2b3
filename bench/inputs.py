"""bench/inputs.py: what an input file costs.

One ``comfysup run`` on K fake_comfy servers (launched by the supervisor as ComfyUI would be), two batches side
by side in the same run: N jobs without an input (the trivial workflow), then N jobs that all share one input
PNG of about 5 MB (LoadImage → ImageInvert → SaveImage). Reports, per batch, the wall time and the CPU ms per
job of comfysup's processes (runners, supervisor, monitor; the servers excluded), their ratio, how many times
the shared input was uploaded (once per server is the promise), and the asset store's size against the total
size of the inputs the jobs name. Ratios only, no timed assertions.

    .venv/bin/python bench/inputs.py                 # N = 1000, K = 2
    .venv/bin/python bench/inputs.py --quick         # N = 200
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself must not be on the path (its queue.py would shadow the standard library's queue module).
sys.path[:] = [str(ROOT), str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
import uuid

import psutil
import tomli_w
from input_images import INVERT, random_png

TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
INPUT_BYTES = 5 * 2**20


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1] + 0


def cpu_seconds(sup: psutil.Process) -> float:
    """CPU seconds so far of the supervisor and its comfysup children (runners, monitor), servers excluded."""
    total = sum(sup.cpu_times()[:2])
    for child in sup.children():
        try:
            if child.name().startswith("comfysup-"):
                total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def left(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'dead')").fetchone()[0]
    except sqlite3.OperationalError:
        return 1


def batch(tmp: Path, name: str, config: Path, jobs: list[dict], sup: psutil.Process, db: Path,
          seconds: float) -> tuple[float, float, int]:
    """Submit ``jobs``, wait until they have all ended: (wall s from submit to the last end, comfysup CPU s,
    jobs done)."""
    path = tmp / f"{name}.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    cpu0, t0 = cpu_seconds(sup), time.monotonic()
    subprocess.run([sys.executable, "-m", "comfysup", "submit", str(path), "--config", str(config)], check=True,
                   capture_output=True, cwd=ROOT)
    deadline = t0 + seconds
    while left(db) > 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: not finished in {seconds:.0f} s; see {tmp / 'supervisor.log'}")
        time.sleep(0.05)
    wall, cpu = time.monotonic() - t0, cpu_seconds(sup) - cpu0
    ids = [j["id"] for j in jobs]
    with sqlite3.connect(db) as conn:
        done = conn.execute(f"SELECT count(*) FROM jobs WHERE state = 'done' AND id IN ({','.join('?' * len(ids))})",
                            ids).fetchone()[0]
    return wall, cpu, done


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def run(n: int, k: int, node_ms: float, tmp: Path) -> None:
    config = tmp / "config.toml"
    var = tmp / "var"
    config.write_bytes(tomli_w.dumps({
        "queue": {"path": str(var / "queue.db")}, "store": {"dir": str(var / "results")},
        "assets": {"dir": str(var / "assets")},
        "comfyui": {"main": str(ROOT / "fake_comfy" / "main.py"), "python": sys.executable, "gpus": f"cpu:{k}",
                    "base_port": free_port(), "base_directory": str(var / "comfyui"),
                    "extra_args": ["--node-ms", str(node_ms)], "startup_seconds": 30.0},
        "runner": {"jitter": False}, "metrics": {"listen": "127.0.0.1:0"}}).encode())
    (tmp / "invert.json").write_text(json.dumps(INVERT))
    (tmp / "shared.png").write_bytes(random_png(1, 16, 16, pad=INPUT_BYTES))
    input_size = (tmp / "shared.png").stat().st_size
    plain = [{"id": str(uuid.uuid4()), "workflow": TRIVIAL, "set": {"1.color": i, "3.filename_prefix": f"p{i}"}}
             for i in range(n)]
    with_input = [{"id": str(uuid.uuid4()), "workflow": "invert.json",
                   "set": {"1.image": {"file": "shared.png"}, "3.filename_prefix": f"i{i}"}} for i in range(n)]
    warm = [{"id": str(uuid.uuid4()), "workflow": TRIVIAL, "set": {"1.color": 10**6 + i}} for i in range(2 * k)]
    log = open(tmp / "supervisor.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(config)], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT)
    db = var / "queue.db"
    try:
        sup = psutil.Process(proc.pid)
        limit = 120 + n * 0.5
        batch(tmp, "warm", config, warm, sup, db, limit)  # start-up is not per-job work
        results = {"without an input": batch(tmp, "plain", config, plain, sup, db, limit),
                   "with one shared 5 MB input": batch(tmp, "inputs", config, with_input, sup, db, limit)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        log.close()
    uploads = (tmp / "supervisor.log").read_text(errors="replace").count("uploaded input ")
    store = folder_bytes(var / "assets")
    print(f"comfysup run on {k} fake servers, prompts of 3 nodes x {node_ms:g} ms, N = {n} jobs a batch; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'batch':<28} {'done':>6} {'wall s':>8} {'jobs/s':>8} {'CPU ms/job':>11}")
    for name, (wall, cpu, done) in results.items():
        print(f"{name:<28} {done:>6} {wall:>8.2f} {n / wall:>8.1f} {cpu / n * 1000:>11.2f}")
    (w0, c0, _d0), (w1, c1, _d1) = results.values()
    print(f"with input / without: wall {w1 / w0:.2f}x, comfysup CPU per job {c1 / c0:.2f}x "
          f"(+{(c1 - c0) / n * 1000:.2f} ms a job)")
    print(f"uploads of the shared input: {uploads} for {k} servers ({uploads / k:.2f} per server)")
    named = input_size * n
    print(f"asset store {store:,} bytes for inputs named {n} times, {named:,} bytes in all: "
          f"{store / named:.4f} of the total ({store / input_size:.2f}x one input)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a batch (default 1000)")
    parser.add_argument("--k", type=int, default=2, help="fake servers (default 2)")
    parser.add_argument("--node-ms", type=float, default=2.0, help="each node's time on the fake (default 2)")
    parser.add_argument("--quick", action="store_true", help="200 jobs a batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="comfysup-inputs-") as name:
        run(200 if args.quick else args.jobs, args.k, args.node_ms, Path(name))


if __name__ == "__main__":
    main()
