"""bench/api.py: the Comfy API v2 beside comfysup's own front door, in one run.

1. submit: N jobs (the trivial workflow, each with its own width) as ``POST /api/v2/jobs`` by 1 and by C concurrent
   httpx clients and by comfy-sdk's ``client.submit`` (one client), each into a fresh queue behind a ``comfysup api``
   process, against ``comfysup submit jobs.jsonl`` of the same jobs (the whole command, on a fresh queue; and without
   its start-up, which is measured on a one-line file): jobs/s and the ratio to submit.
2. ``GET /api/v2/jobs/{id}`` of random ids: p50/p99 on a queue of 1,000 jobs and on one of 1,000,000 (filled through
   the queue's own batch submit, ``SQLiteQueue.submit``), one API process each, requests alternating between them so
   the machine's load hits both alike; the ratio big/small.
3. S event streams (1,000; ten on each of S/10 running jobs) on one API process: its RSS, PSS and USS before and
   with them open, and its CPU while they are idle; then a stand-in runner process writes progress
   (``queue.leases.set_progress``) to every job once a second at a random moment of it, W times, and each stream's delay
   from the write to the ``progress`` event it receives, p50/p99 (the watcher reads every WATCH_SECONDS; the
   clients' own parsing, one event loop for all of them, is in the figure).

    .venv/bin/python bench/api.py            # N = 2,000, 1,000,000 jobs, 1,000 streams, 10 writes each
    .venv/bin/python bench/api.py --quick    # N = 300, 100,000 jobs, 1,000 streams, 5 writes each
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx
import psutil
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.api_proxy import cpu_seconds, memory, wait_healthy
from comfysup.api.events import WATCH_SECONDS
from comfysup.queue.base import NewJob
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.workflows import canonical

TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
COMFYSUP = [sys.executable, "-m", "comfysup"]
CTX = multiprocessing.get_context("fork")
FILL_BATCH = 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_id(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench-api/{n}"))


def graph(n: int) -> dict[str, Any]:
    g = json.loads(json.dumps(TRIVIAL))
    g["1"]["inputs"]["width"] = 64 + n % 64
    g["1"]["inputs"]["height"] = 64 + n // 64 % 64
    return g


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def config_file(folder: Path, port: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"queue": {"path": str(folder / "queue.db")}, "store": {"dir": str(folder / "store")},
           "comfyui": {"gpus": "cpu:1"}, "api": {"listen": f"127.0.0.1:{port}"}}
    path = folder / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path


@contextmanager
def api_process(folder: Path) -> Iterator[tuple[str, psutil.Process]]:
    """``comfysup api`` on a free port over the queue in ``folder``; its URL and process while the block runs."""
    port = free_port()
    config = config_file(folder, port)
    proc = subprocess.Popen([*COMFYSUP, "api", "--config", str(config)], cwd=folder, stdout=subprocess.DEVNULL,
                            stderr=open(folder / "api.log", "wb"))  # noqa: SIM115  (closed with the process)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, folder / "api.log", "comfysup api")
    try:
        yield url, psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


# -- 1. submits per second -----------------------------------------------------------------------------------

def post_all(url: str, ns: list[int], clients: int) -> float:
    """Seconds to POST jobs ``ns`` with ``clients`` threads, each its own keep-alive httpx client."""
    shares = [ns[i::clients] for i in range(clients)]
    failures: list[str] = []

    def work(share: list[int]) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            for n in share:
                r = client.post("/api/v2/jobs", json={"workflow": graph(n)}, headers={"Idempotency-Key": job_id(n)})
                if r.status_code != 201:
                    failures.append(r.text)
    threads = [threading.Thread(target=work, args=(s,)) for s in shares]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"{len(failures)} submits failed, first: {failures[0]}")
    return time.perf_counter() - started


def sdk_all(url: str, ns: list[int]) -> float:
    from comfy_sdk import Comfy

    os.environ["COMFY_BASE_URL"] = url  # the SDK reads its deployment from the environment, as its README says
    os.environ.pop("COMFY_API_KEY", None)
    with Comfy() as client:
        started = time.perf_counter()
        for n in ns:
            client.submit(client.workflows.from_json(graph(n)), idempotency_key=job_id(n))
        return time.perf_counter() - started


def queued(folder: Path) -> int:
    conn = sqlite3.connect(folder / "queue.db")
    try:
        return conn.execute("SELECT count(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
    finally:
        conn.close()


def cli_submit(folder: Path, ns: list[int]) -> float:
    config = config_file(folder)
    lines = folder / "jobs.jsonl"
    lines.write_text("".join(json.dumps({"id": job_id(n), "workflow": graph(n)}) + "\n" for n in ns))
    started = time.perf_counter()
    subprocess.run([*COMFYSUP, "submit", str(lines), "--config", str(config)], check=True, cwd=folder,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def submits(work: Path, n: int, clients: int, proxy_venv: Path | None = None) -> None:
    """Every front door on a fresh queue; the API's and the proxy's rows also give their server process's CPU."""
    ns = list(range(n))
    rows: list[tuple[str, float, float | None]] = []
    whole = cli_submit(work / "cli", ns)
    start_up = cli_submit(work / "cli-one", [n])
    assert queued(work / "cli") == n
    rows.append(("comfysup submit jobs.jsonl (whole command)", whole, None))
    rows.append(("comfysup submit, without its start-up", max(1e-9, whole - start_up), None))
    for name, run in (("API, httpx, 1 client", lambda url: post_all(url, ns, 1)),
                      (f"API, httpx, {clients} clients", lambda url: post_all(url, ns, clients)),
                      ("API, comfy-sdk client.submit, 1 client", lambda url: sdk_all(url, ns))):
        folder = work / name.replace(" ", "").replace(",", "-").replace(".", "")
        with api_process(folder) as (url, proc):
            cpu = cpu_seconds(proc)
            seconds = run(url)
            cpu = cpu_seconds(proc) - cpu
        assert queued(folder) == n, f"{name}: {queued(folder)} of {n} jobs queued"
        rows.append((name, seconds, cpu))
    note = ""
    if proxy_venv is None:
        note = "; comfy-api-proxy: not run (give --proxy-venv)"
    else:
        from bench.api_proxy import proxy_process

        for name, count in (("comfy-api-proxy, httpx, 1 client", 1), (f"comfy-api-proxy, httpx, {clients} clients",
                                                                       clients)):
            with proxy_process(proxy_venv, work / name.replace(" ", "").replace(",", "-")) as (url, proc):
                cpu = cpu_seconds(proc)
                seconds = post_all(url, [m + count * n for m in ns], count)  # ids of its own: a fresh proxy each
                cpu = cpu_seconds(proc) - cpu
            rows.append((name, seconds, cpu))
    print(f"\n## 1. submit {n:,} jobs (trivial workflow, one input different per job); start-up of the command "
          f"{start_up:.2f} s{note}")
    base = rows[1][1]
    print(f"{'front door':>44} {'s':>7} {'jobs/s':>8} {'/ submit':>9} {'server CPU ms/job':>18}")
    for name, seconds, cpu in rows:
        print(f"{name:>44} {seconds:>7.2f} {n / seconds:>8,.0f} {base / seconds:>9.2f} "
              f"{'-' if cpu is None else f'{cpu / n * 1000:.2f}':>18}")


