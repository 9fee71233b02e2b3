"""What the console changes, each only with authority (comfysup.api.console_auth: a session, its CSRF token,
the console's own origin) and each with an audit line: log in and out, cancel jobs, retry dead jobs, retry
every dead letter a search matches, hold a slot (drain it: its job finishes, it claims no other) and put it
back, and restart a slot's server (comfysup.queue.orders, carried out by comfysup.supervisor.orders).

A bulk retry is asked twice: ``GET api/count`` says how many dead jobs the search matches, the person confirms
that number, and ``POST api/actions/retry-search`` carries it as ``expected``; when the search matches another
number by then (a job died or was retried meanwhile) nothing is done and the answer (409) says the new count,
so what is retried is always what was confirmed. A search matching more than MAX_BULK is refused: narrow it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from comfysup.api import console_auth, console_query
from comfysup.api.console_auth import SESSIONS_KEY, Sessions, body_text, record
from comfysup.api.errors import ApiError
from comfysup.api.replies import STATE_KEY, json_response, read_json
from comfysup.jobs import JobLineError, canonical_id
from comfysup.queue.search import SearchError

MAX_BODY = 64 * 1024
MAX_IDS = 1000
MAX_BULK = 10_000
"""Dead letters one confirmation may retry."""


def _sessions(request: web.Request) -> Sessions:
    return request.app[SESSIONS_KEY]


async def login(request: web.Request) -> web.Response:
    """``{"token", "name"}`` → a session cookie (``name``: who, for the audit lines)."""
    state = request.app[STATE_KEY]
    console_auth.same_origin(request, state.config.api.allowed_origins)
    data = await read_json(request, MAX_BODY, "64 KiB")
    address = request.remote or "?"
    sid, session = _sessions(request).login(body_text(data, "token"), body_text(data, "name", 200), address)
    response = json_response({"who": session.who, "csrf": session.csrf})
    console_auth.set_cookie(response, request, sid, cookie_path(request))
    return response


def cookie_path(request: web.Request) -> str:
    """The console's path as the browser sees it: behind a proxy, ``X-Forwarded-Prefix`` in front of it."""
    prefix = request.headers.get("X-Forwarded-Prefix", "").rstrip("/")
    safe = prefix.startswith("/") and all(ch.isalnum() or ch in "/-._~" for ch in prefix)
    return f"{prefix if safe else ''}/console/"


async def logout(request: web.Request) -> web.Response:
    _sessions(request).logout(request)
    response = json_response({"logged_in": False})
    response.del_cookie(console_auth.COOKIE, path=cookie_path(request))
    return response


async def _act(request: web.Request) -> tuple[Any, console_auth.Session, Any]:
    """The state, the session of an action that passed every check, and its JSON body."""
    state = request.app[STATE_KEY]
    session = _sessions(request).may_act(request, state.config.api.allowed_origins)
    return state, session, await read_json(request, MAX_BODY, "64 KiB")


