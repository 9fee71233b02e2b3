"""What the model manifest's tests share: model files served over HTTP on loopback, counted byte by byte, and a
config whose [[models]] name them.

``FileServer`` answers GET with ``Range`` as a CDN does (206 and Content-Range), counts the body bytes it sends
per file (what "fetched only once" is checked against), and can break a download off: ``cut_after`` closes the
connection after N bytes of the first answer, ``hold_after`` sends N bytes and then waits for the test.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import tomli_w

MODEL = "tiny-sd.safetensors"


def content(n: int, seed: int = 1) -> bytes:
    """``n`` bytes that differ from seed to seed (and within the file: a wrong offset changes the hash)."""
    block = hashlib.sha256(f"model-{seed}".encode()).digest()
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(block + counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:n])


@dataclass
class FileServer:
    files: dict[str, bytes]
    sent: Counter[str] = field(default_factory=Counter)
    """Body bytes sent per path."""
    ranges: list[str] = field(default_factory=list)
    """The Range header of each request ("" without one)."""
    cut_after: dict[str, int] = field(default_factory=dict)
    hold_after: dict[str, int] = field(default_factory=dict)
    held: threading.Event = field(default_factory=threading.Event)
    """Set once a held answer has sent its N bytes."""
    release: threading.Event = field(default_factory=threading.Event)
    redirects: dict[str, str] = field(default_factory=dict)
    token: str = ""
    """When set, a GET without ``Authorization: Bearer <token>`` is answered 401."""
    proxied: int = 0
    """Requests that came as to a proxy (``GET http://host/path``)."""
    """Path → where a GET of it is sent (302)."""
    url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        files = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("http://"):  # asked as a proxy: the absolute form names the file
                    files.proxied += 1
                    self.path = "/" + self.path.split("/", 3)[3]
                self.path = self.path.partition("?")[0]  # a presigned URL's query: not part of the file's name
                body = files.files.get(self.path)
                files.ranges.append(self.headers.get("Range", ""))
                if files.token and self.headers.get("Authorization") != f"Bearer {files.token}":
                    body, self.path = None, "/401"
                if self.path in files.redirects or body is None:
                    self.send_response(302 if self.path in files.redirects else 401 if self.path == "/401" else 404)
                    if self.path in files.redirects:
                        self.send_header("Location", files.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
                found = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if found and self.headers.get("If-Range", etag) != etag:  # changed since: the whole file
                    found = None
                if found and int(found.group(1)) >= len(body):  # nothing left to send: 416, the size said
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if found:
                    start = int(found.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.send_header("ETag", etag)
                self.end_headers()
                rest = body[start:]
                cut = files.cut_after.pop(self.path, None)
                hold = files.hold_after.pop(self.path, None)
                if cut is not None:
                    self._send(rest[:cut])
                    self.close_connection = True
                    return
                if hold is not None:
                    self._send(rest[:hold])
                    files.held.set()
                    files.release.wait(30)
                    self.close_connection = True
                    return
                self._send(rest)

            def _send(self, data: bytes) -> None:
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:
                    return
                files.sent[self.path] += len(data)

        return Handler

    @contextmanager
    def serving(self) -> Iterator[FileServer]:
        server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            yield self
        finally:
            self.release.set()
            server.shutdown()
            server.server_close()
            thread.join(10)


def entry(url: str, data: bytes, name: str = MODEL, folder: str = "checkpoints") -> dict[str, str]:
    return {"folder": folder, "name": name, "url": url, "sha256": hashlib.sha256(data).hexdigest()}


def write_config(directory: Path, models: list[dict[str, str]], cache: Path | None = None,
                 **sections: dict[str, Any]) -> Path:
    """A config.toml in ``directory`` (its own state folder: ``var/``) naming ``models`` and, when given, a shared
    cache folder."""
    directory.mkdir(parents=True, exist_ok=True)
    comfyui = {"gpus": "cpu:1", **({"models_cache": str(cache)} if cache else {}), **sections.pop("comfyui", {})}
    doc = {"queue": {"path": "var/queue.db"}, "comfyui": comfyui, **sections, "models": models}
    path = directory / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path
