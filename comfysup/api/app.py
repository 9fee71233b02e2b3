"""The application of ``/api/v2`` on aiohttp (already comfysup's runtime dependency, and what ComfyUI itself and
fake_comfy are built on): one event loop for many slow clients and event streams, while every queue call runs
in a single worker thread, so the queue (a blocking SQLite or PostgreSQL connection) is used by one thread and
the loop never waits on an fsync. Here: the guard every request passes (Host, CORS, Origin, token, a lost
queue), health and readiness, and the routing table; the routes are comfysup.api.jobs's and assets's.

Paths, bodies and codes: comfy-api-proxy ``spec/openapi.yaml@37fbee21df60dd598638786cbdcc6c1e1beada7c`` (see
comfysup.api). Everything answered is built by comfysup.api.views; nothing of a job's ``extra_data`` (partner
keys) is ever in an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from comfysup.api import assets, console, events, jobs, outputs, placement, remote, views
from comfysup.api.connections import track
from comfysup.api.errors import ApiError, not_found, queue_unavailable
from comfysup.api.replies import STATE_KEY, harden
from comfysup.api.replies import json_response as _json
from comfysup.api.security import check_origin
from comfysup.api.state import State
from comfysup.api.tenancy import TENANT_KEY
from comfysup.config import Config
from comfysup.errors import QueueUnavailable
from comfysup.slotstate import read_state, readiness

log = logging.getLogger("comfysup.api")
API = views.API
CORS_KEY = web.RequestKey("cors_origin", str)
"""The request's Origin when it is one of ``[api] allowed_origins`` (its answer carries the CORS headers)."""


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
        if not _is_health(request) and not console.is_console(request.path):  # the console asks its session
            request[TENANT_KEY] = state.tenancy.caller(request.headers.get("Authorization"))
        lost = await state.lost(write=request.method not in ("GET", "HEAD"))
        if lost is not None and not _is_health(request):
            raise ApiError(503, "queue_unavailable", f"{lost}; this API accepts nothing more and stops")
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except QueueUnavailable as exc:  # the database went away (or a backup holds its lock): it comes back by itself
        log.warning("api %s %s: the queue does not answer: %s", request.method, request.path, exc)
        return queue_unavailable(exc, writes=request.method not in ("GET", "HEAD")).response()
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
    """Whether the caller holds the admin token: only then do health and readiness say more than their status."""
    try:
        return state.tenancy.caller(request.headers.get("Authorization")) == ""
    except ApiError:
        return False


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
    app.router.add_post(f"{API}/jobs", jobs.post_job)
    app.router.add_get(f"{API}/jobs", jobs.list_jobs)
    app.router.add_get(f"{API}/jobs/{{id}}", jobs.get_job)
    app.router.add_get(f"{API}/jobs/{{id}}/workflow", jobs.get_workflow)
    app.router.add_post(f"{API}/jobs/{{id}}/cancel", jobs.cancel_job)
    app.router.add_post(f"{API}/assets", assets.post_asset)
    app.router.add_post(f"{API}/assets/from-hash", assets.from_hash)
    app.router.add_post(f"{API}/assets/from-path", placement.from_path)
    app.router.add_route("HEAD", f"{API}/assets/by-hash/{{hash}}", assets.by_hash)
    app.router.add_get(f"{API}/assets/{{id}}", outputs.get_asset)
    app.router.add_delete(f"{API}/assets/{{id}}", outputs.delete_asset)
    app.router.add_get(f"{API}/assets/{{id}}/content", outputs.content_of)
    events.install(app, state.call, queue, config.api.max_event_streams, state.links)
    remote.install(app)
    console.install(app)

    async def stopping(app: web.Application) -> None:  # before the requests in flight are waited for
        state.intake.stopping.set()

    async def close(app: web.Application) -> None:
        state.worker.shutdown(wait=True)
        state.fetcher.shutdown(wait=False, cancel_futures=True)

    app.on_shutdown.append(stopping)
    app.on_cleanup.append(close)
    return app
