"""``GET /api/v2/jobs/{id}/events``: the contract's Server-Sent Events, fed from the queue by one watcher.

The contract (comfy-api-proxy ``spec/openapi.yaml@37fbee21`` ``getJobEvents`` and its ``x-sse-events``; comfy-sdk
0.5.0 ``comfy_low/sse.py`` and ``comfy_sdk/events.py``): frames ``event: <name>`` / ``data: <json>``; on connect the
current snapshot (a ``status``, then the latest ``progress`` of a running job), then each change; the stream ends
after the terminal ``status``. Live push only, by contract: no ``id:`` and no ``Last-Event-ID`` resume (a frame
sent while a client was away is gone; every ``progress`` is a whole snapshot and ``GET /api/v2/jobs/{id}`` is the
authority). A ``: keepalive`` comment every KEEPALIVE_SECONDS keeps proxies from closing an idle stream (the SDK's
read timeout is 45 s).

What comfysup sends:

- ``status``: every transition of the job (queued, running, canceling, succeeded, failed, canceled; queued again
  when an attempt is retried), and ``expired`` when a watched job is pruned. A posted job (claimed ahead,
  waiting in its server's queue) is ``queued`` until its execution starts. ``queue_position`` is left out: the
  stream watches changes of state and progress, and a place in line changes with every other job; ``GET
  /api/v2/jobs/{id}`` answers it (``Queue.queue_position``).
- ``progress``: the runner's progress writes (``Queue.set_progress``: node k of n, step i of m, at most one a
  second per job, comfysup.runner.attempt), as ``views.running_progress``; ``value`` 1.0 when the job succeeds.
- ``output``: each file of a succeeded job. comfysup commits a job's files together when it is done, so they come
  together, before the terminal ``status`` (a client that stops at the terminal status, as comfy-sdk's
  ``job.events()`` does, has them all).
- ``preview``: the running job's latest preview image (``PreviewEvent``: node, content type, base64), as its
  runner wrote it to the queue (comfysup.queue.previews: the newest frame ComfyUI sent, at most every ``[runner]
  preview_seconds``); on connect too, after the progress. ``log``: never (the contract reserves it).

Cost: one Watcher per API process. While any stream is open it reads, every ``interval`` seconds, the pulses of
all watched jobs (``Queue.pulses``: state, attempt, cancel flag, progress; one statement per 500 jobs) through
``State.call``, the API's one queue thread, and the whole record only of jobs that have just succeeded (their
outputs). A change becomes frames once, shared as bytes by every stream of that job: a thousand streams on one job
cost one row read a tick, and no stream holds a ComfyUI socket. A client that goes away is dropped at once (the
API cancels the handler of a closed connection, comfysup.api.serve); one that reads slower than its frames come
is ended after BACKLOG frames and re-syncs from the snapshot when it reconnects.

Previews, bounded: the watcher reads each tick only the replacement counter of the running watched jobs' previews
and the image only of those that moved (``Queue.previews``), makes the frame once, and hands every stream of the
job that same frame. A stream holds at most one preview waiting (``Stream.preview``, replaced by a newer one: a
slow client skips previews, it is never ended for them, and one marker in its frame queue says one is there), so
a job's preview costs one frame in memory however many streams watch it and however slowly they read, and the
runner's only cost is its one write a ``preview_seconds``, whoever watches.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from comfysup.api import replies, tenancy, views
from comfysup.api.errors import ApiError, not_found
from comfysup.errors import NotFound
from comfysup.queue.base import JobPulse, JobRecord, Preview
from comfysup.storage.links import no_links

log = logging.getLogger("comfysup.api")

WATCH_SECONDS = 0.2
"""How often the watcher reads the watched jobs while a stream is open: the most a change waits (the runner writes
progress at most once a second)."""
KEEPALIVE_SECONDS = 15.0
BACKLOG = 64
"""Frames a stream may have waiting for its client; past that the client is too slow and its stream ends."""
RETRY_AFTER_SECONDS = 5
OPEN_FILES_MARGIN = 256
"""File descriptors kept beside the streams' sockets (the queue, logs, other requests)."""
KEEPALIVE = b": keepalive\n\n"
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class Frame:
    kind: str
    data: bytes
    last: bool = False
    """The terminal status: the stream ends after it."""


