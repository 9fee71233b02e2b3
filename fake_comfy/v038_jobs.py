"""ComfyUI 0.38's jobs API (server.py's /api/jobs routes and comfy_execution/jobs.py), over the fake's queue.

GET /api/jobs (status and workflow_id filters, sort by created_at or execution_duration, limit/offset),
GET /api/jobs/{id} (404 when unknown), POST /api/jobs/{id}/cancel and POST /api/jobs/cancel. A cancel is
atomic as upstream's (PromptQueue.interrupt_if_running under the queue's mutex): here the whole handler
runs in the event loop without awaiting between the look and the act, so no prompt can start in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .v038 import JOB_STATUSES, valid_job_id

if TYPE_CHECKING:
    from .prompt_queue import QueueItem
    from .server import FakeServer


def _queue_job(item: QueueItem, status: str, detail: bool) -> dict[str, Any]:
    extra = item.extra_data
    workflow = (extra.get("extra_pnginfo") or {}).get("workflow") if isinstance(extra.get("extra_pnginfo"), dict) \
        else None
    job = {"id": item.prompt_id, "status": status, "priority": item.number, "create_time": extra.get("create_time"),
           "outputs_count": 0, "previewable_outputs_count": 0,
           "workflow_id": workflow.get("id") if isinstance(workflow, dict) else None}
    job = {k: v for k, v in job.items() if v is not None}
    if detail:
        job["workflow"] = {"prompt": item.prompt, "extra_data": extra}
    return job


def _history_job(prompt_id: str, entry: dict[str, Any], detail: bool) -> dict[str, Any]:
    _, _, prompt, extra, _ = entry["prompt"]
    status_info = entry.get("status") or {}
    start, end, error, interrupted = _run_times(status_info.get("messages", []))
    status = ("cancelled" if interrupted else "failed") if status_info.get("status_str") == "error" else "completed"
    outputs = entry.get("outputs") or {}
    items = [i for out in outputs.values() if isinstance(out, dict) for kind, lst in out.items()
             if kind != "animated" and isinstance(lst, list) for i in lst if isinstance(i, dict)]
    job = {"id": prompt_id, "status": status, "priority": entry["prompt"][0], "create_time": extra.get("create_time"),
           "execution_start_time": start, "execution_end_time": end, "execution_error": error,
           "outputs_count": len(items), "previewable_outputs_count": len(items), "preview_output": _preview(outputs)}
    job = {k: v for k, v in job.items() if v is not None}
    if detail:
        job.update(outputs=outputs, execution_status=status_info, workflow={"prompt": prompt, "extra_data": extra})
    return job


def _run_times(messages: list[Any]) -> tuple[Any, Any, Any, bool]:
    """From a history entry's status messages: when the run started and ended, its execution_error (the data of
    that message) and whether it was interrupted."""
    start = end = error = None
    interrupted = False
    for message in messages:
        if not (isinstance(message, list) and len(message) >= 2 and isinstance(message[1], dict)):
            continue
        if message[0] == "execution_start":
            start = message[1].get("timestamp")
        elif message[0] in ("execution_success", "execution_error", "execution_interrupted"):
            end = message[1].get("timestamp")
            error = message[1] if message[0] == "execution_error" else error
            interrupted = interrupted or message[0] == "execution_interrupted"
    return start, end, error, interrupted


def _preview(outputs: dict[str, Any]) -> dict[str, Any] | None:
    """The first output image, with its node and media type, as upstream's ``preview_output``."""
    return next((dict(i, nodeId=n, mediaType=k) for n, out in outputs.items() if isinstance(out, dict)
                 for k, lst in out.items() if k == "images" and isinstance(lst, list) for i in lst
                 if isinstance(i, dict) and i.get("type") == "output"), None)


