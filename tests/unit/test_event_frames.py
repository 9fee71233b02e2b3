"""The API's event stream (comfysup.api.events) without sockets: its frames, from a job as a client knew it and as it
is, and its watcher over a queue that answers when the test says."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from comfy_low.models import Output, Progress, StatusEvent

from comfysup.api import views
from comfysup.api.events import Stream, Watcher, transition
from comfysup.queue.base import JobPulse, JobRecord
from comfysup.queue.base import Output as StoredOutput

ID = "0b6c4a52-8a4e-4d47-9f51-1f0cbbd1e7a1"
ORIGIN = "http://127.0.0.1:9189"
MODELS = {"status": StatusEvent, "progress": Progress, "output": Output}
STEP = {"node": 2, "nodes": 3, "node_id": "2", "class_type": "KSampler", "step": 5, "steps": 20}


def pulse(state: str, attempt: int = 1, cancel: bool = False, progress: dict[str, Any] | None = None) -> JobPulse:
    return JobPulse(ID, state, attempt, cancel, progress)


def told(old: JobPulse, new: JobPulse | None, record: JobRecord | None = None) -> list[tuple[str, Any]]:
    """(event, payload) of each frame, every payload checked against the SDK's model of its event."""
    out = []
    for frame in transition(old, new, record, ORIGIN):
        head, data, blank, end = frame.data.decode().split("\n")
        assert head == f"event: {frame.kind}" and data.startswith("data: ") and (blank, end) == ("", "")
        body = json.loads(data[len("data: "):])
        MODELS[frame.kind].model_validate(body)
        out.append((frame.kind, body))
    return out


def done_record(files: int) -> JobRecord:
    return JobRecord(id=ID, state="done", priority=0, attempt=1, workflow={"1": {}, "2": {}, "3": {}}, extra_data={},
                     meta={}, params={}, workflow_name="", submitted_at=1.7e9, run_after=0, owner=None, server=None,
                     lease_until=None, started_at=1.7e9 + 1, finished_at=1.7e9 + 2, reason=None,
                     outputs=[StoredOutput(f"img_{i}.png", 10, "0" * 64, "") for i in range(files)],
                     cancel_requested=False)


def test_progress_alone_when_only_progress_changed_and_nothing_when_nothing_did() -> None:
    assert told(pulse("running"), pulse("running", progress=STEP)) == [
        ("progress", {"value": 0.4167, "nodes_done": 1, "nodes_total": 3, "current_node": "2",
                      "current_node_class": "KSampler", "step": 5, "steps": 20, "message": "KSampler 5/20"})]
    assert told(pulse("running", progress=STEP), pulse("running", progress=STEP)) == []
    # Another attempt that took over with the same status: the client is told only what it did not know.
    assert told(pulse("running", 1, progress=STEP), pulse("running", 2)) == []


def test_each_status_change_then_the_progress_it_comes_with() -> None:
    assert [k for k, _ in told(pulse("queued", 0), pulse("running", progress=STEP))] == ["status", "progress"]
    assert told(pulse("running", progress=STEP), pulse("queued")) == [("status", {"status": "queued"})]
    assert told(pulse("running"), pulse("running", cancel=True)) == [("status", {"status": "canceling"})]
    assert told(pulse("running", cancel=True), pulse("cancelled", cancel=True)) == [("status", {"status": "canceled"})]
    assert told(pulse("running"), pulse("dead")) == [("status", {"status": "failed"})]


def test_a_success_is_its_full_progress_its_outputs_then_its_status_the_last_frame() -> None:
    frames = transition(pulse("running", progress=STEP), pulse("done"), done_record(2), ORIGIN)
    assert [f.last for f in frames] == [False, False, False, True]
    kinds = told(pulse("running", progress=STEP), pulse("done"), done_record(2))
    assert [k for k, _ in kinds] == ["progress", "output", "output", "status"]
    assert kinds[0][1]["value"] == 1.0 and kinds[-1][1] == {"status": "succeeded"}
    assert [body["url"] for _, body in kinds[1:3]] == [f"{ORIGIN}/api/v2/assets/{ID}.{i}/content" for i in (0, 1)]


def test_a_job_that_is_gone_has_expired() -> None:
    assert told(pulse("running"), None) == [("status", {"status": "expired"})]
    # Done at the pulse's read and pruned before its record was read: gone as well.
    assert told(pulse("running"), pulse("done"), None) == [("status", {"status": "expired"})]


