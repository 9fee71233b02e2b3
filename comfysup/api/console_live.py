"""The console's overview, and its live stream (Server-Sent Events) to every open overview.

One ``Hub`` per API process: while at least one overview is open it reads the overview every TICK_SECONDS (or
less often where that read is slow: BUSY_SHARE; the last hour's charts every HOUR_EVERY_SECONDS), in
the API's queue thread (counts by state, the running jobs, the attempts that ended in the last hour, the
machines sharing the queue and their slots, the running jobs' preview numbers), samples the GPUs once (NVML,
where there is one), and hands every open stream the same bytes: a hundred viewers cost one read a tick, never a
hundred. A stream that reads slower than its frames come skips to the newest (it holds one frame at most).
Nothing is read while no overview is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from comfysup.api import console_views, views
from comfysup.gpus import GpuSampler
from comfysup.queue.run_values import Preview
from comfysup.slotstate import read_state, staleness

TICK_SECONDS = 2.0
HOUR_EVERY_SECONDS = 10.0
"""The last hour's charts are read again at most this often (the counts and slots every tick)."""
BUSY_SHARE = 0.25
"""A tick waits at least three times as long as its read took: on a queue whose overview is slow to read (a
large PostgreSQL one), the live streams take at most a quarter of the API's one queue thread."""
KEEPALIVE_SECONDS = 15.0
ENDED_LIMIT = 50_000
"""Attempts of the last hour read for its charts (a busier hour is shown from its newest ones)."""
DIGITS = re.compile(r"(\d+)")


def _gpu_of(device: str, gpus: list[Any]) -> dict[str, Any] | None:
    """The NVML sample of a slot's device (``cuda:1``, ``1``), None for a CPU slot or without NVML."""
    found = DIGITS.search(device or "")
    if found is None or str(device).startswith("cpu"):
        return None
    for g in gpus:
        if g.index == int(found.group(1)):
            return {"name": g.name, "memory_used": g.memory_used_bytes, "memory_total": g.memory_total_bytes,
                    "utilization": g.utilization}
    return None


def _slot(slot: dict[str, Any], running: dict[str, Any], previews: dict[str, int], gpus: list[Any],
          local: bool) -> dict[str, Any]:
    job = slot.get("job")
    return {
        "name": slot.get("name"), "device": slot.get("device"), "state": slot.get("state"),
        "ready": slot.get("ready"), "draining": slot.get("draining"), "held_by": slot.get("held_by"),
        "restarts": slot.get("restarts"),
        "runner_restarts": slot.get("runner_restarts"), "comfyui_version": slot.get("comfyui_version"),
        "warmup_seconds": slot.get("warmup_seconds"), "warming": slot.get("warming"), "jobs": slot.get("jobs"),
        "problem": slot.get("out_of_service"), "rss_mb": slot.get("rss_mb"),
        "gpu": _gpu_of(str(slot.get("device") or ""), gpus) if local else None,
        "job": job, "progress": running.get(job) if job else None, "preview": previews.get(job) if job else None,
    }


class Hub:
    """The overview's one reader and its streams (see the module's docstring)."""

    def __init__(self, call: Callable[..., Awaitable[Any]], queue: Any, config: Any) -> None:
        self.call = call
        self.queue = queue
        self.config = config
        self.viewers = 0
        self.frame = b""
        self.changed = asyncio.Event()
        self.previews: dict[str, Preview] = {}
        self._task: asyncio.Task[None] | None = None
        self._gpus: GpuSampler | None = None
        self.closing = False
        self._hour: dict[str, Any] | None = None
        self._hour_at = float("-inf")

    async def stop(self, app: web.Application) -> None:
        """``on_shutdown``: every open stream ends now, so the API's stop never waits for an open overview."""
        self.closing = True
        self.changed.set()

    def read(self, now: float | None = None) -> dict[str, Any]:
        """In the queue's thread: the overview now."""
        now = time.time() if now is None else now
        status = self.queue.reads.status(now, dead_limit=5)
        if self._hour is None or not 0 <= now - self._hour_at < HOUR_EVERY_SECONDS:
            ended = self.queue.reads.ended_since(now - console_views.HOUR_SECONDS, limit=ENDED_LIMIT)
            self._hour, self._hour_at = console_views.hour(ended, now), now
        machines = self.queue.fleet.machines(now)
        running = {r.id: views.running_progress(r.progress) for r in status.running}
        moved = self.queue.previews.previews(list(running), {k: p.n for k, p in self.previews.items()})
        self.previews = {k: p for k, p in {**self.previews, **moved}.items() if k in running}
        return {"now": now, "counts": status.counts, "oldest_queued_at": status.oldest_queued_at,
                "running": len(status.running), "recent_dead": [
                    {"id": i, "finished_at": f, "reason": r} for i, f, r in status.recent_dead],
                "hour": self._hour, "machines": self._cards(machines, running, now)}

    def _cards(self, machines: list[Any], running: dict[str, Any], now: float) -> list[dict[str, Any]]:
        """Each machine sharing the queue with its slots; this machine's from its state file when the queue has no
        machine (yet). Only this machine's slots carry their GPU's NVML sample."""
        if self._gpus is None:
            self._gpus = GpuSampler()
        gpus = self._gpus.sample()
        numbers = {k: p.n for k, p in self.previews.items()}
        local = read_state(self.config)
        host = (local or {}).get("host")
        cards = [{"host": m.host, "age": m.age_seconds, "local": m.host == host,
                  "slots": [_slot(s, running, numbers, gpus, m.host == host) for s in m.slots]} for m in machines]
        if not cards and local is not None:
            cards = [{"host": host, "age": now - float(local.get("updated_at") or now), "local": True,
                      "stale": staleness(local, now),
                      "slots": [_slot(s, running, numbers, gpus, True) for s in local.get("slots") or []]}]
        return cards

    async def overview(self) -> dict[str, Any]:
        return await self.call(self.read)

    async def _run(self) -> None:
        while self.viewers > 0 and not self.closing:
            started = time.monotonic()
            try:
                body = await self.overview()
                self.frame = b"event: overview\ndata: " + json.dumps(body).encode() + b"\n\n"
            except Exception as exc:  # the queue does not answer: the page says so, and the next tick tries again
                self.frame = b"event: trouble\ndata: " + json.dumps({"error": str(exc)[:300]}).encode() + b"\n\n"
            self.changed.set()
            self.changed = asyncio.Event()
            took = time.monotonic() - started
            await asyncio.sleep(max(TICK_SECONDS, took * (1 - BUSY_SHARE) / BUSY_SHARE))
        self._task = None

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """``text/event-stream`` of ``overview`` frames until the client goes away."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        self.viewers += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            if self.frame:
                await response.write(self.frame)
            while not self.closing:
                changed = self.changed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE_SECONDS):
                        await changed.wait()
                if not self.closing:
                    await response.write(self.frame if changed.is_set() else b": keepalive\n\n")
        finally:
            self.viewers -= 1
        return response


HUB_KEY = web.AppKey("console_hub", Hub)
