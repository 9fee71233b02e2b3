"""ComfyClient's one kept-alive connection (comfysup.comfy.transport, on http.client), against a tiny socket
server of the test's own that answers each request as the test scripts it: a connection the server closed while
idle is replaced before the next request is written, one whose answer said ``Connection: close`` or was HTTP/1.0
or was not read to its end is never reused, a body is never read past its bound, a cut answer and a server that
never answers are sorted as before, and nothing is ever sent twice. Loopback, OS-assigned ports."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from comfysup.comfy import ComfyClient, MalformedAnswer, ServerUnavailable

QUEUE = b'{"queue_running": [], "queue_pending": []}'


@dataclass
class Request:
    connection: int
    line: str
    headers: dict[str, str]
    body: bytes


Action = Callable[[socket.socket, Request], bool]
"""Answers one request on its socket; returns whether to read the next request on that connection."""


@dataclass
class TinyServer:
    """Accepts every connection; the n-th request (over all connections) is answered by ``actions[n]`` (the last
    one for every request past the list)."""

    actions: list[Action]
    requests: list[Request] = field(default_factory=list)
    listener: socket.socket = field(default_factory=socket.socket)
    sockets: list[socket.socket] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                self.sockets.append(sock)
                number = len(self.sockets) - 1
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        reader = sock.makefile("rb")
        try:
            while True:
                line = reader.readline()
                if not line:
                    return
                headers = {}
                while (header := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = reader.read(int(headers.get("content-length", "0")))
                request = Request(number, line.decode("latin-1").strip(), headers, body)
                with self.lock:
                    self.requests.append(request)
                    action = self.actions[min(len(self.requests) - 1, len(self.actions) - 1)]
                if not action(sock, request):
                    return
        except OSError:
            return

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                sock.close()


def answer(body: bytes = QUEUE, *, status: str = "200 OK", version: str = "HTTP/1.1",
           headers: str = "", length: int | None = None) -> Action:
    def act(sock: socket.socket, request: Request) -> bool:
        size = len(body) if length is None else length
        sock.sendall(f"{version} {status}\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n{headers}\r\n"
                     .encode() + body)
        return True
    return act


def then_close(action: Action) -> Action:
    def act(sock: socket.socket, request: Request) -> bool:
        action(sock, request)
        sock.shutdown(socket.SHUT_RDWR)
        return False
    return act


def chunked(*chunks: bytes, end: bool = True) -> Action:
    def act(sock: socket.socket, request: Request) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + (b"0\r\n\r\n" if end else b""))
        return True
    return act


def silent(sock: socket.socket, request: Request) -> bool:
    return True  # reads on, never answers


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[TinyServer, ComfyClient]]]:
    made: list[tuple[TinyServer, ComfyClient]] = []

    def start(*actions: Action, timeout: float = 5.0, path: str = "") -> tuple[TinyServer, ComfyClient]:
        server = TinyServer(list(actions))
        client = ComfyClient(server.start() + path, timeout_seconds=timeout)
        made.append((server, client))
        return server, client

    yield start
    for server, client in made:
        client.close()
        server.close()


def connections(server: TinyServer) -> list[int]:
    return [r.connection for r in server.requests]


def test_calls_share_one_kept_connection(serve) -> None:
    server, client = serve(answer())
    for _ in range(3):
        assert client.queue() == []
    assert connections(server) == [0, 0, 0]


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_request(serve) -> None:
    server, client = serve(then_close(answer()), answer())
    assert client.queue() == []
    kept = client.connection._conn
    assert kept is not None and kept.sock is not None  # keep-alive: the client holds it
    assert select.select([kept.sock], [], [], 5)[0], "the server's close did not reach the client"
    client.known.state = "known"
    assert client.queue() == []  # written on a new connection, not sent into the closed one
    assert connections(server) == [0, 1]
    assert client.known.state == "known"  # no failure seen: nothing forgotten


@pytest.mark.parametrize("action", [answer(headers="Connection: close\r\n"), answer(version="HTTP/1.0")],
                         ids=["connection-close", "http-1.0"])
def test_an_answer_that_ends_its_connection_is_not_followed_on_it(serve, action: Action) -> None:
    """The server leaves the socket open: only the client's keeping to what the answer said puts the second
    request on a new connection."""
    server, client = serve(action, answer())
    assert client.queue() == []
    assert client.queue() == []
    assert connections(server) == [0, 1]


def test_a_post_whose_connection_is_cut_before_the_answer_is_not_sent_again(serve) -> None:
    server, client = serve(then_close(lambda sock, request: True), answer(b'{"number": 7, "node_errors": {}}'))
    client.known.state = "known"
    with pytest.raises(ServerUnavailable, match="POST /prompt: remote end closed") as caught:
        client.post_prompt({}, "p1", "c1")
    assert caught.value.kind == "connection"
    assert [r.line for r in server.requests] == ["POST /prompt HTTP/1.1"]  # once: a POST is never retried
    assert client.known.state == "unread"  # a cut connection: the server may have restarted
    assert client.post_prompt({}, "p2", "c1") == 7
    assert connections(server) == [0, 1]


@pytest.mark.parametrize("action", [answer(b"x" * 2048), chunked(b"x" * 1024, b"y" * 1024, end=False)],
                         ids=["content-length", "chunked"])
def test_a_body_larger_than_the_bound_is_refused_and_its_connection_dropped(serve, action: Action) -> None:
    server, client = serve(action, answer())
    with pytest.raises(MalformedAnswer, match="GET /queue: the answer is larger than"):
        client._json("GET", "/queue", max_bytes=1500)
    assert client.connection._conn is None  # dropped: the rest of the body is never read
    assert client.queue() == []
    assert connections(server) == [0, 1]


def test_a_chunked_body_within_the_bound_is_read_whole_and_the_connection_kept(serve) -> None:
    server, client = serve(chunked(QUEUE[:10], QUEUE[10:]))
    assert client._json("GET", "/queue", max_bytes=len(QUEUE)) == {"queue_running": [], "queue_pending": []}
    assert client.queue() == []
    assert connections(server) == [0, 0]


@pytest.mark.parametrize("action", [then_close(answer(QUEUE[:10], length=len(QUEUE))),
                                    then_close(chunked(QUEUE[:10], end=False))], ids=["content-length", "chunked"])
def test_an_answer_cut_in_the_middle_is_unavailable_and_the_next_call_connects_anew(serve, action: Action) -> None:
    server, client = serve(action, answer())
    client.known.state = "known"
    with pytest.raises(ServerUnavailable, match=r"GET /queue: connection broken: IncompleteRead\(") as caught:
        client.queue()
    assert caught.value.kind == "connection"
    assert client.known.state == "unread"
    assert client.queue() == []
    assert connections(server) == [0, 1]


def test_a_server_that_never_answers_times_out(serve) -> None:
    """In a thread other than the main one no deadline interrupts the read (comfysup.comfy.deadline): the
    socket's timeout is what ends it."""
    server, client = serve(silent, answer(), timeout=0.3)
    with ThreadPoolExecutor(1) as pool, pytest.raises(ServerUnavailable, match=r"^GET /queue: timed out after 0.3 s$"):
        pool.submit(client.queue).result(timeout=30)
    assert client.queue() == []  # the silent connection is not reused: its answer may still come
    assert connections(server) == [0, 1]


