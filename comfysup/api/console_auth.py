"""Who may use the console, and how an action proves it comes from the console's own page.

- With ``[api] token`` set, a person logs in with that token (the one the API asks as a bearer): the console
  answers a session cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS, its path the console's),
  kept in this process's memory for SESSION_SECONDS. Everything of the console but its page and its login then
  asks the session, as the API asks the token: nothing of a job is shown to a browser that has neither.
- Without a token the API is loopback only (comfysup.config refuses anything else), the console shows
  everything to whoever reaches it, and does nothing: it is read-only and says so.
- An action (a POST) passes three checks: the session; its ``X-CSRF-Token`` header equal to the session's own
  (a value only the console's script, reading ``session``, knows); and an ``Origin`` (or ``Sec-Fetch-Site:
  same-origin``) that is the console's own or one of ``[api] allowed_origins``. Each action is logged once on the
  ``comfysup.api.console`` logger: who (the name given at login, and the address), what, and which jobs.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from comfysup.api.errors import ApiError
from comfysup.api.security import normal_origin

audit = logging.getLogger("comfysup.api.console")
COOKIE = "comfysup_console"
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 1000
"""Sessions kept; the oldest goes first past this (a login loop cannot grow the process)."""
MAX_NAME_CHARS = 60
AUDIT_IDS = 20
"""Job ids named in one audit line; more are counted."""


@dataclass
class Session:
    who: str
    csrf: str
    expires: float


class Sessions:
    """The console's logins in this process (see the module's docstring)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._by_id: dict[str, Session] = {}

    @property
    def read_only(self) -> bool:
        return not self.token

    def login(self, given: str, name: str, address: str) -> tuple[str, Session]:
        """A new session for the holder of the token; 401 for any other text."""
        if self.read_only:
            raise ApiError(403, "read_only", "no [api] token is set: the console is read-only, and no one logs in")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            audit.warning("console: a login from %s was refused (wrong token)", address)
            raise ApiError(401, "unauthorized", "that is not the API's token ([api] token)")
        who = "".join(ch for ch in name if ch.isprintable())[:MAX_NAME_CHARS].strip() or "operator"
        now = time.time()
        self._by_id = {k: s for k, s in self._by_id.items() if s.expires > now}
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.pop(next(iter(self._by_id)))
        sid = secrets.token_urlsafe(32)
        session = Session(who=f"{who}@{address}", csrf=secrets.token_urlsafe(24), expires=now + SESSION_SECONDS)
        self._by_id[sid] = session
        audit.info("console: %s logged in", session.who)
        return sid, session

    def of(self, request: web.Request) -> Session | None:
        sid = request.cookies.get(COOKIE, "")
        session = self._by_id.get(sid)
        if session is None or session.expires <= time.time():
            return None
        return session

    def logout(self, request: web.Request) -> None:
        self._by_id.pop(request.cookies.get(COOKIE, ""), None)

    def may_read(self, request: web.Request) -> None:
        """401 unless the request may see jobs: any, without a token; a session's, with one."""
        if not self.read_only and self.of(request) is None:
            raise ApiError(401, "login_required", "log in with the API's token to see the console")

    def may_act(self, request: web.Request, allowed: tuple[str, ...]) -> Session:
        """The session of an action that passes every check (see the module's docstring); else 401/403."""
        if self.read_only:
            raise ApiError(403, "read_only", "no [api] token is set: the console is read-only")
        same_origin(request, allowed)
        session = self.of(request)
        if session is None:
            raise ApiError(401, "login_required", "log in with the API's token to act")
        given = request.headers.get("X-CSRF-Token", "")
        if not hmac.compare_digest(given.encode(), session.csrf.encode()):
            raise ApiError(403, "csrf", "the action's CSRF token is missing or stale: reload the page")
        return session


SESSIONS_KEY = web.AppKey("console_sessions", Sessions)


def same_origin(request: web.Request, allowed: tuple[str, ...]) -> None:
    """403 unless the request says it comes from the console's own origin (or an allowed one)."""
    origin = request.headers.get("Origin")
    if not origin:
        if request.headers.get("Sec-Fetch-Site") == "same-origin":
            return
        raise ApiError(403, "forbidden", "an action must come from the console's page (no Origin was sent)")
    if urlsplit(origin).netloc.lower() == (request.host or "").lower():
        return
    if normal_origin(origin) in {normal_origin(a) for a in allowed}:
        return
    raise ApiError(403, "forbidden", f"origin {origin[:100]!r} may not act on this console")


def set_cookie(response: web.StreamResponse, request: web.Request, sid: str, path: str) -> None:
    secure = request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
    response.set_cookie(COOKIE, sid, max_age=int(SESSION_SECONDS), path=path, httponly=True, samesite="Strict",
                        secure=secure)


def record(session: Session, what: str, ids: list[str], extra: str = "") -> None:
    """The action's audit line: who, what, which jobs (the first AUDIT_IDS, and how many in all)."""
    shown = ", ".join(ids[:AUDIT_IDS]) + (f" and {len(ids) - AUDIT_IDS} more" if len(ids) > AUDIT_IDS else "")
    audit.warning("console: %s %s %d job(s)%s: %s", session.who, what, len(ids), extra, shown or "-")


def body_text(data: Any, key: str, limit: int = 4096) -> str:
    value = data.get(key, "") if isinstance(data, dict) else ""
    if not isinstance(value, str) or len(value) > limit:
        raise ApiError(400, "invalid_request", f"{key}: a text of at most {limit} characters")
    return value
