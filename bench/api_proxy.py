"""bench/api.py's peer: Comfy's own proxy (comfy-api-proxy) in front of a fake_comfy server, for the same requests.

The proxy is not a dependency of comfysup and is never committed: ``--proxy-venv`` names an environment where it is
installed (``python -m venv V && V/bin/pip install comfy-api-proxy``); without one its rows are left out with a
note. It runs as its users run it (``comfy-api-proxy run --comfyui URL --port P``, its defaults), in front of a
fake_comfy server (nodes of 0 ms) of its own, which executes what the proxy forwards; comfysup's API only queues
(a runner executes later), so the proxy's figure includes the fake's POST /prompt and comfysup's a durable commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

from bench.runner import free_port, start_fake


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, what: str) -> None:
    """Until ``url``'s /api/v2/health answers 200 (at most 60 s); SystemExit with the log's end if ``proc`` ends."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v2/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


@contextmanager
def proxy_process(venv: Path, folder: Path, node_ms: float = 0.0) -> Iterator[tuple[str, psutil.Process]]:
    """A fake_comfy server and comfy-api-proxy in front of it; the proxy's URL and process while the block runs."""
    folder.mkdir(parents=True, exist_ok=True)
    fake, comfy = start_fake(folder / "fake", node_ms)
    port = free_port()
    log = folder / "proxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(venv / "bin" / "comfy-api-proxy"), "run", "--comfyui", comfy, "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, "comfy-api-proxy")
        yield url, psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl+C, how its users stop `run`
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        for left in (proc, fake):
            if left.poll() is None:
                left.kill()
            left.wait()


def open_streams(url: str, ids: list[str], per_job: int, seconds: float) -> tuple[list[int], threading.Event,
                                                                                  threading.Event]:
    """``per_job`` event streams on each job in a thread of their own, read until ``stop`` is set; returns each
    stream's HTTP status once its headers came, the event set once every stream's did, and ``stop``."""
    opened: list[int] = []
    all_open, stop = threading.Event(), threading.Event()

    async def one(session: aiohttp.ClientSession, job: str) -> None:
        async with session.get(f"{url}/api/v2/jobs/{job}/events") as r:
            # Its headers came: the stream is open (a waiting job may send nothing for long), or refused: the
            # proxy serves at most 8 streams at once (each holds a WebSocket to ComfyUI) and answers 429 beyond.
            opened.append(r.status)
            if len(opened) == len(ids) * per_job:
                all_open.set()
            if r.status != 200:
                return
            async for _raw in r.content:
                if stop.is_set():
                    return

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            tasks = [asyncio.create_task(one(session, job)) for job in ids for _ in range(per_job)]
            while not stop.is_set():
                await asyncio.sleep(0.1)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    all_open.wait(seconds)
    return opened, all_open, stop


def proxy_streams(venv: Path, folder: Path, count: int, per_job: int = 10) -> dict[str, Any]:
    """``count`` streams on the proxy, ``per_job`` on each of count/per_job jobs that stay unfinished (the fake's
    nodes take 10 minutes: one runs, the rest wait in its queue): the proxy's memory before and with them, and its
    CPU while they are idle. Its streams follow ComfyUI's WebSocket (comfy_api_proxy.realtime)."""
    with proxy_process(venv, folder, node_ms=600_000) as (url, proc):
        graph = {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1,
                                                              "color": 0}},
                 "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "s"}}}
        ids = []
        with httpx.Client(base_url=url, timeout=60) as client:
            for n in range(count // per_job):
                graph["1"]["inputs"]["color"] = n
                r = client.post("/api/v2/jobs", json={"workflow": graph})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
        time.sleep(1.0)
        before = memory(proc)
        opened, all_open, stop = open_streams(url, ids, per_job, 180.0)
        time.sleep(1.0)
        with_streams = memory(proc)
        cpu0, t0 = cpu_seconds(proc), time.monotonic()
        time.sleep(5.0)
        idle = (cpu_seconds(proc) - cpu0) / (time.monotonic() - t0)
        stop.set()
        return {"before": before, "with": with_streams, "idle_cpu": idle, "opened": opened.count(200),
                "refused": sum(1 for status in opened if status != 200), "all_open": all_open.is_set(),
                "jobs": len(ids), "statuses": sorted(set(opened))}


def memory(proc: psutil.Process) -> tuple[float, float, float]:
    info = proc.memory_full_info()
    return info.rss / 2**20, getattr(info, "pss", 0.0) / 2**20, info.uss / 2**20


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system
