"""The routes of ``/api/v2`` on aiohttp (already comfysup's runtime dependency, and what ComfyUI itself and
fake_comfy are built on): one event loop for many slow clients and event streams, while every queue call runs
in a single worker thread, so the queue (a blocking SQLite or PostgreSQL connection) is used by one thread and
the loop never waits on an fsync.

Paths, bodies and codes: comfy-api-proxy ``spec/openapi.yaml@37fbee21df60dd598638786cbdcc6c1e1beada7c`` (see
comfysup.api). Everything answered is built by comfysup.api.views; nothing of a job's ``extra_data`` (partner
keys) is ever in an answer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from comfysup import assets as file_assets
from comfysup.api import assets, events, outputs, placement, remote, views
from comfysup.api.connections import track
from comfysup.api.errors import ApiError, not_found
from comfysup.api.intake import Intake, job_id_for
from comfysup.api.replies import STATE_KEY, harden, read_json
from comfysup.api.replies import job_id as _job_id
from comfysup.api.replies import json_response as _json
from comfysup.api.replies import origin as _origin
from comfysup.api.security import Cors, HostCheck, check_origin, check_token
from comfysup.config import Config
from comfysup.errors import NotFound
from comfysup.jobs import MAX_WORKFLOW_BYTES
from comfysup.jobs.catalogue import Catalogue
from comfysup.jobs.inputs import InputFiles
from comfysup.queue.assets import AssetMissing
from comfysup.queue.base import SubmitConflict
from comfysup.queue.watch import EXIT_DATABASE_REPLACED, QueueWatch, lost_line
from comfysup.slotstate import read_state, readiness
from comfysup.storage.links import Links

log = logging.getLogger("comfysup.api")
T = TypeVar("T")
API = views.API
LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
SCAN_PAGES = 20
"""A filtered list reads at most this many pages of ``limit`` jobs for one answer, then hands back a cursor."""
CATALOGUE_SECONDS = 5.0
"""How long the node catalogues read from the queue are reused before they are read again."""
QUEUE_FULL_RETRY_SECONDS = 5
CORS_KEY = web.RequestKey("cors_origin", str)
"""The request's Origin when it is one of ``[api] allowed_origins`` (its answer carries the CORS headers)."""
FETCH_THREADS = 4
"""Inputs by URL downloaded at once, in threads of their own: a slow one may take [inputs] max_seconds, and in the
loop's default executor a few would hold the threads that uploads and the queue file's watch need. More wait."""
MAX_CURSOR = 2**63 - 1
"""A cursor is a job's sequence number, a signed 64-bit integer in both queues."""


class State:
    """What the handlers share: the config, the queue, its one worker thread, the intake and the catalogues."""

    def __init__(self, config: Config, queue: Any) -> None:
        self.config = config
        self.queue = queue
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="comfysup-api-queue")
        self.fetcher = concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="comfysup-api-fetch")
        self.intake = Intake(config.resolve("."), config)
        self.store = config.resolve(config.store.dir)
        self.cors = Cors(config.api.allowed_origins)
        self.links = Links(config.store)
        """Presigned URLs of outputs in a bucket ([store] url, issue 33)."""
        self.hosts = HostCheck(config.api.listen.rpartition(":")[0], config.api.public_url, config.api.allowed_hosts)
        self.inputs = outputs.Inputs(self)
        """What a workflow's core/ASSET reference names: an upload, or an output (comfysup.api.outputs)."""
        self._catalogues: list[Catalogue] = []
        self._catalogues_at = float("-inf")
        self.watch = QueueWatch(queue, on_lost=lambda why: log.error("%s; the API answers 503 and stops (exit code "
                                                                     "%d)", lost_line(why), EXIT_DATABASE_REPLACED))
        """The queue's file (comfysup.queue.watch): lost, every answer is 503 and the process stops (serve.py)."""

    async def lost(self, write: bool) -> str | None:
        """Why the queue's file is lost, else None; looked at again just before a request that writes."""
        if write and self.watch.lost is None:
            await self.call(lambda: self.watch.check(force=True))
        return None if self.watch.lost is None else lost_line(self.watch.lost)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.worker, lambda: fn(*args))

    def catalogues(self) -> list[Catalogue]:
        """In the worker thread: the catalogues the servers have now, read at most every few seconds."""
        now = time.monotonic()
        if now - self._catalogues_at > CATALOGUE_SECONDS:
            self._catalogues = [Catalogue(r.id, r.info, tuple(r.servers)) for r in self.queue.fleet.catalogues()]
            self._catalogues_at = now
        return self._catalogues


