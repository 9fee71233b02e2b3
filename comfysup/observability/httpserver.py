"""The status endpoint's HTTP server: the standard library's, with a bounded pool of threads and deadlines.

``http.server.ThreadingHTTPServer`` starts a thread per connection and waits on each for as long as its client
likes: 300 clients that open a socket and send nothing hold 300 threads. Here a connection is served by one of
THREADS threads; at most ``[metrics] max_connections`` are held at once (being served, or waiting for a thread),
and one more is answered 503 and closed by the accepting thread without reading a byte of it. A request's line and
headers must all arrive within ``[metrics] header_timeout_seconds`` of the connection's accept (one deadline, not
a timeout per read: a client that sends a byte every few seconds is closed as well), and each write of an answer
(a large file from /files) may wait at most ``[metrics] body_timeout_seconds`` for the client to take its bytes.
The endpoint answers GET and HEAD with HTTP/1.0 semantics, one request per connection, so it never reads a body.

What a client did wrong (a request line that is not HTTP, a deadline passed) is one log line, never a traceback.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

log = logging.getLogger("comfysup.observability.web")

THREADS = 8
"""Threads that answer requests; a page or a scrape takes milliseconds, a file streams with sendfile."""
REFUSAL = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
           b"X-Content-Type-Options: nosniff\r\nRetry-After: 1\r\nContent-Length: 57\r\n\r\n"
           b"too many connections ([metrics] max_connections); retry\r\n")


class _Deadline(io.RawIOBase):
    """A socket's reads, each bounded by what is left until one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class TimedHandler(BaseHTTPRequestHandler):
    """A request handler whose request must arrive by the server's header deadline; answers carry nosniff."""

    server: PooledHTTPServer

    def setup(self) -> None:
        super().setup()
        accepted = getattr(self.request, "accepted_at", None) or time.monotonic()
        self.rfile = io.BufferedReader(_Deadline(self.connection, accepted + self.server.header_seconds))

    def end_headers(self) -> None:
        self.connection.settimeout(self.server.body_seconds)  # each write of the answer from here on
        self.send_header("X-Content-Type-Options", "nosniff")
        super().end_headers()

    def log_error(self, format: str, *args: Any) -> None:
        """One line: a timeout at debug (a stalled client is routine), a malformed request at info."""
        level = logging.DEBUG if format.startswith("Request timed out") else logging.INFO
        log.log(level, "status endpoint: %s: " + format, self.client_address[0], *args)


class _Accepted(socket.socket):
    """An accepted socket that remembers when (its header deadline counts from then, not from a free thread)."""

    accepted_at = 0.0


class PooledHTTPServer(HTTPServer):
    """HTTPServer with THREADS threads and at most ``max_connections`` connections held (see the module)."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, max_connections: int = 32,
                 header_seconds: float = 10.0, body_seconds: float = 60.0) -> None:
        self.header_seconds = header_seconds
        self.body_seconds = body_seconds
        self.max_connections = max_connections
        self.slots = threading.BoundedSemaphore(max_connections)
        self.pool = ThreadPoolExecutor(min(THREADS, max_connections), thread_name_prefix="comfysup-http")
        self.refused = 0
        self._refused_logged = float("-inf")
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        accepted = _Accepted(sock.family, sock.type, sock.proto, fileno=sock.detach())
        accepted.accepted_at = time.monotonic()
        return accepted, address

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            self.pool.submit(self._work, request, client_address)
        except RuntimeError:  # the pool is shut down: the server is closing
            self.slots.release()
            self.shutdown_request(request)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self.slots.release()

    def _refuse(self, request: socket.socket) -> None:
        self.refused += 1
        try:
            request.setblocking(False)
            request.send(REFUSAL)
        except OSError:
            pass
        self.shutdown_request(request)
        now = time.monotonic()
        if now - self._refused_logged >= 60.0:
            log.warning("status endpoint: %d connections held ([metrics] max_connections); new ones are answered "
                        "503 (%d so far)", self.max_connections, self.refused)
            self._refused_logged = now

    def server_close(self) -> None:
        super().server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)
