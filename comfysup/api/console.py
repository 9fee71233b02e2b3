"""The operator's console under ``/console/`` on the API's listener: plain HTML, CSS and JavaScript from the
package (comfysup/api/console_static), no build step, nothing fetched from anywhere else.

Pages, each a URL to share: ``/console/`` (the overview), ``/console/jobs?q=TEXT&state=STATE`` (a search,
comfysup.api.console_query), ``/console/jobs/<job id>`` (a job). Every page is the same document whose ``<base>``
is relative to its own URL (``./`` or ``../``), and every link and request of its script is relative to that base:
behind a reverse proxy that serves the API under a path prefix, the console works unchanged.

Its JSON (under ``/console/api/``): ``session``, ``overview`` and ``events`` (live, comfysup.api.console_live),
``jobs`` (a search's page), ``jobs/<id>`` (comfysup.api.console_views), ``previews/<job id>``; an output's bytes
at ``/console/files/<asset id>`` (as the API's content route). Who may read and act: comfysup.api.console_auth;
the actions are comfysup.api.console_actions's. The API's own routes are unchanged: the console is reached with a
session cookie instead of the bearer token, and only under ``/console/``.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

from aiohttp import web

from comfysup.api import console_actions, console_query, console_views, outputs
from comfysup.api.console_auth import SESSIONS_KEY, Sessions
from comfysup.api.console_live import HUB_KEY, Hub
from comfysup.api.errors import ApiError, not_found
from comfysup.api.replies import STATE_KEY, json_response
from comfysup.errors import NotFound
from comfysup.jobs import JobLineError, canonical_id
from comfysup.queue.search import SearchError

ROOT = "/console"
STATIC = Path(__file__).with_name("console_static")
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob: https: http:; "
            "media-src 'self' blob: https: http:; connect-src 'self'; base-uri 'self'; form-action 'self'; "
            "frame-ancestors 'none'")


def _page(base: str) -> web.Response:
    text = (STATIC / "index.html").read_text(encoding="utf-8").replace("{{BASE}}", html.escape(base))
    return web.Response(text=text, content_type="text/html", headers={
        "Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-store", "Referrer-Policy": "same-origin",
        "X-Frame-Options": "DENY"})


async def overview_page(request: web.Request) -> web.Response:
    return _page("./")


async def job_page(request: web.Request) -> web.Response:
    return _page("../")


async def to_overview(request: web.Request) -> web.Response:
    raise web.HTTPFound("console/")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not path.is_file():
        raise not_found("route")
    return web.Response(body=path.read_bytes(), content_type=STATIC_TYPES[path.suffix].split(";")[0],
                        charset="utf-8", headers={"Cache-Control": "no-cache"})


async def session(request: web.Request) -> web.Response:
    """Whether the console is read-only, whether this browser is logged in, and the CSRF token of its session."""
    sessions = request.app[SESSIONS_KEY]
    mine = sessions.of(request)
    return json_response({"read_only": sessions.read_only, "logged_in": mine is not None,
                          "who": mine.who if mine else None, "csrf": mine.csrf if mine else None,
                          "may_read": sessions.read_only or mine is not None}, headers={"Cache-Control": "no-store"})


async def overview(request: web.Request) -> web.Response:
    request.app[SESSIONS_KEY].may_read(request)
    return json_response(await request.app[HUB_KEY].overview())


async def events(request: web.Request) -> web.StreamResponse:
    request.app[SESSIONS_KEY].may_read(request)
    return await request.app[HUB_KEY].stream(request)


async def jobs(request: web.Request) -> web.Response:
    """A page of a search: its rows and the ``after`` of the next page (null: the last)."""
    request.app[SESSIONS_KEY].may_read(request)
    state = request.app[STATE_KEY]
    try:
        search = console_query.parse(request.query)
        page = await state.call(state.queue.search.search, search)
    except SearchError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return json_response({"rows": [console_views.row(r) for r in page.rows],
                          "after": console_query.cursor_text(page.cursor)})


def job_id(request: web.Request) -> str:
    try:
        return canonical_id(request.match_info["id"])
    except JobLineError:
        raise not_found("job") from None


async def job(request: web.Request) -> web.Response:
    request.app[SESSIONS_KEY].may_read(request)
    state = request.app[STATE_KEY]
    wanted = job_id(request)

    def read() -> tuple[object, int | None]:
        record = state.queue.reads.get(wanted)
        return record, state.queue.reads.queue_position(wanted)

    try:
        record, position = await state.call(read)
    except NotFound:
        raise not_found("job") from None
    return json_response(console_views.job(record, time.time(), state.links, position))  # type: ignore[arg-type]


async def files(request: web.Request) -> web.StreamResponse:
    """An output's bytes, as the API's content route serves them (Range, a bucket's redirect)."""
    request.app[SESSIONS_KEY].may_read(request)
    return await outputs.content_of(request)


async def preview(request: web.Request) -> web.Response:
    """A running job's latest preview image, as the overview last read it."""
    request.app[SESSIONS_KEY].may_read(request)
    found = request.app[HUB_KEY].previews.get(job_id(request))
    if found is None:
        raise not_found("preview")
    return web.Response(body=found.data, content_type=found.content_type, headers={"Cache-Control": "no-store"})


def is_console(path: str) -> bool:
    """The console's paths: reached with its session, never the bearer token (comfysup.api.app's guard)."""
    return path == ROOT or path.startswith(ROOT + "/")


def install(app: web.Application) -> None:
    state = app[STATE_KEY]
    app[SESSIONS_KEY] = Sessions(state.config.api.token)
    app[HUB_KEY] = Hub(state.call, state.queue, state.config)
    app.on_shutdown.append(app[HUB_KEY].stop)
    app.router.add_get(ROOT, to_overview)
    app.router.add_get(f"{ROOT}/", overview_page)
    app.router.add_get(f"{ROOT}/jobs", overview_page)
    app.router.add_get(f"{ROOT}/jobs/{{id}}", job_page)
    app.router.add_get(f"{ROOT}/static/{{name}}", static)
    app.router.add_get(f"{ROOT}/api/session", session)
    app.router.add_get(f"{ROOT}/api/overview", overview)
    app.router.add_get(f"{ROOT}/api/events", events, allow_head=False)  # a HEAD would get frames after its headers
    app.router.add_get(f"{ROOT}/api/jobs", jobs)
    app.router.add_get(f"{ROOT}/api/jobs/{{id}}", job)
    app.router.add_get(f"{ROOT}/api/previews/{{id}}", preview)
    app.router.add_get(f"{ROOT}/files/{{id}}", files)
    console_actions.install(app, ROOT)