@web.middleware
async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    """Host first, then a CORS preflight (answered here, without the token), then Origin, then the token
    (comfysup.api.security; ``health`` asks none); every error as the contract's envelope."""
    state: State = request.app[STATE_KEY]
    try:
        sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
        state.hosts.check(request.headers.get("Host"), sockname[:2] if isinstance(sockname, tuple) else None)
        origin = request.headers.get("Origin")
        if state.cors.allows(origin):
            request[CORS_KEY] = origin
        if request.method == "OPTIONS":
            return web.Response(status=204, headers=state.cors.preflight(origin, _methods(request)))
        check_origin(origin, request.headers.get("Sec-Fetch-Site"), request.host, state.config.api.allowed_origins)
        if not _is_health(request):
            check_token(state.config.api.token, request.headers.get("Authorization"))
        lost = await state.lost(write=request.method not in ("GET", "HEAD"))
        if lost is not None and not _is_health(request):
            raise ApiError(503, "queue_unavailable", f"{lost}; this API accepts nothing more and stops")
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except HttpProcessingError as exc:  # a body aiohttp's readers cannot parse (a multipart part's header line)
        return ApiError(400, "invalid_request", f"the request's body is malformed: {exc.message}",
                        close=True).response()
    except web.HTTPRequestEntityTooLarge:
        return ApiError(413, "payload_too_large", f"the body is larger than {state.config.api.max_upload_mb} MiB "
                        "([api] max_upload_mb)").response()
    except web.HTTPNotFound:
        return not_found("route").response()
    except web.HTTPMethodNotAllowed as exc:
        return ApiError(405, "method_not_allowed", f"{request.method} is not allowed here",
                        headers={"Allow": ", ".join(sorted(exc.allowed_methods))}).response()


def _is_health(request: web.Request) -> bool:
    """Health and readiness ask no token: a load balancer's probe holds none (an ALB's sends no header at all)."""
    return request.path in (f"{API}/health", "/ready", f"{API}/ready") and request.method in ("GET", "HEAD")


def _trusted(state: State, request: web.Request) -> bool:
    """Whether the caller holds the token: only then do health and readiness say more than their status."""
    try:
        check_token(state.config.api.token, request.headers.get("Authorization"))
    except ApiError:
        return False
    return True


def _methods(request: web.Request) -> set[str]:
    """The methods of the route an OPTIONS request names; 404 for a path the API does not serve."""
    problem = getattr(request.match_info, "http_exception", None)
    if isinstance(problem, web.HTTPMethodNotAllowed):
        return set(problem.allowed_methods)
    raise not_found("route")


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: an answer to an allowed origin (an event stream, an error) carries its CORS
    headers, so the page's script can read it; ``Vary: Origin`` wherever an allowlist makes answers differ."""
    state: State = request.app[STATE_KEY]
    if not state.cors.allowed:
        return
    vary = {v.strip().lower() for v in response.headers.get("Vary", "").split(",") if v.strip()}
    if "origin" not in vary:
        response.headers["Vary"] = ", ".join(filter(None, (response.headers.get("Vary"), "Origin")))
    origin = request.get(CORS_KEY)
    if origin and "Access-Control-Allow-Origin" not in response.headers:
        response.headers.update(state.cors.headers(origin))


async def health(request: web.Request) -> web.Response:
    """Asks no token (a load balancer or a supervisor probes it), as comfy-api-proxy's ``GET /api/v2/health``:
    ``{"status": "healthy"}`` while the queue answers, else 503 ``unavailable`` with why. How many jobs are
    active is said only to a caller the token check would let in."""
    state: State = request.app[STATE_KEY]
    lost = await state.lost(write=True)
    if lost is not None:
        return _json({"status": "unavailable", "queue": "lost", "reason": lost}, status=503)
    try:
        active = await state.call(state.queue.reads.active_count)
    except Exception as exc:  # the queue does not answer: not healthy, and say why (no secret in it)
        log.warning("api health: the queue does not answer: %s", exc)
        return _json({"status": "unavailable", "queue": "unavailable"}, status=503)
    body: dict[str, Any] = {"status": "healthy", "queue": "ok"}
    if _trusted(state, request):
        body["active_jobs"] = active
    return _json(body)