END = Frame("end", b"", last=True)
"""Not sent: tells a stream to end (the API is stopping)."""
PREVIEW_READY = Frame("preview-ready", b"")
"""Not sent: tells a stream that its waiting preview (``Stream.preview``) is to be sent now."""


def frame(kind: str, body: dict[str, Any], last: bool = False) -> Frame:
    text = json.dumps(body, separators=(",", ":"))
    return Frame(kind, f"event: {kind}\ndata: {text}\n\n".encode(), last)


def _status(status: str) -> Frame:
    return frame("status", {"status": status}, last=status in views.TERMINAL)


def preview_frame(preview: Preview) -> Frame:
    """The contract's ``PreviewEvent`` (``node_id`` "" when ComfyUI's frame did not say and no node was running)."""
    return frame("preview", {"node_id": preview.node_id or "", "content_type": preview.content_type,
                             "data_base64": base64.b64encode(preview.data).decode()})


def pulse(record: JobRecord) -> JobPulse:
    return JobPulse(record.id, record.state, record.attempt, record.cancel_requested, record.progress,
                    record.waiting_since)


def snapshot(record: JobRecord) -> list[Frame]:
    """What a client gets on connect: the status, and a running job's latest progress."""
    out = [_status(views.status(record))]
    progress = views.progress(record) if record.state == "running" else None
    if progress is not None:
        out.append(frame("progress", progress))
    return out


def transition(old: JobPulse, new: JobPulse | None, record: JobRecord | None, origin: str,
               links: Callable[[str], dict[str, Any]] = no_links) -> list[Frame]:
    """The frames that take a client from ``old`` to ``new`` (None: the job is gone; ``record``: the whole record of a
    job that has succeeded, for its outputs; ``links``: presigned URLs of its outputs in a bucket, as the job's)."""
    if new is None or (new.state == "done" and record is None):
        return [_status("expired")]
    status = views.status(new)
    if status in views.TERMINAL:
        out = []
        if record is not None:
            out.append(frame("progress", views.progress(record) or {}))
            out += [frame("output", item) for item in views.outputs(record, origin, time.time(), links)]
        return [*out, _status(status)]
    out = [_status(status)] if views.status(old) != status else []
    progress = views.running_progress(new.progress) if new.state == "running" else None
    if progress is not None and (old.progress != new.progress or out):
        out.append(frame("progress", progress))
    return out


class Stream:
    """One open event stream: its job, what its client was last told of it, and the frames waiting to be sent."""

    __slots__ = ("frames", "job_id", "lagging", "origin", "preview", "seen", "since")

    def __init__(self, job_id: str, origin: str) -> None:
        self.job_id = job_id
        self.origin = origin
        self.frames: asyncio.Queue[Frame] = asyncio.Queue(BACKLOG)
        self.seen: JobPulse | None = None
        """The job as the client knows it: its snapshot's, then each tick's that changed it."""
        self.since = 0
        """The number of the queue read its snapshot came from: only later reads are news to it."""
        self.lagging = False
        self.preview: Frame | None = None
        """The newest preview not yet sent (one at most: a newer one replaces it)."""

    def push(self, frames: list[Frame]) -> None:
        for item in frames:
            try:
                self.frames.put_nowait(item)
            except asyncio.QueueFull:
                self.lagging = True
                return

    def push_preview(self, item: Frame) -> None:
        """Hold ``item`` as the preview to send next, replacing one not sent yet (no frame queued for it then)."""
        waiting, self.preview = self.preview, item
        if waiting is None:
            self.push([PREVIEW_READY])


Made = tuple[JobPulse | None, str, list[Frame]]
"""Frames made in one tick: from which state, for which origin, and the frames."""


