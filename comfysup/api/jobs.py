"""The routes of ``/api/v2/jobs``: submit (POST, with its single-use ``Idempotency-Key``), one job, its executed
workflow, cancel, and the list, newest first, filtered by labels and status and paged by an opaque cursor."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import time
import uuid
from typing import Any

from aiohttp import web

from comfysup import assets as file_assets
from comfysup.api import tenancy, views
from comfysup.api.errors import ApiError, not_found
from comfysup.api.intake import KEY_NAMESPACE, job_id_for
from comfysup.api.replies import STATE_KEY, read_json
from comfysup.api.replies import job_id as _job_id
from comfysup.api.replies import json_response as _json
from comfysup.api.replies import origin as _origin
from comfysup.api.state import State
from comfysup.errors import NotFound
from comfysup.jobs import MAX_WORKFLOW_BYTES
from comfysup.jobs.inputs import InputFiles
from comfysup.queue.assets import AssetMissing
from comfysup.queue.base import SubmitConflict
from comfysup.queue.tenants import TenantFull, tenant_of
from comfysup.records import replace

LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
SCAN_PAGES = 20
"""A filtered list reads at most this many pages of ``limit`` jobs for one answer, then hands back a cursor."""
QUEUE_FULL_RETRY_SECONDS = 5
MAX_CURSOR = 2**63 - 1
"""A cursor is a job's sequence number, a signed 64-bit integer in both queues."""


async def post_job(request: web.Request) -> web.Response:
    state: State = request.app[STATE_KEY]
    body = await read_json(request, MAX_WORKFLOW_BYTES, f"{MAX_WORKFLOW_BYTES // 2**20} MiB (a job's workflow)")
    key = request.headers.get("Idempotency-Key")
    who = tenancy.tenant(request)
    await _refuse_reuse(state, key, who)
    state.intake.line(body, key)  # refused on its face before any URL of it is fetched
    try:
        fetched = await _fetch(state, body)
    except ApiError as exc:
        if exc.code == "missing_asset":  # its job made meanwhile by a request with the same key: that is the answer
            await _refuse_reuse(state, key, who)
        raise
    if fetched is None:
        return await state.call(_submit, state, body, key, who, _origin(request))
    # Removed once the worker is done with them, not when this request is: a client that leaves cancels the
    # request (handler_cancellation) while the worker may be copying the staged files into the asset store.
    submitting = state.worker.submit(_submit, state, body, key, who, _origin(request), fetched)
    submitting.add_done_callback(lambda _done: fetched.release())
    return await asyncio.wrap_future(submitting)


async def _fetch(state: State, body: Any) -> InputFiles | None:
    """The body's inputs by URL, fetched in a thread of their own (never in the queue's one worker). A request
    cancelled meanwhile (its client left) does not stop the download: its files are removed when it ends."""
    fetching = asyncio.get_running_loop().run_in_executor(state.fetcher, state.intake.fetch, body)
    try:
        return await asyncio.shield(fetching)
    except asyncio.CancelledError:
        fetching.add_done_callback(_release_fetched)
        raise


def _release_fetched(done: asyncio.Future[InputFiles | None]) -> None:
    if not done.cancelled() and done.exception() is None and (fetched := done.result()) is not None:
        fetched.release()


def _submit(state: State, body: Any, key: str | None, who: str, origin: str, fetched: Any = None) -> web.Response:
    """In the worker thread: validate, bound the queue, insert as the caller's tenant ``who`` (durable before the
    answer), answer.

    The Idempotency-Key is single-use: the request whose transaction inserts the key's job wins (201); every other
    request with that key, before, after or at the same time, finds the job in the queue and is 422
    ``idempotency_key_reuse`` naming it (``details.job_id``), so a retry after a lost answer never makes a second
    job and can still find the first (docs/reliability.md)."""
    job = state.intake.job(body, key, state.catalogues(), functools.partial(state.inputs, who=who), fetched)
    job = replace(job, id=_job_id_of(key, who) if key is not None else job.id, tenant=tenant_of(who))
    if key is not None and _known(state, job.id):
        raise _reused(job.id)
    bound = state.config.api.max_queued
    if bound and state.queue.reads.active_count() >= bound:
        raise ApiError(429, "queue_full", f"the queue holds {bound} or more jobs not yet ended ([api] "
                       "max_queued); retry later", headers={"Retry-After": str(QUEUE_FULL_RETRY_SECONDS)})
    try:
        result = state.queue.intake.submit([job])
    except SubmitConflict:
        raise _reused(job.id) from None
    except TenantFull as exc:
        raise tenancy.full(exc, QUEUE_FULL_RETRY_SECONDS) from None
    except AssetMissing as exc:  # pruned between the lookup and the insert
        raise ApiError(422, "missing_asset", str(exc)) from None
    if not result.inserted:  # another request with this key committed the job since the look above
        raise _reused(job.id)
    record = state.queue.reads.get(job.id)
    return _json(views.job(record, origin, time.time(), _place(state, record), links=state.links),
                 status=201,
                 headers={"Location": views.job_urls(job.id, origin)["self"]})


def _job_id_of(key: str | None, who: str) -> str:
    """The id of the job an Idempotency-Key makes (comfysup.api.intake.job_id_for), kept apart per tenant: one
    tenant's key never names, nor reveals, another's job."""
    made = job_id_for(key)
    return str(uuid.uuid5(KEY_NAMESPACE, f"{who}\0{made}")) if who and key is not None else made


async def _refuse_reuse(state: State, key: str | None, who: str) -> None:
    """A key whose job the queue holds is 422 idempotency_key_reuse naming it, whatever the body: before the body is
    checked or its URLs fetched (a retry downloads nothing again; a link expired since does not hide the job)."""
    if key is not None and await state.call(_known, state, _job_id_of(key, who)):
        raise _reused(_job_id_of(key, who))