def _ids(data: Any) -> list[str]:
    ids = data.get("ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS:
        raise ApiError(400, "invalid_request", f"ids: a list of 1 to {MAX_IDS} job ids")
    try:
        return [canonical_id(str(i)) for i in ids]
    except JobLineError as exc:
        raise ApiError(400, "invalid_request", f"ids: {exc}") from None


async def cancel(request: web.Request) -> web.Response:
    state, session, data = await _act(request)
    ids = _ids(data)
    result = await state.call(state.queue.intake.cancel, ids)
    record(session, "cancelled", ids)
    return json_response({"result": result})


async def retry(request: web.Request) -> web.Response:
    """Dead jobs back to the queue, their attempts counted from zero again."""
    state, session, data = await _act(request)
    ids = _ids(data)
    result = await state.call(state.queue.intake.requeue_dead, ids)
    record(session, "retried", ids)
    return json_response({"result": result})


def _dead_search(params: Any) -> Any:
    """The search's dead letters (a bulk retry's search, whatever state it named)."""
    try:
        return console_query.parse({**{k: str(v) for k, v in params.items() if k in ("q",)}, "state": "dead"},
                                   limit=1)
    except SearchError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None


async def count(request: web.Request) -> web.Response:
    """How many dead letters the search ``q`` matches (what a bulk retry asks to confirm)."""
    _sessions(request).may_read(request)
    state = request.app[STATE_KEY]
    n = await state.call(state.queue.search.count, _dead_search(request.query), MAX_BULK)
    return json_response({"count": n, "more": n > MAX_BULK, "max": MAX_BULK})


async def retry_search(request: web.Request) -> web.Response:
    """``{"q", "expected"}``: every dead letter ``q`` matches back to the queue, when they are ``expected``."""
    state, session, data = await _act(request)
    search = _dead_search(data if isinstance(data, dict) else {})
    expected = data.get("expected") if isinstance(data, dict) else None
    if not isinstance(expected, int) or isinstance(expected, bool):
        raise ApiError(400, "invalid_request", "expected: the count that was confirmed (GET api/count)")

    def retry_all() -> tuple[int, dict[str, str] | None]:
        ids = state.queue.search.ids(search, MAX_BULK + 1)
        if len(ids) != expected or len(ids) > MAX_BULK:
            return len(ids), None
        return len(ids), state.queue.intake.requeue_dead(ids)

    found, result = await state.call(retry_all)
    if result is None:
        raise ApiError(409, "count_changed", f"the search matches {found} dead job(s) now, not {expected}: "
                       "confirm again", details={"count": found})
    record(session, "retried by search", list(result), f" (q={str(data.get('q', ''))[:200]!r})")
    return json_response({"retried": sum(1 for v in result.values() if v == "requeued"), "result": result})


def _slot(data: Any) -> tuple[str, str]:
    host, slot = (data.get("host"), data.get("slot")) if isinstance(data, dict) else (None, None)
    if not isinstance(host, str) or not isinstance(slot, str) or not host or not slot or \
            len(host) > 255 or len(slot) > 100:
        raise ApiError(400, "invalid_request", "host and slot: the machine and the slot's name, as the overview shows")
    return host, slot


async def hold(request: web.Request) -> web.Response:
    """``{"host", "slot", "hold"}``: the slot finishes its job and claims no other (hold), or claims again; its
    supervisor reads the order at its next housekeeping pass (comfysup.supervisor.orders)."""
    state, session, data = await _act(request)
    host, slot = _slot(data)
    held = bool(data.get("hold"))
    await state.call(state.queue.orders.hold_slot, host, slot, session.who if held else None)
    console_auth.audit.warning("console: %s %s slot %s of %s", session.who, "held" if held else "put back", slot,
                               host)
    return json_response({"host": host, "slot": slot, "held": held})


async def restart(request: web.Request) -> web.Response:
    """``{"host", "slot"}``: the slot's server restarts once its job is over."""
    state, session, data = await _act(request)
    host, slot = _slot(data)
    await state.call(state.queue.orders.ask_restart, host, slot, session.who)
    console_auth.audit.warning("console: %s asked a restart of slot %s of %s", session.who, slot, host)
    return json_response({"host": host, "slot": slot, "restart": "asked"})


def install(app: web.Application, root: str) -> None:
    app.router.add_post(f"{root}/api/actions/hold", hold)
    app.router.add_post(f"{root}/api/actions/restart", restart)
    app.router.add_post(f"{root}/api/login", login)
    app.router.add_post(f"{root}/api/logout", logout)
    app.router.add_get(f"{root}/api/count", count)
    app.router.add_post(f"{root}/api/actions/cancel", cancel)
    app.router.add_post(f"{root}/api/actions/retry", retry)
    app.router.add_post(f"{root}/api/actions/retry-search", retry_search)