class Watcher:
    """The API process's one reader of the watched jobs: reads their pulses in one batch a tick, turns each change
    into frames once and hands them to every stream of that job."""

    def __init__(self, call: Callable[..., Awaitable[Any]], queue: Any, limit: int,
                 interval: float = WATCH_SECONDS, links: Callable[[str], dict[str, Any]] = no_links) -> None:
        self._call = call
        self.links = links
        self._queue = queue
        self.limit = limit
        self.interval = interval
        self.keepalive_seconds = KEEPALIVE_SECONDS
        self._open: set[Stream] = set()
        self._streams: dict[str, set[Stream]] = {}
        self._previews: dict[str, tuple[int, Frame]] = {}
        """The latest preview frame of each watched running job, with its number in the queue (made once)."""
        self._asked = 0
        """Queue reads this watcher has handed to the API's one queue thread, which runs them in that order."""
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def open_streams(self) -> int:
        return len(self._open)

    def watched_jobs(self) -> int:
        return len(self._streams)

    def open(self, job_id: str, origin: str) -> Stream:
        """A stream's slot, taken before anything is read; 429 too_many_streams at ``[api] max_event_streams``."""
        if len(self._open) >= self.limit:
            raise ApiError(429, "too_many_streams", f"{len(self._open)} event streams are open, the most this API "
                           "serves ([api] max_event_streams); retry later, or poll GET /api/v2/jobs/{id}",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        stream = Stream(job_id, origin)
        self._open.add(stream)
        return stream

    async def _ask(self, fn: Callable[..., Any], *args: Any) -> tuple[int, Any]:
        """A queue read in the API's queue thread, and its place in that thread's order."""
        self._asked += 1
        number = self._asked
        return number, await self._call(fn, *args)

    async def attach(self, stream: Stream, who: str = "") -> list[Frame]:
        """Read the stream's job (404 when there is none, or it is not the tenant ``who``'s) and watch it from that
        read on; its snapshot frames."""
        try:
            stream.since, record = await self._ask(self._queue.reads.get, stream.job_id)
        except NotFound:
            raise not_found("job") from None
        tenancy.owned(who, record)
        stream.seen = pulse(record)
        frames = snapshot(record)
        if record.state == "running":
            known = self._previews.get(stream.job_id)
            if known is None:
                found = (await self._ask(self._queue.previews.previews, [stream.job_id], {}))[1].get(stream.job_id)
                known = None if found is None else (found.n, preview_frame(found))
            if known is not None:
                frames.append(known[1])
        if not frames[-1].last:
            self._streams.setdefault(stream.job_id, set()).add(stream)
            if self._wake is not None:
                self._wake.set()
        return frames

    def close(self, stream: Stream) -> None:
        self._open.discard(stream)
        self._unwatch(stream)

    def _unwatch(self, stream: Stream) -> None:
        streams = self._streams.get(stream.job_id)
        if streams is not None:
            streams.discard(stream)
            if not streams:
                del self._streams[stream.job_id]
                self._previews.pop(stream.job_id, None)

    async def start(self, _app: web.Application | None = None) -> None:
        self._wake = asyncio.Event()
        if self._streams:
            self._wake.set()
        self._task = asyncio.create_task(self._run(), name="comfysup-api-events")

    async def stop(self, _app: web.Application | None = None) -> None:
        """End every stream (its client reconnects or polls), then the watcher."""
        for stream in list(self._open):
            stream.lagging = True
            if not stream.frames.full():
                stream.frames.put_nowait(END)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            if not self._streams:
                self._wake.clear()
                continue
            started = time.monotonic()
            try:
                await self.tick()
            except Exception as exc:  # the queue does not answer: streams stay open (keep-alives go on); next tick
                if not self._failing:
                    log.warning("api events: cannot read the watched jobs (%s); streams wait, trying every %g s",
                                exc, self.interval)
                self._failing = True
            else:
                if self._failing:
                    log.info("api events: the watched jobs are read again")
                self._failing = False
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def tick(self) -> None:
        """One batch read of every watched job; each change to its streams, as frames made once per change."""
        ids = list(self._streams)
        number, pulses = await self._ask(self._queue.reads.pulses, ids)
        news = [(stream, pulses.get(job_id)) for job_id in ids for stream in self._streams.get(job_id, ())
                if stream.since < number and stream.seen != pulses.get(job_id)]
        records = await self._done_records(news)
        made: dict[str, list[Made]] = {}
        for stream, new in news:
            if stream in self._open:
                self._advance(stream, new, records.get(stream.job_id), made.setdefault(stream.job_id, []))
        await self._send_previews([job_id for job_id in ids if _is_running(pulses.get(job_id))])

    async def _done_records(self, news: list[tuple[Stream, JobPulse | None]]) -> dict[str, JobRecord]:
        """The records of the jobs that changed to done (their frames name the outputs), by id."""
        done = sorted({s.job_id for s, new in news if new is not None and new.state == "done"})
        if not done:
            return {}
        return {r.id: r for r in (await self._ask(self._queue.reads.get_many, done))[1]}

    def _advance(self, stream: Stream, new: JobPulse | None, record: JobRecord | None, known: list[Made]) -> None:
        """``stream`` told its job's change to ``new``: the frames of that change from the same state and origin
        are made once (``known``, this tick's for the job) and pushed to every such stream."""
        old = stream.seen
        assert old is not None
        frames = next((f for o, origin, f in known if o == old and origin == stream.origin), None)
        if frames is None:
            frames = transition(old, new, record, stream.origin, self.links)
            known.append((old, stream.origin, frames))
        stream.seen = new
        stream.push(frames)
        if frames and frames[-1].last:
            self._unwatch(stream)  # told the end: nothing more to read for it (its slot goes with its handler)

    async def _send_previews(self, running: list[str]) -> None:
        """The running watched jobs' previews that moved since the last tick, each made a frame once and held by
        every stream of its job (``Stream.push_preview``: one waiting a stream, the newest)."""
        if not running:
            return
        known = {job_id: self._previews[job_id][0] for job_id in running if job_id in self._previews}
        _, found = await self._ask(self._queue.previews.previews, running, known)
        for job_id, preview in found.items():
            item = preview_frame(preview)
            self._previews[job_id] = (preview.n, item)
            for stream in self._streams.get(job_id, ()):
                if stream in self._open and stream.seen is not None and stream.seen.state == "running":
                    stream.push_preview(item)


def _is_running(pulse: JobPulse | None) -> bool:
    return pulse is not None and pulse.state == "running"


WATCHER_KEY: web.AppKey[Watcher] = web.AppKey("events_watcher", Watcher)


async def job_events(request: web.Request) -> web.StreamResponse:
    watcher = request.app[WATCHER_KEY]
    stream = watcher.open(replies.job_id(request), replies.origin(request))
    response = web.StreamResponse(headers=HEADERS)
    try:
        frames = await watcher.attach(stream, tenancy.tenant(request))
        await response.prepare(request)
        for item in frames:
            await response.write(item.data)
        last = frames[-1].last
        while not last and not stream.lagging:
            try:
                item = await asyncio.wait_for(stream.frames.get(), watcher.keepalive_seconds)
            except TimeoutError:
                await response.write(KEEPALIVE)
                continue
            last = item.last
            if item is PREVIEW_READY:
                item, stream.preview = stream.preview or PREVIEW_READY, None
            if item.data:
                await response.write(item.data)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away between two frames
    finally:
        watcher.close(stream)
    return response


def install(app: web.Application, call: Callable[..., Awaitable[Any]], queue: Any, limit: int,
            links: Callable[[str], dict[str, Any]] = no_links) -> Watcher:
    """The events route and its watcher, started and stopped with ``app``."""
    watcher = Watcher(call, queue, limit, links=links)
    app[WATCHER_KEY] = watcher
    # GET only: a HEAD would prepare the stream and write its frames after the headers (aiohttp sends what a
    # StreamResponse is given), bytes a kept-alive connection then reads as its next answer.
    app.router.add_get(f"{views.API}/jobs/{{id}}/events", job_events, allow_head=False)
    app.on_startup.append(watcher.start)
    app.on_shutdown.append(watcher.stop)
    return watcher


def fit_open_files(streams: int) -> None:
    """Raise this process's soft limit of open files to fit ``streams`` sockets and a margin, as far as the hard
    limit allows (a default soft limit of 1024 would refuse connections well before [api] max_event_streams)."""
    want = streams + OPEN_FILES_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < want:
        log.warning("the open-file limit is %d (hard), below [api] max_event_streams (%d) + %d: streams past it "
                    "cannot connect; raise LimitNOFILE for comfysup or lower max_event_streams", hard, streams,
                    OPEN_FILES_MARGIN)
