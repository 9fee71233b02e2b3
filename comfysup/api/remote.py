"""Outputs held by another machine: each API advertises where the others reach it, and streams from there what
its own result store does not hold: outputs are assets too, streamed from the result store or from the
machine that holds them.

Several machines share one PostgreSQL queue; ``[store] dir`` need not be shared, so a job's files are on the disk
of the machine that ran it (``JobRecord.machine``, the host part of its runner's owner). Each API process writes
its URL in the queue (``api_endpoints``, keyed by comfysup.queue.base.host_name()) at start and again every
ADVERTISE_SECONDS, and removes it when it stops. An API asked for an output that is not in its store looks up the
job's machine: while that machine's heartbeat is younger than FRESH_SECONDS, the bytes are streamed from its API
(``GET <url>/api/v2/assets/<id>/content``) with the request's Range and the fleet's token (every machine of a
fleet has the one ``[api] token``), the status (200, 206, 416) and the headers that describe the body passed
back. Never a redirect followed, never the whole file in memory, every wait bounded; a request that was itself
passed on (PROXIED) is never passed on again, so two machines that each think the other holds a file cannot
bounce a request between them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from comfysup.api.errors import ApiError
from comfysup.api.replies import CHUNK, content_headers
from comfysup.queue.base import ApiEndpoint, host_name

log = logging.getLogger("comfysup.api")

ADVERTISE_SECONDS = 10.0
"""How often an API refreshes its row in the queue."""
FRESH_SECONDS = 3 * ADVERTISE_SECONDS
"""A row whose heartbeat is older than this belongs to an API that stopped without removing it (killed)."""
CONNECT_SECONDS = 5.0
READ_SECONDS = 30.0
"""The longest wait for the next bytes of the other machine's answer (its headers included)."""
WITHDRAW_SECONDS = 5.0
PROXIED = "X-Comfysup-Proxied"
PASSED = ("Content-Type", "Content-Range", "Accept-Ranges", "Content-Disposition", "Content-Security-Policy")
"""Headers of the other machine's answer that describe the body (and how a browser may show it), passed back
with its Content-Length."""
SESSION_KEY: web.AppKey[aiohttp.ClientSession] = web.AppKey("remote_session", aiohttp.ClientSession)


def advertised_url(public_url: str, listen: str, bound_port: int, hostname: Callable[[], str]) -> str:
    """Where the other machines reach this API: ``[api] public_url`` as it is written (without a trailing
    ``/``); else ``http://<listen's host>:<bound port>`` when that host is not a loopback address (a wildcard
    such as 0.0.0.0 or :: becomes ``hostname()``, this machine's name); else "" (nothing to advertise: other
    machines cannot reach a loopback API)."""
    if public_url:
        return public_url.rstrip("/")
    host = listen.rpartition(":")[0].strip("[]")
    if not host or host == "localhost":
        return ""
    address = ipaddress.ip_address(host)
    if address.is_loopback:
        return ""
    if address.is_unspecified:
        host = hostname()
    elif address.version == 6:
        host = f"[{host}]"
    return f"http://{host}:{bound_port}"


def fresh(endpoint: ApiEndpoint | None) -> bool:
    return endpoint is not None and endpoint.age_seconds < FRESH_SECONDS


