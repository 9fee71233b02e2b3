"""What every route of comfysup.api shares: the app's state key, JSON answers, the request's origin, request bodies
read with bounds (size, nesting, a timeout on each wait), and bytes served with Range (an output from the result
store, an uploaded asset from the asset store).

Served content is never rendered as a page of the API's origin: every answer carries ``X-Content-Type-Options:
nosniff`` (``harden``, on every response of the app), and content whose type a browser would render or run (HTML,
SVG, XML, JavaScript, and anything else not in INLINE_TYPES) is sent as ``Content-Disposition: attachment`` with
``Content-Security-Policy: sandbox``, so an uploaded ``text/html`` cannot script the API's origin.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from aiohttp import web

from comfysup.api.errors import ApiError, not_found
from comfysup.jobs import canonical_id
from comfysup.jobs.values import MAX_DEPTH, JobLineError, check_depth

CHUNK = 1 << 20
STATE_KEY: web.AppKey[Any] = web.AppKey("state", object)
T = TypeVar("T")
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif", "image/avif", "audio/mpeg",
                          "audio/flac", "audio/wav", "audio/ogg", "video/mp4", "video/webm", "text/plain",
                          "application/json", "application/octet-stream"})
"""Types a browser shows in place without running anything; any other is served as an attachment."""
CONTENT_CSP = "sandbox; default-src 'none'"


async def harden(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer of the API says its Content-Type is not to be sniffed."""
    response.headers["X-Content-Type-Options"] = "nosniff"


def content_headers(content_type: str, name: str) -> dict[str, str]:
    """The headers of served content (an output, an upload): an attachment unless its type is in INLINE_TYPES."""
    headers = {"Content-Security-Policy": CONTENT_CSP}
    if content_type.split(";")[0].strip().lower() not in INLINE_TYPES:
        base = name.replace("\\", "/").rsplit("/", 1)[-1]
        headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(base, safe='')}" if base \
            else "attachment"
    return headers


def _timeout(request: web.Request) -> float:
    return float(request.app[STATE_KEY].config.api.body_timeout_seconds)


async def timed(request: web.Request, wait: Awaitable[T]) -> T:
    """A wait for the client (the next bytes of its body): 408 ``request_timeout`` and the connection closed
    when nothing comes for ``[api] body_timeout_seconds``."""
    seconds = _timeout(request)
    try:
        async with asyncio.timeout(seconds):
            return await wait
    except TimeoutError:
        raise ApiError(408, "request_timeout", f"no bytes of the request's body came for {seconds:g} s ([api] "
                       "body_timeout_seconds); send it again", close=True) from None


def too_large(limit: int, what: str) -> ApiError:
    return ApiError(413, "payload_too_large", f"the body is larger than {what}", close=True)


async def read_body(request: web.Request, limit: int, what: str) -> bytes:
    """The whole body, at most ``limit`` bytes (413 past it, chunked or not; ``what`` names the limit)."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit, what)
    data = bytearray()
    while chunk := await timed(request, request.content.readany()):
        data += chunk
        if len(data) > limit:
            raise too_large(limit, what)
    return bytes(data)


async def read_json(request: web.Request, limit: int, what: str) -> Any:
    """The body as JSON: 400 ``invalid_request`` when it is not JSON or nests deeper than MAX_DEPTH."""
    raw = await read_body(request, limit, what)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "invalid_request", f"the body is nested more than {MAX_DEPTH} levels deep (arrays or "
                       "objects inside each other); flatten it") from None
    except ValueError:
        raise ApiError(400, "invalid_request", "the body is not valid JSON") from None
    try:
        check_depth(body, "the body", raw)
    except JobLineError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return body


def origin(request: web.Request) -> str:
    """The API's own address, what every absolute URL of an answer starts with (an output's ``url``, a job's
    ``urls``): ``[api] public_url`` when the request came by its name (a TLS proxy in front: its scheme); else the
    ``Host`` the request came with, which the guard has checked is a name of this API (comfysup.api.security: its
    address, loopback names on loopback, public_url's, ``[api] allowed_hosts``), so a client gets links to the
    address it reached (comfy-sdk sends its token only to links of its own ``base_url``'s origin); else (no Host,
    HTTP/1.0) public_url or the address the connection was accepted on. ``X-Forwarded-*`` and ``Forwarded`` are
    never read: a client cannot point the links at another origin."""
    public = request.app[STATE_KEY].config.api.public_url.rstrip("/")
    host = request.headers.get("Host", "")
    if public and (not host or urlsplit(public).netloc.lower() == host.lower()):
        return public
    if host:
        return f"http://{host}"
    if public:
        return public
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    address, port = (sockname[0], sockname[1]) if isinstance(sockname, tuple) else ("127.0.0.1", 0)
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def job_id(request: web.Request) -> str:
    """The ``{id}`` of a job route, canonical; anything that is not a job id is 404 ``not_found``."""
    try:
        return canonical_id(request.match_info["id"])
    except JobLineError:
        raise not_found("job") from None


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=headers)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=a-b``, ``bytes=a-``, ``bytes=-n`` as (first, last); None: the whole file; 416 when unsatisfiable."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None  # a multi-range or another unit: the whole file (allowed by RFC 9110)
    first, _, last = spec.strip().partition("-")
    try:
        if not first:
            n = int(last)
            start, end = max(0, size - n), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
    except ValueError:
        return None
    end = min(end, size - 1)
    if start < 0 or start > end:
        raise ApiError(416, "range_not_satisfiable", f"the file has {size} bytes",
                       headers={"Content-Range": f"bytes */{size}"})
    return start, end


async def send(request: web.Request, size: int, content_type: str,
               read: Callable[[int, int], Awaitable[bytes]], name: str = "") -> web.StreamResponse:
    """``size`` bytes, or the part the request's Range names (206), streamed CHUNK by CHUNK from ``read(offset,
    n)``; a read that comes back short ends the answer there (the client sees a short body, never other bytes).
    ``name``: the file's name, for an attachment's ``filename``. A client that takes no bytes for ``[api]
    body_timeout_seconds`` is dropped."""
    span = byte_range(request.headers.get("Range"), size)
    start, end = span if span is not None else (0, size - 1)
    response = web.StreamResponse(status=206 if span is not None else 200)
    response.content_type = content_type
    response.content_length = max(0, end - start + 1)
    response.headers["Accept-Ranges"] = "bytes"
    response.headers.update(content_headers(content_type, name))
    if span is not None:
        response.headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    await response.prepare(request)
    # HEAD: the headers alone. aiohttp drops a Response's body for HEAD but writes whatever a StreamResponse is
    # given, and bytes after a HEAD answer are read as the next answer on a kept-alive connection.
    at, left = start, 0 if request.method == "HEAD" else end - start + 1
    while left > 0:
        chunk = await read(at, min(CHUNK, left))
        if not chunk:
            break
        at += len(chunk)
        left -= len(chunk)
        try:
            async with asyncio.timeout(_timeout(request)):
                await response.write(chunk)
        except TimeoutError:
            if request.transport is not None:
                request.transport.close()
            return response
    await response.write_eof()
    return response
