"""What the console's pages show, as JSON (pure: records and the time in, a dict out).

Secrets are masked as everywhere (comfysup.redact): a job's parameters, labels and extra data by name
(``mask``), and every text (reasons, tracebacks, file names) by value (``Redactor.for_job``). The workflow itself
is never sent. An output's link is the console's own (``files/<asset id>``, relative to the console's base, so it
works behind a proxy's path prefix) or, for an output in a bucket, its presigned URL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from comfysup import assets
from comfysup.api import views
from comfysup.queue.run_values import EndedAttempt, JobRecord
from comfysup.queue.search import JobRow
from comfysup.redact import Redactor, mask
from comfysup.runner.trace import phase_durations
from comfysup.storage.links import no_links

HOUR_SECONDS = 3600.0
TERMINAL_OUTCOMES = frozenset({"done", "dead", "cancelled"})


def row(r: JobRow) -> dict[str, Any]:
    """A line of the jobs list."""
    return {"id": r.id, "state": r.state, "workflow": r.workflow_name, "priority": r.priority,
            "attempt": r.attempt, "submitted_at": r.submitted_at, "started_at": r.started_at,
            "finished_at": r.finished_at, "reason": r.reason, "server": r.server, "machine": r.machine,
            "labels": mask(r.labels), "cancel_requested": r.cancel_requested, "tenant": r.tenant}


def _attempt(a: Any, clean: Redactor) -> dict[str, Any]:
    """One attempt as a timeline: its phases with their lengths, each node's time, and ComfyUI's error."""
    trace = a.trace or {}
    error = trace.get("error") or None
    return {
        "attempt": a.attempt, "owner": a.owner, "server": a.server, "started_at": a.started_at,
        "ended_at": a.ended_at, "outcome": a.outcome, "kind": a.kind, "prompt_number": a.prompt_number,
        "reason": clean(a.reason) if a.reason else None,
        "phases": [{"phase": name, "at": at, "seconds": seconds} for name, at, seconds in phase_durations(trace)],
        "nodes": trace.get("nodes") or [], "cached": trace.get("cached") or [],
        "error": None if error is None else {k: error.get(k) for k in (
            "node_id", "class_type", "exception_type", "message", "traceback")},
    }


def _output(item: dict[str, Any]) -> dict[str, Any]:
    """An output of views.outputs with the console's own link where it is not a bucket's presigned URL."""
    url = item["url"]
    if f"{views.API}/assets/" in url:
        url = f"files/{item['id']}"
    return {"id": item["id"], "name": item["filename"], "subfolder": item["subfolder"], "type": item["type"],
            "content_type": item["content_type"], "size": item["size_bytes"], "url": url,
            "node_id": item["node_id"]}


def job(record: JobRecord, now: float, links: Callable[..., dict[str, Any]] = no_links,
        position: int | None = None) -> dict[str, Any]:
    """A job's page: its parameters (masked), its attempts, its error, its inputs and outputs."""
    clean = Redactor.for_job(record.workflow, record.extra_data)
    shown = views.outputs(record, "", now, links) if record.state == "done" else []
    body = {
        "id": record.id, "state": record.shown_state, "priority": record.priority, "attempt": record.attempt,
        "workflow": record.workflow_name, "submitted_at": record.submitted_at, "started_at": record.started_at,
        "finished_at": record.finished_at, "run_after": record.run_after, "server": record.server,
        "machine": record.machine, "tenant": record.tenant, "reason": clean(record.reason) if record.reason else None,
        "cancel_requested": record.cancel_requested, "queue_position": position,
        "params": mask(record.params), "labels": mask(record.meta), "extra_data": mask(record.extra_data),
        "progress": views.running_progress(record.progress) if record.state == "running" else None,
        "inputs": assets.listing(record.params), "outputs": [_output(o) for o in shown],
        "attempts": [_attempt(a, clean) for a in record.attempts], "error": views.error(record),
        "metrics": views.metrics(record),
    }
    return clean.scrub(body)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by the nearest rank; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def hour(ended: Sequence[EndedAttempt], now: float) -> dict[str, Any]:
    """The last hour, a minute a bucket (oldest first): jobs done and dead, and the queue wait of the jobs
    that ended (from submission to their first attempt's execution, ComfyUI's own queue included)."""
    since = now - HOUR_SECONDS
    done, dead = [0] * 60, [0] * 60
    waits: list[float] = []
    by_minute: list[list[float]] = [[] for _ in range(60)]
    for a in ended:
        if a.outcome not in TERMINAL_OUTCOMES or a.ended_at < since:
            continue
        minute = min(59, int((a.ended_at - since) // 60))
        if a.outcome == "done":
            done[minute] += 1
        elif a.outcome == "dead":
            dead[minute] += 1
        waits.append(max(0.0, a.first_started_at - a.submitted_at + (a.first_comfyui_wait_s or 0.0)))
        by_minute[minute].append(waits[-1])
    return {"done_per_minute": done, "dead_per_minute": dead, "jobs": len(waits),
            "wait_p50_per_minute": [percentile(w, 0.5) for w in by_minute],
            "wait_p95_per_minute": [percentile(w, 0.95) for w in by_minute],
            "wait_p50": percentile(waits, 0.5), "wait_p95": percentile(waits, 0.95)}