def _bad(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


class Refused(Exception):
    """A query upstream answers 400, with upstream's message."""


@dataclass
class ListQuery:
    """GET /api/jobs's query, checked as upstream checks it."""

    statuses: list[str]
    sort_by: str
    order: str
    limit: int | None
    offset: int

    @classmethod
    def read(cls, query: Mapping[str, str]) -> ListQuery:
        sort_by, order = query.get("sort_by", "created_at").lower(), query.get("sort_order", "desc").lower()
        statuses = _statuses(query.get("status"))
        if sort_by not in ("created_at", "execution_duration"):
            raise Refused("sort_by must be 'created_at' or 'execution_duration'")
        if order not in ("asc", "desc"):
            raise Refused("sort_order must be 'asc' or 'desc'")
        return cls(statuses, sort_by, order, _limit(query), _offset(query))


def _statuses(asked: str | None) -> list[str]:
    if not asked:
        return list(JOB_STATUSES)
    statuses = [s.strip().lower() for s in asked.split(",") if s.strip()]
    invalid = [s for s in statuses if s not in JOB_STATUSES]
    if invalid:
        raise Refused(f"Invalid status value(s): {', '.join(invalid)}. Valid values: {', '.join(JOB_STATUSES)}")
    return statuses


def _limit(query: Mapping[str, str]) -> int | None:
    if "limit" not in query:
        return None
    try:
        limit = int(query["limit"])
    except ValueError:
        raise Refused("limit must be an integer") from None
    if limit <= 0:
        raise Refused("limit must be a positive integer")
    return limit


def _offset(query: Mapping[str, str]) -> int:
    if "offset" not in query:
        return 0
    try:
        return max(0, int(query["offset"]))
    except ValueError:
        raise Refused("offset must be an integer") from None


def _duration(job: dict[str, Any]) -> float:
    start, end = job.get("execution_start_time", 0), job.get("execution_end_time", 0)
    return end - start if end and start else 0


def _created(job: dict[str, Any]) -> float:
    return job.get("create_time", 0)


class JobsApi:
    def __init__(self, server: FakeServer) -> None:
        self.server = server

    async def list(self, request: web.Request) -> web.Response:
        query = request.rel_url.query
        try:
            asked = ListQuery.read(query)
        except Refused as exc:
            return _bad(str(exc))
        queue = self.server.queue
        jobs: list[dict[str, Any]] = []
        if "in_progress" in asked.statuses:
            jobs += [_queue_job(i, "in_progress", False) for i in queue.running.values()]
        if "pending" in asked.statuses:
            jobs += [_queue_job(i, "pending", False) for i in queue.pending]
        jobs += [j for j in (_history_job(k, v, False) for k, v in queue.history.items())
                 if j["status"] in asked.statuses]
        if query.get("workflow_id"):
            jobs = [j for j in jobs if j.get("workflow_id") == query["workflow_id"]]
        jobs.sort(key=_duration if asked.sort_by == "execution_duration" else _created, reverse=asked.order == "desc")
        total = len(jobs)
        jobs = jobs[asked.offset:]
        jobs = jobs[:asked.limit] if asked.limit is not None else jobs
        return web.json_response({"jobs": jobs, "pagination": {"offset": asked.offset, "limit": asked.limit,
                                                                "total": total,
                                                                "has_more": asked.offset + len(jobs) < total}})

    async def get(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        queue = self.server.queue
        if job_id in queue.history:
            return web.json_response(_history_job(job_id, queue.get_history(prompt_id=job_id)[job_id], True))
        for item in queue.running.values():
            if item.prompt_id == job_id:
                return web.json_response(_queue_job(item, "in_progress", True))
        for item in queue.pending:
            if item.prompt_id == job_id:
                return web.json_response(_queue_job(item, "pending", True))
        return web.json_response({"error": "Job not found"}, status=404)

    def cancel_one(self, job_id: str) -> bool:
        """Interrupt it when it is the running prompt, remove it when pending; a finished or unknown id is a
        no-op. Recorded as the fake records /interrupt and /queue deletes, with via="cancel"."""
        queue, recorder = self.server.queue, self.server.recorder
        running = queue.running_ids()
        if job_id in running:
            self.server.executor.interrupt()
            recorder.event("interrupts", prompt_id=job_id, running=job_id, effective=True, via="cancel")
            return True
        if queue.delete_queue_item(job_id):
            recorder.event("queue_deletes", prompt_id=job_id, removed=True, via="cancel")
            return True
        return False

    async def cancel(self, request: web.Request) -> web.Response:
        return web.json_response({"cancelled": self.cancel_one(request.match_info["job_id"])})

    async def cancel_many(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _bad("Request body must be valid JSON")
        ids = body.get("job_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            return _bad("job_ids must be a list")
        invalid = [i if isinstance(i, str) else repr(i) for i in ids if not valid_job_id(i)]
        if invalid:
            return web.json_response({"error": "job_ids contains invalid id(s)", "invalid_ids": invalid}, status=400)
        results = [self.cancel_one(i) for i in ids]
        return web.json_response({"cancelled": any(results)})


def routes(server: FakeServer) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
    """0.38's /api/jobs routes over ``server``'s queue; none for a 0.3.64 fake, which has no jobs API."""
    if not server.version.new:
        return []
    jobs = JobsApi(server)
    return [("GET", "/api/jobs", jobs.list), ("POST", "/api/jobs/cancel", jobs.cancel_many),
            ("GET", "/api/jobs/{job_id}", jobs.get), ("POST", "/api/jobs/{job_id}/cancel", jobs.cancel)]
