"""The API's connections: how many at once, how long a request may take to arrive, and one log line for a request
that is not HTTP.

aiohttp serves every connection on one event loop, so a stalled client costs a socket and a few KiB, not a thread;
but it would hold both for as long as it likes (a request's headers sent one byte at a time, a half request and
then nothing), and sockets are bounded by the open-file limit. So:

- ``Gate`` wraps aiohttp's protocol factory (``web.Server`` is one) in ``Counted``, which sees each connection open
  and close: past ``[api] max_connections`` a new one is answered ``503`` and closed at once, before any byte of it
  is read; and a connection with no request in progress for ``[api] header_timeout_seconds`` (a request line and
  headers that did not all arrive in that time, or an idle kept-alive connection) is closed by a sweep every
  second. ``track`` (the outermost middleware) marks a request in progress until its answer is written; a
  written answer that a client does not take within ``[api] body_timeout_seconds`` closes the connection.
- The body of a request is read with a timeout on each wait (comfysup.api.replies.read_body, the upload's
  multipart reader in comfysup.api.assets): a stalled upload ends with ``408`` and the connection is closed.
- ``OneLineLog`` is aiohttp's server logger: a request that aiohttp cannot parse (``GARBAGE``, a header line too
  long, a bad chunk size) is one line naming the client and what was wrong, never a traceback; aiohttp answers it
  ``400`` and closes the connection. Any other error is logged as aiohttp logs it, traceback included: a bug.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from comfysup.redact import bound

log = logging.getLogger("comfysup.api")

SWEEP_SECONDS = 1.0
REFUSED_LOG_SECONDS = 60.0
"""At most one log line this often about connections refused past the bound (a flood is counted, not logged)."""
_BUSY = json.dumps({"error": {"code": "too_many_connections", "message": "the API holds as many connections as "
                              "[api] max_connections allows; retry later"}}).encode()
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff"
           b"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " + str(len(_BUSY)).encode() + b"\r\n\r\n"
           + _BUSY)


class Counted(asyncio.Protocol):
    """One connection: aiohttp's own protocol inside, and what the gate needs to know about it."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.requests = 0
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.gate.admit(self):
            transport.write(REFUSAL)
            transport.close()
            return
        self.idle_since = time.monotonic()
        self.inner = self.gate.server()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.open.discard(self)
        self.transport = None
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class Gate:
    """The bound on connections and the header timeout, for one ``web.Server`` (see the module's docstring)."""

    def __init__(self, server: Callable[[], asyncio.Protocol], max_connections: int, header_seconds: float) -> None:
        self.server = server
        self.max_connections = max_connections
        self.header_seconds = header_seconds
        self.open: set[Counted] = set()
        self.refused = 0
        self.timed_out = 0
        self._refused_logged = float("-inf")
        self._refused_since_log = 0

    def factory(self) -> Counted:
        return Counted(self)

    def admit(self, conn: Counted) -> bool:
        if len(self.open) < self.max_connections:
            self.open.add(conn)
            return True
        self.refused += 1
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_SECONDS:
            log.warning("the API holds %d connections ([api] max_connections): %d new one(s) answered 503 since "
                        "the last such line", len(self.open), self._refused_since_log)
            self._refused_logged, self._refused_since_log = now, 0
        return False

    def sweep_once(self, now: float | None = None) -> int:
        """Close every connection without a request in progress for longer than the header timeout."""
        now = time.monotonic() if now is None else now
        closed = 0
        for conn in list(self.open):
            if conn.requests == 0 and now - conn.idle_since > self.header_seconds and conn.transport is not None:
                conn.transport.close()
                closed += 1
        self.timed_out += closed
        return closed

    async def sweep(self) -> None:
        """``sweep_once`` every second (or more often for a short timeout) until cancelled."""
        interval = min(SWEEP_SECONDS, self.header_seconds / 4)
        while True:
            await asyncio.sleep(interval)
            if closed := self.sweep_once():
                log.debug("closed %d connection(s) that sent no whole request in %g s ([api] "
                          "header_timeout_seconds)", closed, self.header_seconds)


def track(body_seconds: float) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The outermost middleware: a request is in progress (the gate's sweep leaves its connection alone) until its
    answer is written; an answer the client takes no bytes of for ``body_seconds`` closes the connection."""

    @web.middleware
    async def tracked(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        transport = request.transport
        conn = transport.get_protocol() if transport is not None else None
        if not isinstance(conn, Counted):
            conn = None
        if conn is not None:
            conn.requests += 1
        try:
            response = await handler(request)
            if not response.prepared:  # written here, so that a stalled reader is bounded too
                try:
                    async with asyncio.timeout(body_seconds):
                        await response.prepare(request)
                        await response.write_eof()
                except TimeoutError:
                    log.info("a client took no bytes of its answer for %g s ([api] body_timeout_seconds): "
                             "connection closed", body_seconds)
                    if request.transport is not None:
                        request.transport.close()
            return response
        finally:
            if conn is not None:
                conn.requests -= 1
                conn.idle_since = time.monotonic()

    return tracked


class OneLineLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger (``AppRunner(logger=...)``): see the module's docstring."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("comfysup.api"), {})

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if exc is True:
            exc = sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError) and not _through_comfysup(exc):
            remote = args[0] if args and "%s" in str(msg) else "a client"
            what = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}"
                           for ch in " ".join(str(exc.message or type(exc).__name__).split()))
            self.logger.info("refused a request that is not valid HTTP from %s (%d): %s", remote, exc.code,
                             bound(what, 200))
            return
        super().log(level, msg, *args, **kwargs)

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=exc_info, **kwargs)


def _through_comfysup(exc: BaseException) -> bool:
    """Whether ``exc`` was raised through comfysup's code (a handler: a bug, whatever its class) rather than by
    aiohttp's parser of the request."""
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("comfysup."):
            return True
        tb = tb.tb_next
    return False
