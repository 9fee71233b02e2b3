"""What every route of comfysup.api shares: the app's state key, JSON answers, the request's origin, and bytes
served with Range (an output from the result store, an uploaded asset from the asset store)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from comfysup.api.errors import ApiError, not_found
from comfysup.jobs import canonical_id
from comfysup.jobs.values import JobLineError

CHUNK = 1 << 20
STATE_KEY: web.AppKey[Any] = web.AppKey("state", object)


def origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


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
               read: Callable[[int, int], Awaitable[bytes]]) -> web.StreamResponse:
    """``size`` bytes, or the part the request's Range names (206), streamed CHUNK by CHUNK from ``read(offset,
    n)``; a read that comes back short ends the answer there (the client sees a short body, never other bytes)."""
    span = byte_range(request.headers.get("Range"), size)
    start, end = span if span is not None else (0, size - 1)
    response = web.StreamResponse(status=206 if span is not None else 200)
    response.content_type = content_type
    response.content_length = max(0, end - start + 1)
    response.headers["Accept-Ranges"] = "bytes"
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
        await response.write(chunk)
    await response.write_eof()
    return response