# -- 2. GET /api/v2/jobs/{id} on a big queue -------------------------------------------------------------------

def fill(folder: Path, jobs: int) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    q = SQLiteQueue(folder / "queue.db")
    template = canonical(TRIVIAL)
    started = time.perf_counter()
    for start in range(0, jobs, FILL_BATCH):
        q.intake.submit(NewJob(id=job_id(n), workflow=TRIVIAL, spec_hash=f"h{n}", template_json=template,
                        params={"1.width": 64 + n % 64}, workflow_name="trivial", model_key="")
                 for n in range(start, min(jobs, start + FILL_BATCH)))
    seconds = time.perf_counter() - started
    q.close()
    return seconds


def gets(work: Path, big: int, requests: int) -> None:
    sizes = (1000, big)
    for size in sizes:
        seconds = fill(work / f"q{size}", size)
        print(f"filled {size:,} jobs through SQLiteQueue.submit in {seconds:.1f} s ({size / seconds:,.0f} jobs/s)",
              flush=True)
    with api_process(work / "q1000") as (small_url, _), api_process(work / f"q{big}") as (big_url, _), \
            httpx.Client(timeout=30) as client:
        times: dict[int, list[float]] = {s: [] for s in sizes}
        rng = random.Random(7)
        for i in range(requests * 2 + 100):
            size = sizes[i % 2]
            url = small_url if size == 1000 else big_url
            n = rng.randrange(size)
            started = time.perf_counter()
            r = client.get(f"{url}/api/v2/jobs/{job_id(n)}")
            took = time.perf_counter() - started
            assert r.status_code == 200 and r.json()["id"] == job_id(n), r.text
            if i >= 100:  # the first 50 of each warm the caches and the connections
                times[size].append(took)
    print(f"\n## 2. GET /api/v2/jobs/{{id}} of random ids, {requests:,} requests each, alternating; ms")
    print(f"{'jobs in the queue':>18} {'p50':>7} {'p99':>7} {'max':>7}")
    for size in sizes:
        t = times[size]
        print(f"{size:>18,} {pct(t, 0.5) * 1000:>7.2f} {pct(t, 0.99) * 1000:>7.2f} {max(t) * 1000:>7.2f}")
    s, b = times[sizes[0]], times[sizes[1]]
    print(f"{'ratio big/small':>18} {pct(b, 0.5) / pct(s, 0.5):>7.2f} {pct(b, 0.99) / pct(s, 0.99):>7.2f}")