def test_a_server_that_never_answers_is_cut_by_the_calls_deadline(serve) -> None:
    _, client = serve(silent, timeout=0.3)
    with pytest.raises(ServerUnavailable, match=r"^GET /queue: (no complete answer within|timed out after) 0.3 s$"):
        client.queue()
    assert client.connection._conn is None


def test_a_view_stopped_early_leaves_no_connection_to_reuse(serve) -> None:
    server, client = serve(answer(b"z" * (1 << 18)), answer())
    chunks = client.view("a.png", "", "output")
    assert next(chunks) == b"z" * (1 << 16)
    chunks.close()  # the caller stops (a file over the cap, a deadline)
    assert client.queue() == []
    assert connections(server) == [0, 1]


def test_an_answer_left_unread_is_never_followed_on_its_connection(serve) -> None:
    """Whoever leaves a streamed answer unread and unclosed: the next call does not write behind it."""
    server, client = serve(answer(b"z" * 1000), answer())
    response, _ = client._call("GET", "/view", stream=True)
    assert response.read(10) == b"z" * 10
    assert client.queue() == []
    assert connections(server) == [0, 1]


def test_a_view_read_to_its_end_keeps_the_connection(serve) -> None:
    server, client = serve(answer(b"z" * 100_000), answer())
    assert b"".join(client.view("a b.png", "sub", "output")) == b"z" * 100_000
    assert client.queue() == []
    assert connections(server) == [0, 0]
    assert server.requests[0].line == "GET /view?filename=a+b.png&subfolder=sub&type=output HTTP/1.1"


def test_a_call_made_while_a_view_streams_goes_on_another_connection(serve) -> None:
    """Between two chunks the runner's checks may post the next job or interrupt one: neither cuts the download."""
    server, client = serve(answer(b"z" * (1 << 18)), answer())
    chunks = client.view("a.png", "", "output")
    first = next(chunks)
    assert client.queue() == []
    assert first + b"".join(chunks) == b"z" * (1 << 18)
    assert client.queue() == []  # on the call's connection, kept; the view's was closed, not kept as a second
    assert connections(server) == [0, 1, 1]


def test_a_view_cut_in_the_middle_is_a_download_failure(serve) -> None:
    server, client = serve(then_close(answer(b"z" * 1000, length=5000)), answer())
    with pytest.raises(ServerUnavailable, match=r"GET /view 'a.png': connection broken: IncompleteRead\(") as caught:
        b"".join(client.view("a.png", "", "output"))
    assert caught.value.kind == "download"
    assert client.queue() == []
    assert connections(server) == [0, 1]


def test_a_5xx_is_unavailable_and_the_connection_stays(serve) -> None:
    server, client = serve(answer(b"boom\nmore", status="503 Service Unavailable"), answer())
    with pytest.raises(ServerUnavailable, match=r"^GET /queue 503, boom$") as caught:
        client.queue()
    assert caught.value.kind == "http_5xx"
    assert client.queue() == []
    assert connections(server) == [0, 0]


def test_the_request_says_what_it_carries(serve) -> None:
    server, client = serve(answer(b'{"name": "a.png", "subfolder": "s", "type": "input"}'), path="/comfy")
    assert client.upload_image("a.png", b"\x89PNG", "s") == ("a.png", "s", "input")
    client.interrupt("p 1")
    client.history("id with space\x01")
    upload, interrupt, history = server.requests
    host = client.url.removeprefix("http://").removesuffix("/comfy")
    assert upload.line == "POST /comfy/upload/image HTTP/1.1" and upload.headers["host"] == host
    assert upload.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert upload.headers["content-length"] == str(len(upload.body)) and b"\x89PNG" in upload.body
    assert interrupt.headers["content-type"] == "application/json"
    assert interrupt.body == b'{"prompt_id": "p 1"}'
    assert "proxy-authorization" not in interrupt.headers and "authorization" not in interrupt.headers
    assert history.line == "GET /comfy/history/id%20with%20space%01 HTTP/1.1"
    assert "content-length" not in history.headers
