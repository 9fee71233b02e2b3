"""GET /api/v2/jobs/{id}/events: comfy-sdk's ``job.events()`` exactly as its README shows, fed from the
queue by the API's one watcher; every frame's payload validated against the SDK's generated models (comfy_low.models,
from comfy-api-proxy's spec/openapi.yaml) and decoded by the SDK's own SSE decoder."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from comfy_low.models import ErrorEnvelope, Output, Progress, StatusEvent
from comfy_low.sse import RawEvent, SSEDecoder
from comfy_sdk import Comfy
from comfy_sdk.events import OutputReady, StatusChange
from comfy_sdk.events import Progress as ProgressEvent
from pg_support import pg_url  # noqa: F401  (a fixture)

from comfysup.api.app import STATE_KEY
from comfysup.api.events import WATCHER_KEY, Watcher
from comfysup.config import Config
from tests.api_support import StandInRunner, api_config, running_api_app
from tests.supervisor_support import wait_for

ROOT = Path(__file__).resolve().parents[2]
TRIVIAL = ROOT / "examples" / "workflows" / "trivial.json"
MODELS = {"status": StatusEvent, "progress": Progress, "output": Output}


def progress_write(step: int) -> dict[str, Any]:
    """A progress write as comfysup.runner.trace makes one: node 2 of 3 (a KSampler), step ``step`` of 20."""
    return {"phase": "running", "node": 2, "nodes": 3, "cached": 0, "node_id": "2", "class_type": "KSampler",
            "step": step, "steps": 20}


@contextmanager
def api(config: Config, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Watcher, StandInRunner, list[Any]]]:
    """The API, its watcher, a stand-in runner on the same queue, and the ids of each batch the watcher read."""
    with running_api_app(config) as (url, app):
        monkeypatch.setenv("COMFY_BASE_URL", url)
        monkeypatch.delenv("COMFY_API_KEY", raising=False)
        queue = app[STATE_KEY].queue
        batches: list[Any] = []
        read = queue.reads.pulses

        def pulses(ids: Any) -> Any:
            batches.append(list(ids))
            return read(ids)

        monkeypatch.setattr(queue.reads, "pulses", pulses)
        runner = StandInRunner(config)
        try:
            yield url, app[WATCHER_KEY], runner, batches
        finally:
            runner.close()


def raw_frames(url: str, job_id: str, into: list[RawEvent], opened: threading.Event | None = None) -> None:
    """Every frame of one stream, decoded by the SDK's own decoder and checked against its models, until it ends."""
    decoder = SSEDecoder()
    with httpx.stream("GET", f"{url}/api/v2/jobs/{job_id}/events", timeout=30) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            for event in decoder.push(line):
                MODELS[event.event].model_validate(event.data)
                into.append(event)
                if opened is not None:
                    opened.set()