# -- 3. event streams ----------------------------------------------------------------------------------------------

def runner(db: str, ids: list[str], writes: int, go: Any, out: Any) -> None:
    """The stand-in runner: claims every job, then writes progress to each once a second; the wall time of each
    write, by (job, step), goes back through ``out``."""
    q = SQLiteQueue(Path(db), create=False)
    claims = {}
    while (claim := q.leases.claim("bench/1/gpu0/t", "gpu0", 600.0)) is not None:
        claims[claim.id] = claim
    assert sorted(claims) == sorted(ids)
    out.send("claimed")
    go.wait()
    stamps: dict[tuple[str, int], float] = {}
    rng = random.Random(11)
    began = time.monotonic()
    for step in range(1, writes + 1):
        # Each job's write at its own random moment of the second, as runners that know nothing of each other (or
        # of the watcher's ticks) write: the delay is measured at every phase of the watch interval.
        for at, job in sorted((rng.uniform(0, 1), job) for job in ids):
            time.sleep(max(0.0, began + step - 1 + at - time.monotonic()))
            q.leases.set_progress(claims[job], {"phase": "running", "node": 2, "nodes": 3, "node_id": "2",
                                         "class_type": "KSampler", "step": step, "steps": writes})
            stamps[(job, step)] = time.time()
    out.send(stamps)
    q.close()


