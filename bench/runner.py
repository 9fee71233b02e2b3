"""bench/runner.py: what comfysup's durability costs per job, beside a bare client, in one run.

N jobs through `comfysup work` against fake_comfy servers (separate processes) whose prompts take a
fixed time, and the same N prompts through a bare client (post, wait for success on the WebSocket,
read /history, download the file; nothing durable). Prints jobs per second, the overhead per job in
ms against the bare client, and the runner process's peak memory.

    .venv/bin/python bench/runner.py                 # N=200, node_ms 0 and 20 (3 nodes a prompt)
    .venv/bin/python bench/runner.py --jobs 500 --node-ms 0,5,50
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and bench/queue.py would shadow the standard
# library's queue module for everything imported after it: it goes last, where it still gives real_drivers.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import requests
import tomli_w
import websocket
from real_drivers import wait_for_end

from comfysup.comfy import probe

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
NODES = len(TRIVIAL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fake(base: Path, node_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fake_comfy", "--listen", "127.0.0.1", "--port", str(port),
                             "--base-directory", str(base), "--node-ms", str(node_ms)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if probe.answers(url, timeout_seconds=0.5):
            return proc, url
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("fake_comfy did not start")


def prompt(n: int, salt: int) -> dict:
    workflow = json.loads(json.dumps(TRIVIAL))
    workflow["1"]["inputs"]["color"] = (n * 7919 + salt) % 16777216  # never served from the cache
    workflow["3"]["inputs"]["filename_prefix"] = f"b{salt}_{n}"
    return workflow


def bare_client(url: str, n_jobs: int, salt: int, out: Path) -> float:
    """The least a client can do: one socket, post, wait for success, read history, download."""
    session = requests.Session()
    client_id = str(uuid.uuid4())
    ws = websocket.create_connection(f"ws{url[4:]}/ws?clientId={client_id}", timeout=30)
    start = time.perf_counter()
    for n in range(n_jobs):
        prompt_id = str(uuid.uuid4())
        session.post(f"{url}/prompt", json={"prompt": prompt(n, salt), "prompt_id": prompt_id,
                                            "client_id": client_id}, timeout=30).raise_for_status()
        wait_for_end(ws, prompt_id)
        entry = session.get(f"{url}/history/{prompt_id}", timeout=30).json()[prompt_id]
        for image in entry["outputs"]["3"]["images"]:
            body = session.get(f"{url}/view", params=image, timeout=30).content
            (out / image["filename"]).write_bytes(body)
    elapsed = time.perf_counter() - start
    ws.close()
    return elapsed


def comfysup_run(urls: list[str], n_jobs: int, salt: int, tmp: Path) -> tuple[float, float]:
    """Submit N jobs, run `comfysup work --until-empty`; the span from the first claim to the last done."""
    config = tmp / "config.toml"
    config.write_bytes(tomli_w.dumps({
        "queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store")},
        "runner": {"poll_seconds": 1.0, "jitter": False}}).encode())
    jobs = tmp / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"id": str(uuid.uuid4()), "workflow": prompt(n, salt)}) + "\n"
                            for n in range(n_jobs)))
    subprocess.run([sys.executable, "-m", "comfysup", "submit", str(jobs), "--config", str(config)], check=True,
                   capture_output=True, cwd=ROOT)
    servers = [arg for i, url in enumerate(urls) for arg in ("--server", f"s{i}={url}")]
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "work", "--until-empty", "--config", str(config),
                             *servers], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    peak = 0.0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            children = ps.children(recursive=True)
            peak = max(peak, max((c.memory_info().rss for c in children), default=0) / 2**20)
        except psutil.Error:
            pass
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.read().decode())
    import sqlite3

    db = sqlite3.connect(tmp / "queue.db")
    first, last, done = db.execute("SELECT min(a.started_at), max(j.finished_at), sum(j.state = 'done') "
                                   "FROM jobs j JOIN attempts a ON a.job_id = j.id").fetchone()
    db.close()
    if done != n_jobs:
        raise SystemExit(f"only {done} of {n_jobs} jobs done")
    return last - first, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--node-ms", default="0,20", help="comma-separated; a prompt runs 3 nodes")
    args = parser.parse_args()
    print(f"{args.jobs} jobs, one server, one runner; {os.cpu_count()} CPUs")
    print(f"{'T (ms)':>7} {'bare jobs/s':>12} {'comfysup jobs/s':>16} {'overhead ms/job':>16} "
          f"{'ratio':>6} {'runner RSS MiB':>15}")
    for node_ms in (float(x) for x in args.node_ms.split(",")):
        with tempfile.TemporaryDirectory(prefix="comfysup-bench-") as tmp_name:
            tmp = Path(tmp_name)
            fake, url = start_fake(tmp / "fake", node_ms)
            try:
                (tmp / "bare").mkdir()
                bare_client(url, 10, 1, tmp / "bare")  # warm-up
                bare = bare_client(url, args.jobs, 2, tmp / "bare")
                ours, rss = comfysup_run([url], args.jobs, 3, tmp)
            finally:
                fake.terminate()
                fake.wait()
        overhead = (ours - bare) / args.jobs * 1000
        print(f"{node_ms * NODES:>7.0f} {args.jobs / bare:>12.1f} {args.jobs / ours:>16.1f} {overhead:>16.2f} "
              f"{bare / ours:>6.2f} {rss:>15.1f}")


if __name__ == "__main__":
    main()