class Advertiser:
    """This API's row in the queue: written at start, refreshed every ``interval`` seconds by its own task
    (through the state's one queue thread), removed at stop."""

    def __init__(self, state: Any, url: str, interval: float | None = None) -> None:
        self.state = state
        self.url = url
        self.interval = ADVERTISE_SECONDS if interval is None else interval
        self.host = host_name()
        self.pid = os.getpid()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """The first row, written before the API is announced ready; then the heartbeat's task."""
        await self._beat(first=True)
        self._task = asyncio.create_task(self._run(), name="comfysup-api-advertise")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._beat()

    async def _beat(self, first: bool = False) -> None:
        try:
            await self.state.call(self.state.queue.endpoints.advertise_api, self.host, self.url, self.pid)
        except Exception as exc:  # the queue does not answer now: the next beat tries again
            log.warning("cannot advertise this API (%s) in the queue%s: %s", self.url,
                        "" if first else "; other machines will stop streaming its outputs if this lasts", exc)

    async def stop(self) -> None:
        """Stop the heartbeat and remove this process's row, so the others stop asking at once."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await asyncio.wait_for(self.state.call(self.state.queue.endpoints.withdraw_api, self.host, self.pid),
                                   WITHDRAW_SECONDS)
        except Exception as exc:  # it ages out after FRESH_SECONDS instead
            log.warning("cannot remove this API's row from the queue (it ages out in %g s): %s", FRESH_SECONDS, exc)


def install(app: web.Application) -> None:
    """One HTTP client per API process, for the other machines' APIs (no proxy from the environment, no
    decompression: the bytes pass through as they come)."""

    async def open_session(app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_SECONDS, sock_read=READ_SECONDS)
        app[SESSION_KEY] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def close_session(app: web.Application) -> None:
        await app[SESSION_KEY].close()

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)


async def stream(request: web.Request, state: Any, machine: str | None) -> web.StreamResponse:
    """The output this machine's store does not hold, streamed from ``machine``'s API; 404 or 502 with what to
    do when that is not possible."""
    asset_id = request.match_info["id"]
    here = host_name()
    if request.headers.get(PROXIED):
        raise ApiError(404, "not_found", f"output {asset_id} is not in the result store of machine {here!r}, "
                       "which another machine's API asked for it; a request passed on once is not passed on again")
    if not machine or machine == here:
        raise ApiError(404, "not_found", f"output {asset_id} is not in this machine's result store (the job ran "
                       f"on {machine or 'an unknown machine'}, this is {here!r}): it was removed from the store")
    endpoint = await state.call(state.queue.endpoints.api_endpoint, machine)
    if endpoint is None or not fresh(endpoint):
        stale = "" if endpoint is None else \
            f" (its last heartbeat at {endpoint.url} is {endpoint.age_seconds:.0f} s old: its API stopped)"
        raise ApiError(404, "not_found", f"output {asset_id} is in the result store of machine {machine!r}, not "
                       f"of this one ({here!r}), and {machine} advertises no API to fetch it from{stale}: run the "
                       f"API on {machine} with [api] public_url set (or a non-loopback [api] listen), or share "
                       "[store] dir between the machines")
    return await _relay(request, state, machine, f"{endpoint.url}/api/v2/assets/{asset_id}/content")


async def _relay(request: web.Request, state: Any, machine: str, url: str) -> web.StreamResponse:
    headers = {PROXIED: "1", "Accept-Encoding": "identity"}
    if "Range" in request.headers:
        headers["Range"] = request.headers["Range"]
    authorization = f"Bearer {state.config.api.token}" if state.config.api.token \
        else request.headers.get("Authorization")
    if authorization:
        headers["Authorization"] = authorization
    response: web.StreamResponse | None = None
    try:
        async with request.app[SESSION_KEY].request(request.method, url, headers=headers,
                                                    allow_redirects=False) as upstream:  # GET, or HEAD: no body
            _check(upstream.status, machine, url)
            response = web.StreamResponse(status=upstream.status)
            for name in PASSED:
                if name in upstream.headers:
                    response.headers[name] = upstream.headers[name]
            for name, value in content_headers(upstream.headers.get("Content-Type", ""), "").items():
                response.headers.setdefault(name, value)  # an older API upstream sent none
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        if response is None:
            raise ApiError(502, "bad_gateway", f"machine {machine!r} holds this output, but its API at {url} does "
                           f"not answer ({reason}); check that comfysup's API runs there and that this machine "
                           f"reaches it ([api] public_url on {machine})") from None
        # Part of the body is sent: the client must see a short body (its Content-Length says so), never more.
        log.warning("streaming %s from machine %s to a client broke off: %s", url, machine, reason)
        if request.transport is not None:
            request.transport.close()
        return response


def _check(status: int, machine: str, url: str) -> None:
    """The other machine's answer is passed back only when it is the file, a part of it, or 416."""
    if status in (200, 206, 416):
        return
    if status in (401, 403):
        raise ApiError(502, "bad_gateway", f"machine {machine!r}'s API at {url} refused this API's token "
                       f"({status}): the machines sharing a queue must share one [api] token")
    if status == 404:
        raise ApiError(404, "not_found", f"machine {machine!r}'s API at {url} does not hold this output either "
                       "(removed from its result store)")
    raise ApiError(502, "bad_gateway", f"machine {machine!r}'s API at {url} answered {status}; its log says why")
