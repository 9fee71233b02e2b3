"""Queue records as the contract's bodies (pure: a record and the time in, a dict out).

Shapes from comfy-sdk 0.5.0 ``comfy_low/models/_generated.py`` (``Job``, ``Progress``, ``Output``, ``JobError``,
``JobUrls``), generated from comfy-api-proxy ``spec/openapi.yaml@37fbee21``; the tests validate every body
against those models. comfysup's states map onto the contract's names: queued → ``queued``, running →
``running`` (``canceling`` once a cancel was asked), done → ``succeeded``, dead → ``failed``, cancelled →
``canceled``; a posted job (claimed ahead, waiting in its server's queue behind the prompt that runs there) is
``queued``, as comfy-api-proxy calls a prompt in ComfyUI's ``queue_pending``, with its ``queue_position``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from comfysup.assets import media_type
from comfysup.queue.assets import ApiAsset
from comfysup.queue.base import JobPulse, JobRecord
from comfysup.runner.trace import figures
from comfysup.storage.links import no_links

API = "/api/v2"
RETENTION_SECONDS = 30 * 86400
"""``expires_at``: a platform property in the contract. comfysup keeps a job until ``comfysup prune`` removes it;
this is the horizon the API promises (prune with ``--older-than`` 30 days or more keeps it true)."""
URL_SECONDS = 3600
"""``url_expires_at`` of an output's URL: the URL is served by this API and does not expire by itself; an
hour tells a client when to fetch the job again for a fresh one, as it would on Cloud."""

STATUS = {"queued": "queued", "running": "running", "storing": "running", "done": "succeeded", "dead": "failed",
          "cancelled": "canceled"}
"""comfysup's states in the contract's words: a storing job (its outputs wait for the bucket) is still running."""
TERMINAL = frozenset({"succeeded", "failed", "canceled", "expired"})
_OUTPUT_TYPES = {"image": "image", "video": "video", "audio": "audio", "text": "text"}


def iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def status(record: JobRecord | JobPulse) -> str:
    if record.state == "running" and record.cancel_requested:
        return "canceling"
    if record.state == "running" and record.waiting_since is not None:
        return "queued"  # posted: it waits in its server's queue, nothing of it runs yet
    return STATUS.get(record.state, record.state)


def job_urls(job_id: str, origin: str) -> dict[str, str]:
    """Absolute links (``JobUrls``), from the API's own address (comfysup.api.replies ``origin``), as the proxy
    answers them: a client that does not join relative links can follow them."""
    base = f"{origin}{API}/jobs/{job_id}"
    return {"self": base, "events": f"{base}/events", "cancel": f"{base}/cancel"}


def output_id(job_id: str, index: int) -> str:
    """An output's asset id: the job's id and the output's place in its list. Reading an output is reading its
    job (one principal: whoever holds the token), so it is exactly as hard to guess as the job's id."""
    return f"{job_id}.{index}"


def parse_output_id(asset_id: str) -> tuple[str, int] | None:
    job_id, dot, index = asset_id.rpartition(".")
    if not dot or not index.isdigit() or len(index) > 6:
        return None
    try:
        canonical = str(uuid.UUID(job_id))
    except ValueError:
        return None
    return (canonical, int(index)) if canonical == job_id else None


def content_type(name: str) -> str:
    return media_type(name)


def output_type(name: str) -> str:
    return _OUTPUT_TYPES.get(content_type(name).split("/", 1)[0], "file")


def outputs(record: JobRecord, origin: str, now: float,
            links: Callable[[str], dict[str, Any]] = no_links) -> list[dict[str, Any]]:
    """The job's files as assets (the contract's ``Output``). ``id``: the asset UUID the queue gave the output
    (``<job id>.<n>`` for a job done by an earlier version). ``node_id``: the output node that made the file, as
    the runner recorded it from the history's ``outputs`` keys; for a record of an earlier version (no node
    recorded), the one node whose ``filename_prefix`` the name starts with, else ``""`` (the contract's field is
    required and a string). ``filename`` and ``subfolder`` (comfysup's, beside the contract's ``name``): where the
    file is among the job's results, the folder a ``filename_prefix`` such as ``portraits/x`` named, without the
    job's own folder comfysup adds. ``url``: a file in a bucket's presigned URL (``links``), else this
    API's content route, absolute, from the API's own address (it redirects to a fresh one for a file in a bucket)."""
    out = []
    for index, item in enumerate(record.outputs):
        asset_id = item.id or output_id(record.id, index)
        subfolder, _, filename = item.name.rpartition("/")
        link = links(item.path)
        url, expires = (link["url"], link["url_expires_at"]) if "url" in link else \
            (f"{origin}{API}/assets/{asset_id}/content", now + URL_SECONDS)
        out.append({
            "node_id": item.node_id or _node_of(item.name, record.workflow), "name": filename,
            "type": output_type(item.name), "content_type": content_type(item.name), "size_bytes": item.size,
            "id": asset_id, "hash": None, "url": url,
            "url_expires_at": iso(expires), "job_id": record.id, "filename": filename,
            "subfolder": subfolder,
        })
    return out


