"""A fuzzer of the Comfy API v2 over raw sockets: random and malformed requests (methods, paths, query numbers,
headers, deep and huge JSON, broken multipart, bytes that are not HTTP) and slow clients, against an API served in
this process. Used by tests/integration/test_api_fuzz.py (a few seconds) and bench/fuzz_api.py (``--seconds N``).

What counts as a failure: an answer 500 or above, no answer at all to a whole request within ANSWER_SECONDS (the
server hung), and, checked by the callers, a traceback in the log or threads and memory that grow with load."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psutil

API = "/api/v2"
ANSWER_SECONDS = 8.0
METHODS = ["GET", "POST", "DELETE", "HEAD", "PUT", "PATCH", "OPTIONS", "TRACE", "FOO", "get", "G\x00T", "CONNECT"]
NASTY = ["", "..", "%2e%2e", "%00", "a" * 3000, "\u00e9", "%ff%fe", "1e99", "-1", str(2**64), "null", "{id}",
         "%2F..%2Fetc%2Fpasswd", "x.999999999999999999999", "00000000-0000-0000-0000-000000000000.-1"]


@dataclass
class Report:
    statuses: Counter[int] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    max_threads: int = 0
    max_rss_growth: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: int, request: bytes, complete: bool) -> None:
        with self.lock:
            self.kinds[kind] += 1
            self.statuses[status] += 1
            if status >= 500 or (status < 0 and complete):
                what = "no answer" if status < 0 else str(status)
                self.failures.append(f"{kind}: {what} to {request[:200]!r}")


class Fuzzer:
    """Makes one random request at a time; ``run`` drives several client threads for some seconds."""

    def __init__(self, url: str, seed: int) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.address = (host, int(port))
        self.host = f"{host}:{port}"
        self.rng = random.Random(seed)
        self.jobs: list[str] = [str(uuid.uuid4())]
        self.assets: list[str] = [str(uuid.uuid4())]
        self.lock = threading.Lock()

    # -- building requests ------------------------------------------------------------------------------------
    def value(self, depth: int = 0) -> Any:
        r = self.rng
        pick = r.random()
        if depth > 6 or pick < 0.4:
            return r.choice([0, -1, 2**63, 2**64, 1e308, -0.0, True, None, "", "x" * r.randint(0, 300), "\u0000",
                             "\ud800" if r.random() < 0.1 else "é", "core/ASSET", "blake3:" + "a" * 64])
        if pick < 0.7:
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        keys = ["workflow", "extra_data", "metadata", "priority", "hash", "file_path", "class_type", "inputs", "1",
                "info", "id", "type", ""]
        return {r.choice(keys): self.value(depth + 1) for _ in range(r.randint(0, 5))}

    def workflow(self) -> Any:
        r = self.rng
        if r.random() < 0.5:
            node = {"class_type": r.choice(["X", "LoadImage", ""]), "inputs": {"a": self.value(3)}}
            if r.random() < 0.3:
                node["inputs"]["image"] = {"type": "core/ASSET", "info": {"id": r.choice(self.assets)}}
            return {"workflow": {"1": node}, "metadata": {"k": "v"}, "priority": r.choice([0, 5, 2**70, "x"])}
        return self.value()

    def json_body(self) -> bytes:
        r = self.rng
        pick = r.random()
        if pick < 0.15:
            depth = r.choice([63, 64, 65, 200, 5000, 100_000])
            return ("[" * depth + "]" * depth).encode() if r.random() < 0.5 else \
                (b'{"workflow": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}")
        if pick < 0.2:
            return b'{"workflow": {"1": {"class_type": "X", "inputs": {"a": "' + b"x" * r.randint(2**20, 3 * 2**20) \
                + b'"}}}}'
        if pick < 0.35:
            return bytes(r.getrandbits(8) for _ in range(r.randint(0, 200)))
        if pick < 0.45:
            return b'{"a": NaN, "b": Infinity, "c": 1e999999}'
        try:
            return json.dumps(self.workflow()).encode()
        except (ValueError, UnicodeEncodeError):
            return b"{}"

    def path(self) -> str:
        r = self.rng
        with self.lock:
            job, asset = r.choice(self.jobs), r.choice(self.assets)
        ident = r.choice([job, asset, f"{job}.0", f"{job}.{2**70}", r.choice(NASTY)])
        path = r.choice([f"{API}/health", f"{API}/jobs", f"{API}/jobs/{ident}", f"{API}/jobs/{ident}/workflow",
                         f"{API}/jobs/{ident}/cancel", f"{API}/jobs/{ident}/events", f"{API}/assets",
                         f"{API}/assets/from-hash", f"{API}/assets/{ident}", f"{API}/assets/{ident}/content",
                         f"{API}/assets/by-hash/blake3:{'0' * 64}", f"{API}/assets/by-hash/{ident}", "/",
                         f"{API}/{r.choice(NASTY)}", "*", "http://evil.example/x"])
        if r.random() < 0.4:
            params = [f"limit={r.choice(['0', '1', '500', '501', '-5', str(2**63), 'x', '9' * 5000])}",
                      f"cursor={r.choice(['', 'MQ', 'OTIyMzM3MjAzNjg1NDc3NTgwOA', '!!', 'LTE', 'A' * 9000])}",
                      f"status={r.choice(['queued', 'nope', ',,,', 'running,failed'])}",
                      f"metadata[{r.choice(['k', '', '[]'])}]={r.choice(['v', '%00', ''])}"]
            path += "?" + "&".join(r.sample(params, r.randint(1, 4)))
        return path

    def headers(self, body_size: int | None) -> list[str]:
        r = self.rng
        host = r.choice([self.host] * 6 + ["localhost", f"evil.example:{self.address[1]}", "", "a" * 300, "[::1",
                                           None])
        out = [] if host is None else [f"Host: {host}"]
        if r.random() < 0.3:
            out.append(f"Origin: {r.choice(['http://evil.example', 'null', 'http://' + self.host, '%%%'])}")
        if r.random() < 0.2:
            out.append(f"Range: {r.choice(['bytes=0-', 'bytes=-1', 'bytes=5-1', 'bytes=0-99999999999999999999', 'x'])}")
        if r.random() < 0.2:
            out.append(f"Idempotency-Key: {r.choice(['k', 'x' * 300, 'é', str(uuid.uuid4())])}")
        if r.random() < 0.1:
            out.append(f"Authorization: {r.choice(['Bearer x', 'Basic', 'Bearer ' + 'y' * 5000])}")
        if r.random() < 0.05:
            out.append("X-Huge: " + "h" * r.choice([100, 9000, 70000]))
        if body_size is not None:
            pick = r.random()
            if pick < 0.8:
                out.append(f"Content-Length: {body_size}")
            elif pick < 0.85:
                out.append(f"Content-Length: {body_size}, {body_size + 1}")
            elif pick < 0.9:
                out.append(f"Content-Length: {r.choice(['-1', 'x', str(2**64)])}")
            elif pick < 0.95:
                out.append(f"Content-Length: {body_size + r.randint(1, 50)}")  # a body that never ends: 408
        out.append(r.choice(["Connection: close"] * 4 + ["Connection: keep-alive"]))
        return out

    def multipart(self) -> tuple[list[str], bytes]:
        r = self.rng
        boundary = r.choice(["b", "x" * 70, "zz", "", "b\r\nX: y"])
        parts = []
        for _ in range(r.choice([0, 1, 3, 5, 70])):
            name = r.choice(["file", "content_type", "file_path", "expected_hash", "tags", "other", ""])
            disposition = f'form-data; name="{name}"' + ('; filename="a.png"' if name == "file" else "")
            extra = r.choice(["", "Content-Type: multipart/mixed; boundary=q\r\n",
                              "Content-Transfer-Encoding: base64\r\n", "X: " + "y" * 9000 + "\r\n"])
            data = r.choice([b"image/png", b"a.png", b"x" * r.randint(0, 5000), bytes(range(256)),
                             f"--{boundary}".encode()])
            parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n{extra}\r\n".encode() + data + b"\r\n")
        tail = r.choice([f"--{boundary}--\r\n".encode(), b"", b"--" + b"q" * 10 + b"--\r\n"])
        body = b"".join(parts) + tail
        ctype = r.choice([f"multipart/form-data; boundary={boundary}", "multipart/form-data", "text/plain",
                          f"multipart/form-data; boundary=\"{boundary}\"; charset=x"])
        return [f"Content-Type: {ctype}"], body

    def request(self) -> tuple[str, bytes, bool]:
        """(kind, bytes, whether they are a whole request that must be answered)."""
        r = self.rng
        pick = r.random()
        if pick < 0.05:
            return "garbage", r.choice([b"GARBAGE\r\n\r\n", bytes(r.getrandbits(8) for _ in range(r.randint(1, 400))),
                                        b"GET / HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
                                        b"GET " + b"/" * 9000 + b" HTTP/1.1\r\n\r\n"]), False
        method = r.choice(METHODS) if r.random() < 0.3 else r.choice(["GET", "POST"])
        body: bytes | None = None
        extra: list[str] = []
        chunked = False
        if pick < 0.35:
            method, body = "POST", self.json_body()
            path = r.choice([f"{API}/jobs", f"{API}/assets/from-hash"])
        elif pick < 0.55:
            method, path = "POST", f"{API}/assets"
            extra, body = self.multipart()
            chunked = r.random() < 0.5
        else:
            path = self.path()
            if method in ("POST", "PUT", "PATCH") and r.random() < 0.5:
                body = self.json_body()
        head = [f"{method} {path} HTTP/1.1", *extra]
        if chunked and body is not None:
            head += [h for h in self.headers(None)] + ["Transfer-Encoding: chunked"]
            step = r.choice([1, 7, 4096])
            data = b"".join(f"{len(body[i:i + step]):x}\r\n".encode() + body[i:i + step] + b"\r\n"
                            for i in range(0, len(body), step)) + r.choice([b"0\r\n\r\n", b"zz\r\n", b""])
        else:
            head += self.headers(None if body is None else len(body))
            data = body or b""
        raw = ("\r\n".join(head) + "\r\n\r\n").encode("utf-8", "surrogateescape") + data
        if r.random() < 0.05:  # a slow client: half the request, then nothing (the header or body timeout ends it)
            return "slow", raw[:r.randint(1, max(1, len(raw) - 1))], False
        kind = "multipart" if path == f"{API}/assets" and method == "POST" else ("json" if pick < 0.35 else "route")
        return kind, raw, True

    # -- sending them --------------------------------------------------------------------------------------------
    def send(self, raw: bytes) -> int:
        """The status of the first answer to ``raw`` on a new connection; 0 when the server closed without one,
        -1 when nothing came within ANSWER_SECONDS."""
        deadline = time.monotonic() + ANSWER_SECONDS
        try:
            with socket.create_connection(self.address, timeout=ANSWER_SECONDS) as sock:
                try:
                    sock.sendall(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server answered early (413, 400) and closed: read what it said
                answer = b""
                while b"\r\n" not in answer:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return -1
                    sock.settimeout(left)
                    try:
                        chunk = sock.recv(65536)
                    except TimeoutError:
                        return -1
                    except ConnectionResetError:
                        chunk = b""
                    if not chunk:
                        break
                    answer += chunk
                if raw.startswith(b"POST") and answer.startswith(b"HTTP/1.1 201"):
                    answer += _rest(sock, deadline)
        except OSError:
            return 0
        line = answer.split(b"\r\n", 1)[0].split()
        status = int(line[1]) if len(line) >= 2 and line[1].isdigit() else 0
        if status == 201:
            self._remember(raw, answer)
        return status

    def _remember(self, raw: bytes, answer: bytes) -> None:
        try:
            ident = json.loads(answer.partition(b"\r\n\r\n")[2])["id"]
        except (ValueError, KeyError, TypeError):
            return
        with self.lock:
            (self.jobs if raw.startswith(b"POST /api/v2/jobs") else self.assets).append(str(ident))

    def run(self, seconds: float, clients: int = 4, report: Report | None = None) -> Report:
        report = report or Report()
        me = psutil.Process()
        base_rss = me.memory_info().rss
        stop = time.monotonic() + seconds
        seeds = [self.rng.getrandbits(32) for _ in range(clients)]

        slow = threading.BoundedSemaphore(16)

        def slow_client(raw: bytes) -> None:
            try:
                report.record("slow", self.send(raw), raw, False)
            finally:
                slow.release()

        def client(seed: int) -> None:
            mine = Fuzzer(f"http://{self.host}", seed)
            mine.jobs, mine.assets, mine.lock = self.jobs, self.assets, self.lock
            while time.monotonic() < stop:
                kind, raw, complete = mine.request()
                if kind == "slow":
                    if slow.acquire(blocking=False):
                        threading.Thread(target=slow_client, args=(raw,), name="fuzz-slow", daemon=True).start()
                    continue
                report.record(kind, mine.send(raw), raw, complete)

        threads = [threading.Thread(target=client, args=(s,), name="fuzz-client", daemon=True) for s in seeds]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            serving = sum(1 for t in threading.enumerate() if not t.name.startswith("fuzz-"))
            report.max_threads = max(report.max_threads, serving)
            report.max_rss_growth = max(report.max_rss_growth, me.memory_info().rss - base_rss)
            for t in threads:
                t.join(0.05)
        return report


def _rest(sock: socket.socket, deadline: float, limit: int = 2**20) -> bytes:
    """What the server sends until it closes, ``deadline`` passes or ``limit`` bytes came."""
    data = b""
    try:
        while len(data) < limit and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data