def test_queued_running_progress_output_succeeded_in_order_on_two_streams(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with api(api_config(tmp_path), monkeypatch) as (url, watcher, runner, batches), Comfy() as client:
        job = client.submit(client.workflows.from_file(TRIVIAL))
        raw: list[RawEvent] = []
        opened = threading.Event()
        other = threading.Thread(target=raw_frames, args=(url, job.id, raw, opened), daemon=True)
        other.start()
        assert opened.wait(20), "the second stream got no snapshot"
        seen: list[Any] = []
        claim = None
        for event in job.events():
            seen.append(event)
            match event:
                case StatusChange(status="queued"):
                    wait_for(lambda: watcher.open_streams() == 2, 10, "both streams open")
                    claim = runner.claim()
                case StatusChange(status="running"):
                    runner.queue.leases.set_progress(claim, progress_write(5))
                case ProgressEvent(step=5):
                    runner.queue.leases.set_progress(claim, progress_write(15))
                case ProgressEvent(step=15):
                    data = runner.complete(claim)
                case OutputReady() as o:
                    assert o.output.to_bytes() == data
                case StatusChange(status="succeeded"):
                    break
        other.join(20)
    kinds = [(type(e).__name__, getattr(e, "status", None) or getattr(e, "step", None)) for e in seen]
    assert kinds == [("StatusChange", "queued"), ("StatusChange", "running"), ("Progress", 5), ("Progress", 15),
                     ("Progress", None), ("OutputReady", None), ("StatusChange", "succeeded")]
    assert seen[2] == ProgressEvent(value=pytest.approx(0.4167, abs=1e-4), message="KSampler 5/20", nodes_done=1,
                                    nodes_total=3, current_node="2", step=5, steps=20)
    assert seen[4].value == 1.0 and seen[5].output.name == "comfysup_00001_.png"
    # The second stream (raw frames, the SDK's decoder) was told the same, frame for frame.
    assert [(e.event, e.data.get("status") or e.data.get("step") or e.data.get("name")) for e in raw] == [
        ("status", "queued"), ("status", "running"), ("progress", 5), ("progress", 15), ("progress", None),
        ("output", "comfysup_00001_.png"), ("status", "succeeded")]
    assert not other.is_alive(), "the second stream did not end after the terminal status"
    # Both streams watched one job: each read of the watcher asked for it once, however many streams it had.
    assert batches and all(batch == [job.id] for batch in batches)
    wait_for(lambda: watcher.open_streams() == 0 and watcher.watched_jobs() == 0, 10, "both streams closed")


def test_cancel_of_a_running_job_gives_canceling_then_canceled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    with api(api_config(tmp_path), monkeypatch) as (_url, _watcher, runner, _), Comfy() as client:
        job = client.submit(client.workflows.from_file(TRIVIAL))
        claim = runner.claim()
        statuses = []
        for event in job.events():
            match event:
                case StatusChange(status="running"):
                    job.cancel()
                case StatusChange(status="canceling"):
                    runner.queue.leases.cancelled(claim, "cancelled by a user")
            statuses.append(event.status)
        assert statuses == ["running", "canceling", "canceled"]
        queued = client.submit(client.workflows.from_file(TRIVIAL), idempotency_key="another")
        for event in queued.events():
            if event == StatusChange(status="queued"):
                queued.cancel()
            else:
                assert event == StatusChange(status="canceled")


def test_failed_and_already_ended_jobs_end_the_stream_at_their_terminal_status(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with api(api_config(tmp_path), monkeypatch) as (url, watcher, runner, _), Comfy() as client:
        job = client.submit(client.workflows.from_file(TRIVIAL))
        claim = runner.claim()
        runner.queue.leases.set_progress(claim, progress_write(3))
        raw: list[RawEvent] = []
        other = threading.Thread(target=raw_frames, args=(url, job.id, raw), daemon=True)
        other.start()
        wait_for(lambda: len(raw) == 2, 10, "the snapshot: status and the latest progress")
        runner.queue.leases.dead(claim, "node 2 (KSampler): boom", kind="node_error")
        other.join(20)
        assert not other.is_alive()
        assert [(e.event, e.data.get("status") or e.data.get("step")) for e in raw] == [
            ("status", "running"), ("progress", 3), ("status", "failed")]
        again: list[RawEvent] = []
        raw_frames(url, job.id, again)  # returns: the stream of an ended job is its status alone
        assert [(e.event, e.data) for e in again] == [("status", {"status": "failed"})]
        missing = httpx.get(f"{url}/api/v2/jobs/{uuid.uuid4()}/events")
        assert missing.status_code == 404 and ErrorEnvelope.model_validate(missing.json()).error.code == "not_found"
        # HEAD would prepare a stream and write its frames after the headers: not allowed.
        assert httpx.head(f"{url}/api/v2/jobs/{job.id}/events").status_code == 405
        assert watcher.open_streams() == 0


def test_a_client_that_goes_away_releases_its_stream_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    with api(api_config(tmp_path), monkeypatch) as (url, watcher, _runner, _), Comfy() as client:
        job = client.submit(client.workflows.from_file(TRIVIAL))
        with httpx.stream("GET", f"{url}/api/v2/jobs/{job.id}/events", timeout=30) as response:
            lines = response.iter_lines()  # kept: a dropped line iterator closes the response
            assert [next(lines) for _ in range(3)] == ["event: status", 'data: {"status":"queued"}', ""]
            wait_for(lambda: (watcher.open_streams(), watcher.watched_jobs()) == (1, 1), 5, "the stream watched")
        # Sooner than the next keep-alive (15 s) could find the socket closed: the handler is cancelled with the
        # connection, and its slot and its job's subscription go with it.
        assert watcher.keepalive_seconds >= 15
        wait_for(lambda: (watcher.open_streams(), watcher.watched_jobs()) == (0, 0), 5, "the stream released")


def test_the_bound_on_streams_answers_429_too_many_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with api(api_config(tmp_path, max_event_streams=1), monkeypatch) as (url, watcher, _runner, _), \
            Comfy() as client:
        job = client.submit(client.workflows.from_file(TRIVIAL))
        events = f"{url}/api/v2/jobs/{job.id}/events"
        watcher.keepalive_seconds = 0.05
        with httpx.stream("GET", events, timeout=30) as response:
            lines = response.iter_lines()  # kept: a dropped line iterator closes the response
            assert [next(lines) for _ in range(4)] == ["event: status", 'data: {"status":"queued"}', "",
                                                       ": keepalive"]
            full = httpx.get(events)
            assert full.status_code == 429 and int(full.headers["Retry-After"]) > 0
            error = ErrorEnvelope.model_validate(full.json()).error
            assert error.code == "too_many_streams" and "max_event_streams" in error.message
        wait_for(lambda: watcher.open_streams() == 0, 5, "the first stream released")
        with httpx.stream("GET", events, timeout=30) as response:
            assert response.status_code == 200


def test_postgres_streams_a_job_to_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           pg_url: str) -> None:  # noqa: F811
    with api(api_config(tmp_path, queue_url=pg_url), monkeypatch) as (_url, _watcher, runner, _), \
            Comfy() as client:
        job = client.submit(client.workflows.from_file(TRIVIAL))
        seen = []
        claim = None
        for event in job.events():
            seen.append(event)
            match event:
                case StatusChange(status="queued"):
                    claim = runner.claim()
                case StatusChange(status="running"):
                    runner.queue.leases.set_progress(claim, progress_write(7))
                case ProgressEvent(step=7):
                    runner.complete(claim)
    assert [type(e).__name__ for e in seen] == ["StatusChange", "StatusChange", "Progress", "Progress",
                                                "OutputReady", "StatusChange"]
    assert seen[-1] == StatusChange(status="succeeded")
