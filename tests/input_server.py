"""Servers that input URLs point at in tests: files, redirects, a trickle, and one that never answers.

Each listens on 127.0.0.1 on a port the OS picks, so a test fetches from it with ``[inputs] allow_private``
set (or with the address check told that this one address stands for a public host).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FileServer:
    """``files``: path → bytes (200 with Content-Length); ``redirects``: path → Location (302); ``unsized``:
    path → bytes sent without a Content-Length; ``raw``: path → a whole answer (status line, headers, body) sent as
    it is, a hostile server's; ``held``: path → bytes sent once ``go`` is set (``asked`` is set when one is asked
    for); ``/trickle`` sends one byte of 1000 every 50 ms; anything else is 404. ``got`` keeps
    every request's path."""

    files: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    unsized: dict[str, bytes] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)
    held: dict[str, bytes] = field(default_factory=dict)
    asked: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    got: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def start(self) -> FileServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.got.append(self.path)
                if self.path in owner.redirects:
                    self.send_response(302)
                    self.send_header("Location", owner.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path in owner.files or self.path in owner.held:
                    if self.path in owner.held:
                        owner.asked.set()
                        owner.go.wait(30)
                    body = owner.files.get(self.path) or owner.held[self.path]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path in owner.raw:
                    self.wfile.write(owner.raw[self.path])
                    self.close_connection = True
                elif self.path in owner.unsized:
                    self.send_response(200)
                    self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                    self.wfile.write(owner.unsized[self.path])
                elif self.path == "/trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    for _ in range(1000):
                        if owner.stopping.wait(0.05):
                            return
                        try:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                        except OSError:
                            return  # the client gave up
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@contextmanager
def file_server(**kwargs: Any) -> Iterator[FileServer]:
    server = FileServer(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog does) and never answers a byte."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def elapsed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and how long it took, in seconds."""
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start