class SlowQueue:
    """Answers each read with the job as it is when the read is asked (the API's one queue thread runs reads in the
    order they are asked); a pulses read is handed back only when ``gate`` is open."""

    def __init__(self, progress: dict[str, Any]) -> None:
        self.record = done_record(0)._replace(state="running", finished_at=None, progress=progress)
        self.gate = asyncio.Event()
        self.gate.set()
        self.batches: list[list[str]] = []
        self.reads = self  # the read role and the preview role, as the API's watcher asks them
        self.previews = SimpleNamespace(previews=self.moved_previews)

    def get(self, job_id: str) -> JobRecord:
        return self.record

    def get_many(self, ids: list[str]) -> list[JobRecord]:
        return [self.record]

    def pulses(self, ids: list[str]) -> dict[str, JobPulse]:
        self.batches.append(list(ids))
        r = self.record
        return {r.id: JobPulse(r.id, r.state, r.attempt, r.cancel_requested, r.progress)}

    def moved_previews(self, ids: list[str], known: dict[str, int]) -> dict[str, Any]:
        return {}  # a running job that has sent no preview yet (the watcher asks each tick for those that moved)

    async def call(self, fn: Any, *args: Any) -> Any:
        result = fn(*args)
        if fn == self.pulses:
            await self.gate.wait()
        return result


def drained(stream: Stream) -> list[str]:
    out = []
    while not stream.frames.empty():
        out.append(stream.frames.get_nowait().data.decode().split("\n")[1])
    return out


def test_the_watcher_reads_each_job_once_a_tick_and_never_sends_a_stream_news_older_than_its_snapshot() -> None:
    async def scenario() -> None:
        queue = SlowQueue({**STEP, "step": 1})
        watcher = Watcher(queue.call, queue, limit=10)
        early = [watcher.open(ID, ORIGIN) for _ in range(3)]
        for stream in early:
            await watcher.attach(stream)
        queue.gate.clear()
        tick = asyncio.create_task(watcher.tick())  # asks for the pulses at step 1, then waits at the gate
        await asyncio.sleep(0)
        queue.record = queue.record._replace(progress={**STEP, "step": 2})
        late = watcher.open(ID, ORIGIN)
        snapshot = await watcher.attach(late)  # read after the tick's read was asked: step 2
        assert [f.kind for f in snapshot] == ["status", "progress"] and b'"step":2' in snapshot[1].data
        queue.gate.set()
        await tick
        assert [drained(s) for s in [*early, late]] == [[], [], [], []]  # step 1 is old news to all of them
        await watcher.tick()
        assert [len(drained(s)) for s in early] == [1, 1, 1] and drained(late) == []
        assert queue.batches == [[ID], [ID]]  # four streams, one job: one id a read
        queue.record = done_record(1)._replace(attempts=[])
        await watcher.tick()
        assert [drained(s)[-1] for s in [*early, late]] == ['data: {"status":"succeeded"}'] * 4
        assert (watcher.open_streams(), watcher.watched_jobs()) == (4, 0)  # told the end: unwatched, slots held
        for stream in [*early, late]:
            watcher.close(stream)
        assert watcher.open_streams() == 0

    asyncio.run(scenario())


def test_an_output_in_a_bucket_is_framed_with_the_url_the_job_gives() -> None:
    """The output frame of a file in a bucket carries its presigned URL, as GET /api/v2/jobs/{id} does (one URL
    for one output, whichever the client read)."""
    record = done_record(1)._replace(outputs=[StoredOutput("img_0.png", 10, "0" * 64, "s3://b/o/img_0.png")])

    def links(path: str, ttl_seconds: int | None = None) -> dict[str, Any]:
        return {"location": path, "url": f"https://b.example/{path[5:]}?X-Amz-Signature=1", "url_expires_at": 2e9}

    [output] = [f for f in transition(pulse("running"), pulse("done"), record, ORIGIN, links) if f.kind == "output"]
    body = json.loads(output.data.decode().split("\n")[1][len("data: "):])
    assert body["url"] == views.job(record, ORIGIN, 1.7e9, links=links)["outputs"][0]["url"]
    assert body["url"] == "https://b.example/b/o/img_0.png?X-Amz-Signature=1", body