async def ready(request: web.Request) -> web.Response:
    """Readiness for load balancers and autoscalers (``/health`` stays liveness): 200 once a slot of this machine's
    supervisor is warm, 503 before and while the queued jobs per ready slot exceed ``[api]
    ready_max_queue_per_slot``. No token asked (as health); why, and the counts, only to a caller holding it."""
    state: State = request.app[STATE_KEY]
    body = await _readiness(state)
    status = 200 if body["status"] == "ready" else 503
    return _json(body if _trusted(state, request) else {"status": body["status"]}, status=status)


async def _readiness(state: State) -> dict[str, Any]:
    lost = await state.lost(write=False)
    if lost is not None:
        return {"status": "not_ready", "reason": lost}
    try:
        status = await state.call(state.queue.reads.status, None, 0)
    except Exception as exc:  # the queue does not answer: nothing can be taken in
        log.warning("api ready: the queue does not answer: %s", exc)
        return {"status": "not_ready", "reason": "the queue does not answer"}
    return readiness(read_state(state.config), status.counts.get("queued", 0),
                     state.config.api.ready_max_queue_per_slot).body()


async def post_job(request: web.Request) -> web.Response:
    state: State = request.app[STATE_KEY]
    body = await read_json(request, MAX_WORKFLOW_BYTES, f"{MAX_WORKFLOW_BYTES // 2**20} MiB (a job's workflow)")
    key = request.headers.get("Idempotency-Key")
    await _refuse_reuse(state, key)
    state.intake.line(body, key)  # refused on its face before any URL of it is fetched
    try:
        fetched = await _fetch(state, body)
    except ApiError as exc:
        if exc.code == "missing_asset":  # its job made meanwhile by a request with the same key: that is the answer
            await _refuse_reuse(state, key)
        raise
    if fetched is None:
        return await state.call(_submit, state, body, key, _origin(request))
    # Removed once the worker is done with them, not when this request is: a client that leaves cancels the
    # request (handler_cancellation) while the worker may be copying the staged files into the asset store.
    submitting = state.worker.submit(_submit, state, body, key, _origin(request), fetched)
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


def _submit(state: State, body: Any, key: str | None, origin: str, fetched: Any = None) -> web.Response:
    """In the worker thread: validate, bound the queue, insert (durable before the answer), answer.

    The Idempotency-Key is single-use: the request whose transaction inserts the key's job wins (201); every other
    request with that key, before, after or at the same time, finds the job in the queue and is 422
    ``idempotency_key_reuse`` naming it (``details.job_id``), so a retry after a lost answer never makes a second
    job and can still find the first (docs/reliability.md)."""
    job = state.intake.job(body, key, state.catalogues(), state.inputs, fetched)
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
    except AssetMissing as exc:  # pruned between the lookup and the insert
        raise ApiError(422, "missing_asset", str(exc)) from None
    if not result.inserted:  # another request with this key committed the job since the look above
        raise _reused(job.id)
    record = state.queue.reads.get(job.id)
    return _json(views.job(record, origin, time.time(), _place(state, record), links=state.links),
                 status=201,
                 headers={"Location": views.job_urls(job.id, origin)["self"]})


async def _refuse_reuse(state: State, key: str | None) -> None:
    """A key whose job the queue holds is 422 idempotency_key_reuse naming it, whatever the body: before the body is
    checked or its URLs fetched (a retry downloads nothing again; a link expired since does not hide the job)."""
    if key is not None and await state.call(_known, state, job_id_for(key)):
        raise _reused(job_id_for(key))


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
    record, place = await state.call(_placed, state, _job_id(request))
    return _json(views.job(record, _origin(request), time.time(), place, links=state.links))


def _placed(state: State, job_id: str) -> tuple[Any, int | None]:
    record = _record(state, job_id)
    return record, _place(state, record)


