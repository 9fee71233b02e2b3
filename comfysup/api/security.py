"""Who may call the API: a bearer token when one is configured, and no cross-site browser request.

As the contract's self-hosted defaults or stricter (comfy-api-proxy ``spec/openapi.yaml@37fbee21``, ``bearerAuth``:
"Self-hosted accepts unauthenticated requests by default and can be configured with a static bearer token"); stricter
in that an unauthenticated API is loopback only: comfysup.config refuses a non-loopback ``[api] listen`` without
``[api] token`` before anything starts. The token is compared in constant time (``hmac.compare_digest`` over
bytes) and is never logged: a refused request logs only that it was refused.

The origin check: a browser adds ``Origin`` to cross-site requests (and ``Sec-Fetch-Site``); a web page the
user visits could otherwise POST jobs to ``127.0.0.1:9189`` (a "simple" request needs no CORS preflight, and
loopback is reachable from the browser). A request whose Origin is neither the API's own address nor one of
``[api] allowed_origins`` is refused with 403 ``forbidden``; requests without an Origin (the SDK, curl) pass.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from comfysup.api.errors import ApiError


def check_token(expected: str, header: str | None) -> None:
    """Raise 401 unless ``header`` is ``Bearer <expected>``; nothing to check when no token is configured."""
    if not expected:
        return
    given = ""
    if header and header[:7].lower() == "bearer ":
        given = header[7:].strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "unauthorized", "missing or invalid bearer token",
                       headers={"WWW-Authenticate": "Bearer"})


def check_origin(origin: str | None, fetch_site: str | None, host: str | None, allowed: tuple[str, ...]) -> None:
    """Raise 403 for a browser request from another site (see the module's docstring)."""
    if fetch_site == "cross-site" and not origin:
        raise ApiError(403, "forbidden", "cross-site browser requests are refused")
    if not origin:
        return
    if origin == "null":
        raise ApiError(403, "forbidden", "requests from an opaque origin are refused")
    if origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return
    if host and urlsplit(origin).netloc.lower() == host.lower():
        return
    raise ApiError(403, "forbidden", "this origin may not call the API; add it to [api] allowed_origins")