def _known(state: State, job_id: str) -> bool:
    try:
        state.queue.reads.get(job_id)
    except NotFound:
        return False
    return True


def _reused(job_id: str) -> ApiError:
    return ApiError(422, "idempotency_key_reuse", f"this Idempotency-Key was used before, for job {job_id}; keys "
                    "are single-use: GET that job (its status, its outputs) instead of submitting again, or send "
                    "a new key for a new job", details={"job_id": job_id})


async def get_job(request: web.Request) -> web.Response:
    state: State = request.app[STATE_KEY]
    record, place = await state.call(_placed, state, _job_id(request), tenancy.tenant(request))
    return _json(views.job(record, _origin(request), time.time(), place, links=state.links))


def _placed(state: State, job_id: str, who: str) -> tuple[Any, int | None]:
    record = _record(state, job_id, who)
    return record, _place(state, record)


def _place(state: State, record: Any) -> int | None:
    """A waiting job's place in line (``Queue.queue_position``), read only for a job the contract shows queued."""
    return state.queue.reads.queue_position(record.id) if views.status(record) == "queued" else None


def _record(state: State, job_id: str, who: str) -> Any:
    """The job ``job_id`` as the caller ``who`` may see it; 404 when there is none, or it is another tenant's."""
    try:
        return tenancy.owned(who, state.queue.reads.get(job_id))
    except NotFound:
        raise not_found("job") from None


async def get_workflow(request: web.Request) -> web.Response:
    """The executed API-format graph (comfy-sdk 0.5.0 ``JobWorkflowResponse``, ``format: api``: "the executed
    API-format prompt graph"; the spec does not draw this route): each input file named as ComfyUI receives it
    (``comfysup/<hash>.<ext>``, as comfy-api-proxy answers the name it gave), never the ``core/ASSET`` object.
    comfysup keeps no UI export, so ``format`` is never ``save``."""
    state: State = request.app[STATE_KEY]
    record = await state.call(_record, state, _job_id(request), tenancy.tenant(request))
    workflow = file_assets.with_names(record.workflow, {
        file_assets.ref_hash(ref): file_assets.upload_name(file_assets.ref_hash(ref), file_assets.ref_name(ref))
        for _node, _input, ref in file_assets.references(record.workflow)})
    return _json({"workflow": workflow, "format": "api"})


async def cancel_job(request: web.Request) -> web.Response:
    """``comfysup cancel``'s transition: a queued job ends cancelled, a running one is marked (``canceling``) and
    its runner interrupts it; an ended job stays as it is (idempotent, as the contract says)."""
    state: State = request.app[STATE_KEY]
    job_id = _job_id(request)
    who = tenancy.tenant(request)

    def cancel() -> Any:
        record = _record(state, job_id, who)
        if record.state not in ("done", "dead", "cancelled"):
            state.queue.intake.cancel([job_id])
            record = state.queue.reads.get(job_id)
        return record, _place(state, record)

    record, place = await state.call(cancel)
    return _json(views.job(record, _origin(request), time.time(), place, links=state.links))


def _cursor(text: str | None) -> int | None:
    if not text:
        return None
    try:
        value = int(base64.urlsafe_b64decode(text.encode() + b"==").decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ApiError(400, "invalid_request", "cursor is not one this API handed out") from None
    if not 0 < value <= MAX_CURSOR:
        raise ApiError(400, "invalid_request", "cursor is not one this API handed out")
    return value


def _encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(str(seq).encode()).decode().rstrip("=")


async def list_jobs(request: web.Request) -> web.Response:
    """Newest first; ``metadata[<key>]=<value>`` filters (all must match), ``status`` (contract names, comma
    separated), ``limit`` (1 to 500) and an opaque ``cursor`` (comfy-sdk 0.5.0 ``comfy_low/transport.py``
    ``_jobs_list_path``). A filtered page reads at most SCAN_PAGES pages of the queue; it may then be short and
    carry a cursor, which the SDK follows."""
    state: State = request.app[STATE_KEY]
    query = request.query
    try:
        limit = int(query.get("limit", LIST_LIMIT))
    except ValueError:
        raise ApiError(400, "invalid_request", "limit must be a whole number") from None
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ApiError(400, "invalid_request", f"limit must be from 1 to {MAX_LIST_LIMIT}")
    wanted = {k[len("metadata["):-1]: v for k, v in query.items() if k.startswith("metadata[") and k.endswith("]")}
    statuses = {s for s in query.get("status", "").split(",") if s}
    unknown = statuses - set(views.STATUS.values()) - {"canceling", "expired"}
    if unknown:
        raise ApiError(400, "invalid_request", f"unknown status {sorted(unknown)[0]!r}")
    before = _cursor(query.get("cursor"))
    who = tenancy.tenant(request)

    def page() -> tuple[list[Any], int | None]:
        found: list[Any] = []
        cursor = before
        for _ in range(SCAN_PAGES):
            cursor, records = state.queue.reads.newest(cursor, limit)
            for record in records:
                labels = views.labels(record.meta)
                if (not statuses or views.status(record) in statuses) and tenancy.sees(who, record) and \
                        all(labels.get(k) == v for k, v in wanted.items()):
                    found.append(record)
            if cursor is None or len(found) >= limit or not (wanted or statuses or who):
                break
        return found[:limit], cursor

    records, cursor = await state.call(page)
    origin = _origin(request)
    body: dict[str, Any] = {"jobs": [views.summary(r, origin) for r in records]}
    if cursor is not None:
        body["next_cursor"] = _encode_cursor(cursor)
    return _json(body)
