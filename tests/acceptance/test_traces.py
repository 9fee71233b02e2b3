"""Per-job traces, live progress and JSON logs.

The trace is pure (a table of events in, phases and node times out); the runner's use of it is tested
against fake_comfy with its progress node (steps with ``progress`` events, as a KSampler sends them):
progress reaches the queue at most once a second, the trace is stored with the outcome, its reason class
with it, and ``comfysup show`` prints it as a timeline. ``--log-format json`` gives one object per event
naming job, slot and attempt, with the job's secrets redacted.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from comfysup.logs import JsonFormatter, bind, job_context, setup_logging
from comfysup.queue.base import Claim
from comfysup.queue.leases import Leases
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.redact import MASK, Redactor
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from comfysup.runner.trace import Trace, phase_durations
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, config_of, job_id, jobs_file, submit, trivial_job, write_config

CANARY = "sk-canary-trace-7d1e4b0a93"
PROGRESS = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": 9}},
    "2": {"class_type": "ComfysupProgressDemo", "inputs": {"image": ["1", 0], "steps": 12, "step_seconds": 0.2}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "progress"}},
}


def test_a_trace_is_built_from_the_events_of_its_prompt() -> None:
    trace = Trace.start({"1": {"class_type": "A"}, "2": {"class_type": "KSampler"}, "3": {"class_type": "Save"}},
                        100.0)
    assert trace.progress() is None  # claimed: nothing ran yet
    trace.phase("posted", 100.5)
    assert trace.progress() is None  # waiting in ComfyUI's queue
    events: list[tuple[str, dict[str, Any], float]] = [
        ("execution_start", {}, 101.0),
        ("execution_cached", {"nodes": ["1"]}, 101.0),
        ("executing", {"node": "2"}, 101.1),
        ("progress", {"value": 3, "max": 20, "node": "2"}, 101.5),
        ("executing", {"node": "3"}, 103.1),
        ("executing", {"node": None}, 103.3),
        ("execution_success", {}, 103.3),
    ]
    seen = []
    for kind, data, at in events:
        trace.on_event(kind, data, at)
        seen.append(trace.progress())
    assert seen[3] == {"phase": "executing", "node": 1, "nodes": 2, "cached": 1, "node_id": "2",
                       "class_type": "KSampler", "step": 3, "steps": 20}
    assert seen[4] == {"phase": "executing", "node": 2, "nodes": 2, "cached": 1, "node_id": "3",
                       "class_type": "Save"}  # a new node starts without steps
    trace.phase("downloading", 103.4)
    trace.phase("recorded", 103.6)
    stored = trace.as_dict()
    assert [p[0] for p in stored["phases"]] == ["claimed", "posted", "executing", "downloading", "recorded"]
    assert [(n["id"], n["class_type"], n["seconds"]) for n in stored["nodes"]] == \
        [("2", "KSampler", pytest.approx(2.0)), ("3", "Save", pytest.approx(0.2))]
    assert stored["cached"] == ["1"] and stored["total_nodes"] == 3
    assert [(name, round(length, 3) if length is not None else None)
            for name, _, length in phase_durations(stored)] == \
        [("claimed", 0.5), ("posted", 0.5), ("executing", 2.4), ("downloading", 0.2), ("recorded", None)]


class RecordingLeases(Leases):
    """The real lease role, noting when each progress write happened (monotonic) and what it said."""

    writes: list[tuple[float, dict[str, Any] | None]]

    def set_progress(self, claim: Claim, progress: dict[str, Any] | None) -> None:
        self.writes.append((time.monotonic(), progress))
        super().set_progress(claim, progress)


class RecordingQueue(SQLiteQueue):
    """The real queue, its lease role noting its progress writes (``writes``)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.leases = RecordingLeases(self.db)

    @property
    def writes(self) -> list[tuple[float, dict[str, Any] | None]]:
        return self.leases.writes  # type: ignore[attr-defined, no-any-return]

    @writes.setter
    def writes(self, value: list[tuple[float, dict[str, Any] | None]]) -> None:
        self.leases.writes = value  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_progress_is_throttled_and_the_trace_is_stored_and_shown(tmp_path: Path) -> None:
    config_path = write_config(tmp_path)
    submit(config_path, [{"id": job_id(1), "workflow": PROGRESS}]).close()
    queue = RecordingQueue(tmp_path / "queue.db")
    queue.writes = []
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=20) as fake:
        Runner(config_of(config_path), "cpu0", fake.url, RunnerOptions(until_empty=True), queue=queue).run()
    record = SQLiteQueue(tmp_path / "queue.db").reads.get(job_id(1))
    assert record.state == "done"
    times = [t for t, _ in queue.writes]
    assert len(times) >= 2, queue.writes  # 2.4 s of steps: written more than once ...
    assert all(b - a >= 0.99 for a, b in itertools.pairwise(times)), times  # ... at most once a second
    steps = [p for _, p in queue.writes if p and p.get("steps") == 12]
    assert steps and all(p["node_id"] == "2" and p["class_type"] == "ComfysupProgressDemo" for p in steps)
    [attempt] = record.attempts
    assert attempt.kind is None  # a success has no reason class
    trace = attempt.trace
    assert trace is not None
    assert [p[0] for p in trace["phases"]] == ["claimed", "posted", "executing", "downloading", "recorded"]
    nodes = {n["id"]: n for n in trace["nodes"]}
    assert list(nodes) == ["1", "2", "3"]
    assert nodes["2"]["seconds"] >= 2.4 - 0.05  # 12 steps of 0.2 s
    assert nodes["1"]["seconds"] < 1.0
    shown = comfysup("show", "--config", str(config_path), job_id(1))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(" posted " in line and "(waiting in ComfyUI's queue)" in line for line in lines)
    assert any("node    2 ComfysupProgressDemo" in line and line.rstrip().endswith(" s") for line in lines)
    order = [w for line in lines for w in ("claimed", "executing", "downloading", "recorded") if f" {w}" in line]
    assert order == ["claimed", "executing", "downloading", "recorded"]