def _place(state: State, record: Any) -> int | None:
    """A waiting job's place in line (``Queue.queue_position``), read only for a job the contract shows queued."""
    return state.queue.reads.queue_position(record.id) if views.status(record) == "queued" else None


def _record(state: State, job_id: str) -> Any:
    try:
        return state.queue.reads.get(job_id)
    except NotFound:
        raise not_found("job") from None


async def get_workflow(request: web.Request) -> web.Response:
    """The executed API-format graph (comfy-sdk 0.5.0 ``JobWorkflowResponse``, ``format: api``: "the executed
    API-format prompt graph"; the spec does not draw this route): each input file named as ComfyUI receives it
    (``comfysup/<hash>.<ext>``, as comfy-api-proxy answers the name it gave), never the ``core/ASSET`` object.
    comfysup keeps no UI export, so ``format`` is never ``save``."""
    state: State = request.app[STATE_KEY]
    record = await state.call(_record, state, _job_id(request))
    workflow = file_assets.with_names(record.workflow, {
        file_assets.ref_hash(ref): file_assets.upload_name(file_assets.ref_hash(ref), file_assets.ref_name(ref))
        for _node, _input, ref in file_assets.references(record.workflow)})
    return _json({"workflow": workflow, "format": "api"})


async def cancel_job(request: web.Request) -> web.Response:
    """``comfysup cancel``'s transition: a queued job ends cancelled, a running one is marked (``canceling``) and
    its runner interrupts it; an ended job stays as it is (idempotent, as the contract says)."""
    state: State = request.app[STATE_KEY]
    job_id = _job_id(request)

    def cancel() -> Any:
        record = _record(state, job_id)
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

    def page() -> tuple[list[Any], int | None]:
        found: list[Any] = []
        cursor = before
        for _ in range(SCAN_PAGES):
            cursor, records = state.queue.reads.newest(cursor, limit)
            for record in records:
                labels = views.labels(record.meta)
                if (not statuses or views.status(record) in statuses) and \
                        all(labels.get(k) == v for k, v in wanted.items()):
                    found.append(record)
            if cursor is None or len(found) >= limit or not (wanted or statuses):
                break
        return found[:limit], cursor

    records, cursor = await state.call(page)
    origin = _origin(request)
    body: dict[str, Any] = {"jobs": [views.summary(r, origin) for r in records]}
    if cursor is not None:
        body["next_cursor"] = _encode_cursor(cursor)
    return _json(body)


def make_app(config: Config, queue: Any) -> web.Application:
    app = web.Application(middlewares=[track(config.api.body_timeout_seconds), guard],
                          client_max_size=config.api.max_upload_mb * 2**20)
    app.on_response_prepare.append(harden)
    app.on_response_prepare.append(cors_headers)
    state = State(config, queue)
    app[STATE_KEY] = state
    app.router.add_get(f"{API}/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get(f"{API}/ready", ready)
    app.router.add_post(f"{API}/jobs", post_job)
    app.router.add_get(f"{API}/jobs", list_jobs)
    app.router.add_get(f"{API}/jobs/{{id}}", get_job)
    app.router.add_get(f"{API}/jobs/{{id}}/workflow", get_workflow)
    app.router.add_post(f"{API}/jobs/{{id}}/cancel", cancel_job)
    app.router.add_post(f"{API}/assets", assets.post_asset)
    app.router.add_post(f"{API}/assets/from-hash", assets.from_hash)
    app.router.add_post(f"{API}/assets/from-path", placement.from_path)
    app.router.add_route("HEAD", f"{API}/assets/by-hash/{{hash}}", assets.by_hash)
    app.router.add_get(f"{API}/assets/{{id}}", outputs.get_asset)
    app.router.add_delete(f"{API}/assets/{{id}}", assets.delete_asset)
    app.router.add_get(f"{API}/assets/{{id}}/content", outputs.content_of)
    events.install(app, state.call, queue, config.api.max_event_streams, state.links)
    remote.install(app)

    async def stopping(app: web.Application) -> None:  # before the requests in flight are waited for
        state.intake.stopping.set()

    async def close(app: web.Application) -> None:
        state.worker.shutdown(wait=True)
        state.fetcher.shutdown(wait=False, cancel_futures=True)

    app.on_shutdown.append(stopping)
    app.on_cleanup.append(close)
    return app
