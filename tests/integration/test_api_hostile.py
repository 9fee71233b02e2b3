"""The Comfy API v2 against a hostile client, through real HTTP and raw sockets: a DNS-rebinding page,
bodies nested or sized to break it, numbers past 64 bits, a chunked multipart body that never ends, clients that
stall, more connections than it holds, bytes that are not HTTP, and uploaded HTML served back."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from comfy_low.models import ErrorEnvelope

from tests.api_support import (
    StandInRunner,
    address,
    api_config,
    closed_within,
    exchange,
    read_all,
    running_api,
    status_of,
    trickled_until_closed,
)

API = "/api/v2"


def envelope(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text
    return ErrorEnvelope.model_validate(answer.json()).error.code


@pytest.fixture
def hostile(tmp_path: Path) -> Any:
    """The API with short timeouts, a 1 MiB body limit and room for few connections."""
    config = api_config(tmp_path, max_upload_mb=1, header_timeout_seconds=1.0, body_timeout_seconds=1.0,
                        max_event_streams=1, max_connections=40, allowed_hosts=["api.example", "gpu7.example:8443"],
                        public_url="https://front.example")
    with running_api(config) as url:
        yield url, config


@pytest.mark.timeout(60)
def test_a_dns_rebinding_request_is_refused_whatever_its_origin(hostile: Any) -> None:
    url, _config = hostile
    port = address(url)[1]
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    for answer in (httpx.get(f"{url}{API}/jobs", headers=evil),
                   httpx.post(f"{url}{API}/jobs", headers=evil, json={"workflow": {}}),
                   httpx.get(f"{url}{API}/health", headers={"Host": "evil.example"})):
        assert envelope(answer, 421) == "misdirected_request"
        assert "allowed_hosts" in answer.json()["error"]["message"]
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
    # The API's own names: loopback names on the loopback listen, public_url's, allowed_hosts' (with its port).
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost", "front.example",
                 "api.example:1234", "gpu7.example:8443"):
        answer = httpx.get(f"{url}{API}/health", headers={"Host": host, "Origin": f"http://{host}"})
        assert answer.status_code == 200, (host, answer.text)
    assert envelope(httpx.get(f"{url}{API}/health", headers={"Host": "gpu7.example:8444"}), 421) == \
        "misdirected_request"
    assert status_of(exchange(url, b"GET /api/v2/health HTTP/1.0\r\n\r\n")) == 200  # no Host at all: not a browser


@pytest.mark.timeout(60)
def test_deep_json_bodies_are_refused_400_not_500(hostile: Any) -> None:
    url, _config = hostile
    for depth in (65, 5000, 100_000):
        nested = "[" * depth + "]" * depth
        jobs = httpx.post(f"{url}{API}/jobs", content=f'{{"workflow": {{"1": {nested}}}}}')
        assert envelope(jobs, 400) == "invalid_request" and "nested" in jobs.json()["error"]["message"]
        if len(nested) < 64 * 1024:
            from_hash = httpx.post(f"{url}{API}/assets/from-hash", content=f'{{"hash": {nested}}}')
            assert envelope(from_hash, 400) == "invalid_request", from_hash.text
    assert envelope(httpx.post(f"{url}{API}/assets/from-hash", content="[" * 70_000), 413) == "payload_too_large"


@pytest.mark.timeout(60)
def test_numbers_in_query_parameters_past_64_bits_or_negative_are_400(hostile: Any) -> None:
    import base64

    url, _config = hostile

    def cursor(n: int | str) -> str:
        return base64.urlsafe_b64encode(str(n).encode()).decode().rstrip("=")

    for params in ({"cursor": cursor(2**63)}, {"cursor": cursor(2**64 + 5)}, {"cursor": cursor(-1)},
                   {"cursor": cursor("9" * 5000)}, {"limit": str(2**63)}, {"limit": "-1"}, {"limit": "9" * 5000}):
        answer = httpx.get(f"{url}{API}/jobs", params=params)
        assert envelope(answer, 400) == "invalid_request", params
    assert httpx.get(f"{url}{API}/jobs", params={"cursor": cursor(2**63 - 1)}).status_code == 200


def multipart_head(url: str, boundary: str) -> bytes:
    return (f"POST {API}/assets HTTP/1.1\r\nHost: {address(url)[0]}\r\nTransfer-Encoding: chunked\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def stream_until_refused(url: str, head: bytes, pieces: Any, limit: int) -> tuple[int, int, bytes]:
    """Send ``head`` then chunks from ``pieces`` until the server answers or ``limit`` bytes went; (bytes sent,
    status, answer)."""
    sent = 0
    with socket.create_connection(address(url), timeout=20) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        answer = b""
        for piece in pieces:
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
            if answer or sent > limit:
                break
            try:
                sock.setblocking(True)
                sock.settimeout(5)
                sock.sendall(chunk(piece))
                sock.setblocking(False)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            sent += len(piece)
        sock.setblocking(True)
        sock.settimeout(10)
        answer += read_all(sock)
    return sent, status_of(answer), answer


@pytest.mark.timeout(90)
def test_a_chunked_multipart_body_stops_at_max_upload_mb(hostile: Any) -> None:
    """Many small fields stop at the parts bound; a body whose bytes are not the file's (a preamble before the
    first boundary, here) stops at [api] max_upload_mb (1 MiB) too: never 64 MiB read, never buffered."""
    url, _config = hostile
    boundary = "b0undary"
    field = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"tags\"\r\n\r\n" + "t" * 1000 + "\r\n").encode()
    sent, status, answer = stream_until_refused(url, multipart_head(url, boundary), iter(lambda: field, None),
                                                64 * 2**20)
    assert status == 400 and b"parts" in answer, answer[:300]
    assert sent < 16 * 2**20
    line = b"x" * 1000 + b"\r\n"
    sent, status, answer = stream_until_refused(url, multipart_head(url, boundary), iter(lambda: line * 64, None),
                                                64 * 2**20)
    assert status == 413 and b"payload_too_large" in answer and b"max_upload_mb" in answer, answer[:300]
    assert sent < 16 * 2**20


@pytest.mark.timeout(60)
def test_stalled_clients_are_closed(hostile: Any) -> None:
    url, _config = hostile
    # Half a request line and headers, then nothing: closed after header_timeout_seconds (1 s).
    with socket.create_connection(address(url), timeout=10) as sock:
        sock.sendall(b"GET /api/v2/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert closed_within(sock, 6)
    # One byte at a time, each before any per-read timeout could pass: still closed, the deadline is the whole head.
    with socket.create_connection(address(url), timeout=10) as sock:
        started = time.monotonic()
        closed = trickled_until_closed(sock, b"GET /api/v2/health HTTP/1.1\r\nX-Slow: " + b"a" * 200)
        assert closed and time.monotonic() - started < 6
    # A body that stops coming: 408 request_timeout after body_timeout_seconds, and the connection closed.
    with socket.create_connection(address(url), timeout=10) as sock:
        sock.sendall(f"POST {API}/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{\"workflow\": ".encode())
        answer = read_all(sock)
    assert status_of(answer) == 408 and b"request_timeout" in answer
    # An upload whose multipart body stops coming: the same.
    with socket.create_connection(address(url), timeout=10) as sock:
        sock.sendall(multipart_head(url, "zz") + chunk(b"--zz\r\nContent-Disposition: form-data; name=\"file\"; "
                                                       b"filename=\"a.png\"\r\n\r\nPNG"))
        answer = read_all(sock)
    assert status_of(answer) == 408 and b"request_timeout" in answer


@pytest.mark.timeout(60)
def test_stalled_sockets_cost_no_thread_and_are_all_closed(tmp_path: Path) -> None:
    """300 sockets that open and send nothing: no thread each, and every one closed after the header timeout."""
    config = api_config(tmp_path, header_timeout_seconds=1.0)
    with running_api(config) as url:
        before = threading.active_count()
        socks = [socket.create_connection(address(url), timeout=10) for _ in range(300)]
        try:
            assert threading.active_count() <= before + 2
            deadline = time.monotonic() + 10
            assert all(closed_within(s, max(0.1, deadline - time.monotonic())) for s in socks)
        finally:
            for s in socks:
                s.close()
        assert httpx.get(f"{url}{API}/health").status_code == 200


@pytest.mark.timeout(60)
def test_connections_past_max_connections_are_answered_503_at_once(tmp_path: Path) -> None:
    config = api_config(tmp_path, max_event_streams=1, max_connections=3, header_timeout_seconds=30.0)
    with running_api(config) as url:
        held = []
        for _ in range(3):  # kept-alive after one whole request each: held by the API
            sock = socket.create_connection(address(url), timeout=10)
            sock.sendall(b"GET /api/v2/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert b"HTTP/1.1 200" in sock.recv(65536)
            held.append(sock)
        try:
            started = time.monotonic()
            answer = exchange(url, b"GET /api/v2/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert status_of(answer) == 503 and time.monotonic() - started < 5
            body = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert body["error"]["code"] == "too_many_connections"
        finally:
            held.pop().close()
        deadline = time.monotonic() + 10
        while status_of(answer) != 200 and time.monotonic() < deadline:  # the API sees the close on its loop
            answer = exchange(url, b"GET /api/v2/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert status_of(answer) == 200
        for sock in held:
            sock.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("garbage", [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
                                     b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
                                     b"POST /api/v2/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"zz\r\n"])
def test_a_malformed_request_is_one_log_line_and_no_traceback(hostile: Any, garbage: bytes,
                                                              caplog: pytest.LogCaptureFixture,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    url, _config = hostile
    caplog.set_level(logging.DEBUG)
    assert status_of(exchange(url, garbage)) == 400
    assert httpx.get(f"{url}{API}/health").status_code == 200  # the API serves on
    lines = [r for r in caplog.records if "not valid HTTP" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "127.0.0.1" in lines[0].getMessage()
    assert "\n" not in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.timeout(60)
def test_uploaded_and_output_content_is_never_rendered_on_the_api_origin(tmp_path: Path) -> None:
    config = api_config(tmp_path)
    with running_api(config) as url:
        page = b"<html><script>fetch('/api/v2/jobs')</script></html>"
        rendered = {"page.html": "text/html", "icon.svg": "image/svg+xml", "feed.xml": "application/xml",
                    "app.js": "text/javascript", "doc.xhtml": "application/xhtml+xml", "odd.bin": "TEXT/HTML; x=1"}
        for name, kind in rendered.items():
            data = page + name.encode()
            asset = httpx.post(f"{url}{API}/assets", data={"content_type": kind, "file_path": name},
                               files={"file": (name, data, kind)})
            assert asset.status_code == 201, asset.text
            content = httpx.get(f"{url}{API}/assets/{asset.json()['id']}/content")
            assert content.status_code == 200 and content.content == data
            assert content.headers["X-Content-Type-Options"] == "nosniff"
            assert content.headers["Content-Disposition"].startswith("attachment"), name
            assert "sandbox" in content.headers["Content-Security-Policy"]
        image = httpx.post(f"{url}{API}/assets", data={"content_type": "image/png", "file_path": "cat.png"},
                           files={"file": ("cat.png", b"\x89PNG", "image/png")})
        shown = httpx.get(f"{url}{API}/assets/{image.json()['id']}/content")
        assert "Content-Disposition" not in shown.headers and shown.headers["X-Content-Type-Options"] == "nosniff"
        # A job's output named .svg (a workflow's SaveSVG, or a hostile one): an attachment too.
        submitted = httpx.post(f"{url}{API}/jobs", json={"workflow": {"1": {"class_type": "X", "inputs": {}}}})
        assert submitted.status_code == 201, submitted.text
        runner = StandInRunner(config)
        try:
            claim = runner.claim()
            runner.complete(claim, data=b"<svg onload='alert(1)'/>", name="out.svg")
        finally:
            runner.close()
        output = httpx.get(f"{url}{API}/assets/{submitted.json()['id']}.0/content")
        assert output.status_code == 200 and output.headers["Content-Disposition"].startswith("attachment")
        assert output.headers["X-Content-Type-Options"] == "nosniff"
        # Every answer says nosniff: JSON, errors, the missing route.
        for answer in (httpx.get(f"{url}{API}/health"), httpx.get(f"{url}{API}/nowhere"),
                       httpx.get(f"{url}{API}/jobs/not-an-id"), submitted):
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