async def clients(url: str, ids: list[str], per_job: int, opened: asyncio.Event,
                  got: list[tuple[str, int, float]], status: list[int]) -> None:
    """``per_job`` streams on each job, read to their end; each progress event as (job, step, wall time)."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def one(job: str) -> None:
            async with session.get(f"{url}/api/v2/jobs/{job}/events") as r:
                assert r.status == 200, await r.text()
                event = ""
                async for raw in r.content:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "status":
                        status.append(1)
                        if len(status) == len(ids) * per_job:
                            opened.set()
                    elif line.startswith("data: ") and event == "progress":
                        got.append((job, json.loads(line[6:])["step"], time.time()))
        await asyncio.gather(*(one(job) for job in ids for _ in range(per_job)))


def streams(work: Path, count: int, writes: int) -> None:
    per_job = 10
    jobs = count // per_job
    folder = work / "streams"
    fill(folder, jobs)
    ids = [job_id(n) for n in range(jobs)]
    go, (mine, theirs) = CTX.Event(), CTX.Pipe()
    proc = CTX.Process(target=runner, args=(str(folder / "queue.db"), ids, writes, go, theirs))
    proc.start()
    assert mine.recv() == "claimed"
    with api_process(folder) as (url, api):
        for job in ids[:20]:  # warm: every code path of a GET and a stream has run once
            httpx.get(f"{url}/api/v2/jobs/{job}")
        before = memory(api)
        got: list[tuple[str, int, float]] = []
        status: list[int] = []
        result: dict[str, Any] = {}

        def loop() -> None:
            async def main() -> None:
                opened = asyncio.Event()
                task = asyncio.create_task(clients(url, ids, per_job, opened, got, status))
                await asyncio.wait_for(opened.wait(), 120)
                result["opened"] = time.monotonic()
                result["ready"].set()
                await task
            result["ready"] = threading.Event()
            asyncio.run(main())
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        while "ready" not in result:
            time.sleep(0.01)
        assert result["ready"].wait(180), "the streams did not all open"
        time.sleep(1.0)  # settle: every stream's first frames are written
        with_streams = memory(api)
        cpu0, t0 = cpu_seconds(api), time.monotonic()
        time.sleep(5.0)
        idle_cpu = (cpu_seconds(api) - cpu0) / (time.monotonic() - t0)
        go.set()
        cpu0, t0 = cpu_seconds(api), time.monotonic()
        stamps = mine.recv()
        busy_cpu = (cpu_seconds(api) - cpu0) / (time.monotonic() - t0)
        proc.join(30)
        time.sleep(2 * WATCH_SECONDS + 0.5)  # the last write's events reach every stream
        peak = memory(api)
        delays = [at - stamps[(job, step)] for job, step, at in got if (job, step) in stamps]
    thread.join(0)  # the clients end with the API process (their streams are closed by its SIGTERM)
    expected = count * writes
    print(f"\n## 3. {count:,} event streams ({per_job} on each of {jobs} running jobs), one API process")
    print(f"{'API process, MiB':>24} {'RSS':>8} {'PSS':>8} {'USS':>8}")
    for name, m in (("before the streams", before), (f"with {count:,} open", with_streams),
                    ("after the progress", peak)):
        print(f"{name:>24} {m[0]:>8.1f} {m[1]:>8.1f} {m[2]:>8.1f}")
    print(f"{'per stream, KiB':>24} {(with_streams[0] - before[0]) * 1024 / count:>8.1f} "
          f"{(with_streams[1] - before[1]) * 1024 / count:>8.1f} {(with_streams[2] - before[2]) * 1024 / count:>8.1f}")
    print(f"API CPU: {idle_cpu * 100:.1f}% of a core with the streams idle (the watcher reads {jobs} jobs every "
          f"{WATCH_SECONDS:g} s), {busy_cpu * 100:.1f}% while {jobs} progress writes a second reach {count:,} "
          f"streams")
    print(f"progress write -> event at the client: {len(delays):,} events of {expected:,} writes (a write that the "
          f"job's next one replaced within one watch interval is not sent: progress is a snapshot); "
          f"p50 {pct(delays, 0.5) * 1000:.0f} ms, p99 {pct(delays, 0.99) * 1000:.0f} ms, "
          f"max {max(delays) * 1000:.0f} ms (watch interval {WATCH_SECONDS * 1000:.0f} ms)")


def proxy_streams_table(venv: Path, folder: Path, count: int) -> None:
    from bench.api_proxy import proxy_streams

    r = proxy_streams(venv, folder, count)
    print(f"\n## 3b. the same {count:,} streams on comfy-api-proxy ({count // r['jobs']} on each of {r['jobs']} jobs "
          f"waiting or running in a fake_comfy): {r['opened']:,} opened, {r['refused']:,} refused (HTTP "
          f"{', '.join(str(s) for s in r['statuses'] if s != 200) or '-'}: the proxy serves at most 8 at once, each "
          "holding a WebSocket to ComfyUI)" + ("" if r["all_open"] else " (NOT all answered within 180 s)"))
    print(f"{'proxy process, MiB':>24} {'RSS':>8} {'PSS':>8} {'USS':>8}")
    for name, m in (("before the streams", r["before"]), (f"with {r['opened']:,} open", r["with"])):
        print(f"{name:>24} {m[0]:>8.1f} {m[1]:>8.1f} {m[2]:>8.1f}")
    # Not per stream: the growth is the streams held and the refusals answered alike.
    print(f"{'growth, MiB':>24} " + " ".join(f"{r['with'][i] - r['before'][i]:>8.1f}" for i in range(3)))
    print(f"proxy CPU: {r['idle_cpu'] * 100:.1f}% of a core with the streams idle")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 submits, 100,000 jobs, 5 progress writes")
    parser.add_argument("--only", choices=["submit", "get", "streams"], action="append",
                        help="run only these parts (repeatable)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent httpx clients of part 1 (default 4)")
    parser.add_argument("--streams", type=int, default=1000, help="event streams of part 3 (default 1,000)")
    parser.add_argument("--proxy-venv", type=Path, help="an environment with comfy-api-proxy installed: its rows "
                        "beside comfysup's (bench/api_proxy.py); never installed by this bench")
    args = parser.parse_args()
    n, big, requests, writes = (300, 100_000, 1000, 5) if args.quick else (2000, 1_000_000, 2000, 10)
    parts = set(args.only or ["submit", "get", "streams"])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.streams + 512)), hard))
    base = ROOT / "var"
    base.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-api-", dir=base))
    load = os.getloadavg()
    print(f"# Comfy API v2 bench; {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
          f"SQLite {sqlite3.sqlite_version}, work in {work}", flush=True)
    try:
        if "submit" in parts:
            submits(work, n, args.clients, args.proxy_venv)
        if "get" in parts:
            gets(work, big, requests)
        if "streams" in parts:
            streams(work, args.streams, writes)
            if args.proxy_venv is not None:
                proxy_streams_table(args.proxy_venv, work / "proxy-streams", args.streams)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