@pytest.mark.timeout(60)
def test_each_attempt_keeps_the_reason_class_of_its_outcome(tmp_path: Path) -> None:
    # No job queued ahead: an OOM is then run again in its own attempt, never given back uncounted.
    config_path = write_config(tmp_path, attempts=2, queue_ahead=False)
    queue = submit(config_path, [trivial_job(n) for n in (1, 2, 3)])
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        fake.script_by_id({job_id(1): ["500", "ok"], job_id(2): ["oom"] * 4, job_id(3): ["error"]})
        Runner(config_of(config_path), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    kinds = {n: [(a.outcome, a.kind) for a in queue.reads.get(job_id(n)).attempts] for n in (1, 2, 3)}
    assert kinds == {1: [("retry", "http_5xx"), ("done", None)],
                     2: [("retry", "oom"), ("dead", "oom")],
                     3: [("dead", "execution_error")]}
    cached = queue.reads.get(job_id(2)).attempts[0].trace
    assert cached is not None and [p[0] for p in cached["phases"]][-1] == "recorded"
    queue.close()


def test_json_logs_name_job_slot_and_attempt_and_redact_the_jobs_secrets() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    from comfysup.logs import _Redact

    handler.addFilter(_Redact())
    log = logging.getLogger("comfysup.test_traces")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        bind(slot="gpu3")
        with job_context(job_id(5), 2, Redactor([CANARY])):
            log.info("job %s: ComfyUI said %s", job_id(5)[:8], f"bad key {CANARY}", extra={"event": "retry"})
        log.info("idle")
    finally:
        log.removeHandler(handler)
        bind(slot=None)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["job"], first["slot"], first["attempt"], first["event"]) == (job_id(5), "gpu3", 2, "retry")
    assert CANARY not in first["message"] and MASK in first["message"]
    assert (second["job"], second["slot"], second["attempt"]) == (None, "gpu3", None)


@pytest.mark.timeout(60)
def test_work_with_json_logs_writes_one_object_per_event_without_secrets(tmp_path: Path) -> None:
    config_path = write_config(tmp_path, attempts=2)
    jobs = [trivial_job(1, extra_data={"api_key_comfy_org": CANARY}), trivial_job(2)]
    path = jobs_file(tmp_path, jobs)
    assert comfysup("submit", "--config", str(config_path), str(path)).returncode == 0
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        fake.script_by_id({job_id(1): ["500", "ok"]})
        out = comfysup("work", "--config", str(config_path), "--server", f"gpu0={fake.url}", "--until-empty",
                       "--log-format", "json", "--base-delay-ms", "50", "--no-jitter")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("{")]
    events = [json.loads(line) for line in lines]
    assert all({"ts", "level", "message", "job", "slot", "attempt"} <= set(e) for e in events)
    retry = next(e for e in events if e["event"] == "retry")
    assert (retry["job"], retry["slot"], retry["attempt"], retry["kind"]) == (job_id(1), "gpu0", 1, "http_5xx")
    done = [(e["job"], e["attempt"]) for e in events if e["event"] == "done"]
    assert sorted(done) == [(job_id(1), 2), (job_id(2), 1)]
    assert CANARY not in out.stderr and CANARY not in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "summary: 2 done, 0 dead-lettered"  # the summary stays plain


def test_the_log_format_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from comfysup.errors import UsageError
    from comfysup.logs import resolve_format

    assert resolve_format(None, {}) == "plain"
    assert resolve_format(None, {"COMFYSUP_LOG_FORMAT": "json"}) == "json"
    assert resolve_format("plain", {"COMFYSUP_LOG_FORMAT": "json"}) == "plain"
    with pytest.raises(UsageError, match="expected one of plain, json"):
        resolve_format(None, {"COMFYSUP_LOG_FORMAT": "xml"})
    monkeypatch.setenv("COMFYSUP_LOG_FORMAT", "json")
    root, warned = logging.getLogger("comfysup"), logging.getLogger("py.warnings")
    saved = (list(root.handlers), root.level, root.propagate, list(warned.handlers), warned.propagate)
    try:
        setup_logging()
        assert [type(h.formatter) for h in root.handlers if getattr(h, "_comfysup", False)] == [JsonFormatter]
        setup_logging(fmt="plain")  # a second call changes the format, it adds no second handler
        assert [type(h.formatter) for h in root.handlers if getattr(h, "_comfysup", False)] == [logging.Formatter]
        assert any(getattr(h, "_comfysup", False) for h in warned.handlers)  # warnings are log events too
    finally:  # this process is pytest's: leave its logging as it was
        root.handlers[:], warned.handlers[:] = saved[0], saved[3]
        root.setLevel(saved[1])
        root.propagate, warned.propagate = saved[2], saved[4]
        logging.captureWarnings(False)