def _node_of(name: str, workflow: dict[str, Any]) -> str:
    """The output node whose ``filename_prefix`` the file's name starts with, when exactly that is known."""
    base = name.rsplit("/", 1)[-1]
    found = [str(node_id) for node_id, node in workflow.items()
             if isinstance(node, dict) and isinstance(node.get("inputs"), dict)
             and isinstance(node["inputs"].get("filename_prefix"), str) and node["inputs"]["filename_prefix"]
             and base.startswith(node["inputs"]["filename_prefix"].rsplit("/", 1)[-1])]
    return found[0] if len(found) == 1 else ""


def progress(record: JobRecord) -> dict[str, Any] | None:
    """The runner's last progress write (comfysup.runner.trace ``progress()``: node k of n, step i of m) as the
    contract's snapshot: ``value`` weights the nodes done and the current node's steps."""
    if record.state == "done":
        return {"value": 1.0, "nodes_done": _total(record), "nodes_total": _total(record)}
    return running_progress(record.progress) if record.state == "running" else None


def running_progress(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """A running job's progress write as the contract's ``Progress`` (None before the first write)."""
    if not p:
        return None
    total = max(1, int(p.get("nodes") or 1))
    node = max(0, min(int(p.get("node") or 0), total))
    step, steps = p.get("step"), p.get("steps")
    inside = (step / steps) if isinstance(step, int) and isinstance(steps, int) and steps > 0 else 0.0
    done = max(0, node - 1)
    value = min(1.0, max(0.0, (done + min(1.0, inside)) / total))
    out: dict[str, Any] = {"value": round(value, 4), "nodes_done": done, "nodes_total": total,
                           "current_node": p.get("node_id"), "current_node_class": p.get("class_type"),
                           "step": step if isinstance(step, int) else None,
                           "steps": steps if isinstance(steps, int) else None}
    if out["current_node_class"] and out["step"] is not None:
        out["message"] = f"{out['current_node_class']} {step}/{steps}"
    return out


def _total(record: JobRecord) -> int:
    last = record.attempts[-1].trace if record.attempts else None
    return int((last or {}).get("total_nodes") or len(record.workflow) or 1)


NODE_ERROR_KINDS = frozenset({"execution_error", "oom"})
"""Reason classes of a failure ComfyUI reported as an ``execution_error`` of a node: the contract's
``node_execution_error``."""


def error(record: JobRecord) -> dict[str, Any] | None:
    """A dead job's failure as ``JobError``. ``code``: ``node_execution_error`` when a node of ComfyUI raised (an
    out-of-memory too), else comfysup's reason class (``validation``, ``timeout``, ``gave_up``, …). ``message``:
    the job's reason (comfysup's whole account: the node, the exception's first line, the attempts). ``node_id``,
    ``class_type``, ``traceback``, and comfysup's ``exception_type`` and ``exception_message`` (the whole of it):
    ComfyUI's ``execution_error`` as the last
    attempt recorded it (comfysup.runner.trace), null where ComfyUI gave none. Every text was redacted (the
    job's secrets) and bounded when it was stored."""
    if record.state != "dead":
        return None
    last = record.attempts[-1] if record.attempts else None
    kind = last.kind if last is not None and last.kind else None
    seen = ((last.trace or {}).get("error") if last is not None else None) or {}
    return {"code": "node_execution_error" if kind in NODE_ERROR_KINDS or seen else (kind or "job_failed"),
            "message": record.reason or "failed", "node_id": seen.get("node_id"),
            "class_type": seen.get("class_type"), "traceback": seen.get("traceback"),
            "exception_type": seen.get("exception_type") or None, "exception_message": seen.get("message") or None}


def outputs_reused(record: JobRecord) -> bool:
    """Whether ComfyUI served nodes of the job's run from its cache (its ``execution_cached`` message named any, as
    the attempt's trace recorded it): the proxy's ``outputs_reused``. comfysup gives each job's savers a folder of
    their own, so its files are always written by this run; what may be reused is the work upstream of them."""
    last = record.attempts[-1] if record.attempts and record.state == "done" else None
    return bool(last is not None and (last.trace or {}).get("cached"))


def metrics(record: JobRecord) -> dict[str, int | None]:
    """``queue_ms`` until the first attempt's execution (its claim, plus the time its prompt waited in ComfyUI's
    queue behind another), ``execution_ms`` of the last attempt from then on (comfysup.runner.trace.figures): the
    time a job queued ahead waited is counted once, as queueing, never as execution."""
    first = record.attempts[0] if record.attempts else None
    queue_ms = None
    if first is not None:
        queue_ms = max(0, round((first.started_at - record.submitted_at + figures(first.trace)[0]) * 1000))
    execution_ms = None
    if record.started_at is not None and record.finished_at is not None:
        waited = figures(record.attempts[-1].trace)[0] if record.attempts else 0.0
        execution_ms = max(0, round((record.finished_at - record.started_at - waited) * 1000))
    return {"queue_ms": queue_ms, "execution_ms": execution_ms}


def job(record: JobRecord, origin: str, now: float, queue_position: int | None = None,
        links: Callable[[str], dict[str, Any]] = no_links) -> dict[str, Any]:
    """The contract's ``Job`` (plus ``metadata``, which the SDK reads leniently, and ``priority``, comfysup's).
    ``queue_position`` (``Queue.queue_position``, 1 next) is kept only while the job is ``queued``: null once it
    runs or has ended. ``links``: presigned URLs of outputs in a bucket."""
    waiting = status(record) == "queued"
    return {
        "id": record.id, "status": status(record), "created_at": iso(record.submitted_at),
        "started_at": iso(record.started_at if not waiting else None),
        "completed_at": iso(record.finished_at if record.state in ("done", "dead", "cancelled") else None),
        "expires_at": iso((record.finished_at or now) + RETENTION_SECONDS),
        "queue_position": queue_position if waiting else None,
        "progress": progress(record), "outputs": outputs(record, origin, now, links) if record.state == "done" else [],
        "error": error(record), "outputs_reused": outputs_reused(record), "metrics": metrics(record),
        "urls": job_urls(record.id, origin),
        "metadata": labels(record.meta), "priority": record.priority,
    }


def labels(meta: dict[str, Any]) -> dict[str, str]:
    """A job's ``meta`` as the contract's ``metadata`` (string labels): what a jobs.jsonl line put there that is
    not a string is left out, never shown changed."""
    return {k: v for k, v in meta.items() if isinstance(k, str) and isinstance(v, str)}


def summary(record: JobRecord, origin: str) -> dict[str, Any]:
    """A ``GET /api/v2/jobs`` item: the SDK's ``JobSummary`` reads id, status, create_time, update_time and
    metadata (comfy_sdk/jobs.py ``JobSummary._from_item``)."""
    updated = record.finished_at or record.started_at or record.submitted_at
    return {"id": record.id, "status": status(record), "create_time": iso(record.submitted_at),
            "update_time": iso(updated), "metadata": labels(record.meta), "priority": record.priority,
            "urls": job_urls(record.id, origin)}


def uploaded(record: ApiAsset, origin: str, now: float, created_new: bool | None = None) -> dict[str, Any]:
    """An asset uploaded through the API as the contract's ``Asset`` (``created_new`` on create answers only)."""
    body: dict[str, Any] = {
        "id": record.id, "hash": record.hash, "size_bytes": record.size, "content_type": record.content_type,
        "file_path": record.file_path or None, "created_at": iso(record.created_at),
        "url": f"{origin}{API}/assets/{record.id}/content", "url_expires_at": iso(now + URL_SECONDS),
        "expires_at": iso(record.expires_at), "job_id": None,
    }
    if created_new is not None:
        body["created_new"] = created_new
    return body
