"""comfysup.comfy.EventStream.recv: its timeout bounds the whole call, however many frames the runner
does not read come meanwhile (ComfyUI's progress_state at every step of a node, a custom node's own messages,
previews). The attempt wakes up on that timeout for its heartbeat, a cancel, a stop and its deadline."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from comfysup.comfy import EventStream

pytestmark = pytest.mark.timeout(60)

UNREAD = json.dumps({"type": "progress_state", "data": {"prompt_id": "p", "nodes": {"2": {"value": 1, "max": 9}}}})
READ = json.dumps({"type": "executing", "data": {"prompt_id": "p", "node": None}})


@pytest.fixture
def server() -> Iterator[dict[str, Any]]:
    """A WebSocket that sends an unread frame every 20 ms for 30 s, then one frame the runner reads."""
    state: dict[str, Any] = {"ready": threading.Event(), "stop": None, "sent": 0}

    async def ws(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        for _ in range(1500):
            if state["stop"].is_set():
                break
            await socket.send_str(UNREAD)
            state["sent"] += 1
            await asyncio.sleep(0.02)
        await socket.send_str(READ)
        await state["stop"].wait()
        await socket.close()
        return socket

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        state["stop"] = asyncio.Event()
        state["loop"] = loop
        app = web.Application()
        app.router.add_get("/ws", ws)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["ready"].set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert state["ready"].wait(10)
    yield state
    state["loop"].call_soon_threadsafe(state["stop"].set)
    state["loop"].call_soon_threadsafe(state["loop"].stop)
    thread.join(10)


def test_frames_the_runner_does_not_read_do_not_hold_recv_past_its_timeout(server: dict[str, Any]) -> None:
    stream = EventStream(f"http://127.0.0.1:{server['port']}", "client", 5.0)
    stream.connect()
    try:
        # Before the fix, recv went on past each unread frame with a fresh timeout and returned the read frame
        # 30 s later; now it returns None when its 0.3 s are over, with unread frames still coming.
        assert stream.recv(0.3) is None
        assert server["sent"] < 1500, "the unread frames had all been sent: the call was not bounded"
        assert stream.recv(0.3) is None  # and again: each call is bounded on its own
    finally:
        stream.close()


class RawSocket:
    """A WebSocket server end that sends exactly the bytes a test gives it: half a frame, then the rest."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self.accepted = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        self.conn = conn
        self.accepted.set()

    @staticmethod
    def frame(text: str) -> bytes:
        payload = text.encode()
        assert len(payload) < 126
        return bytes([0x81, len(payload)]) + payload

    def send(self, data: bytes) -> None:
        assert self.accepted.wait(10)
        self.conn.sendall(data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


@pytest.fixture
def raw() -> Iterator[RawSocket]:
    server = RawSocket()
    yield server
    server.close()


def _readable(stream: EventStream) -> None:
    """Wait (an event, not a sleep) until the client's socket holds bytes the server sent."""
    assert select.select([stream.ws.sock], [], [], 10)[0], "the server's bytes never arrived"  # type: ignore[union-attr]


def test_recv_of_no_time_reads_what_is_buffered_without_ever_waiting(raw: RawSocket) -> None:
    stream = EventStream(f"http://127.0.0.1:{raw.port}", "client", 5.0)
    stream.connect()
    waits: list[int] = []

    class Watched:
        def __init__(self, poll: Any) -> None:
            self.poll_ = poll

        def poll(self, ms: int) -> Any:
            waits.append(ms)
            return self.poll_.poll(ms)

    stream.frames._poll = Watched(stream.frames._poll)  # type: ignore[union-attr]
    try:
        assert stream.recv(0.0) is None  # nothing sent yet
        # A non-blocking read, no wait at all. Before, 1 ms: a poll() that slept a millisecond or more every
        # time the runner looked at an empty socket between two steps of an attempt.
        assert waits == []
        assert stream.recv(0.05) is None and waits, "a call with time waits on the socket"
        waits.clear()
        raw.send(RawSocket.frame(UNREAD) + RawSocket.frame(READ))
        _readable(stream)
        message = stream.recv(0.0)  # the unread frame is passed over; the read one is returned
        assert message is not None and message["type"] == "executing"
        assert stream.recv(0.0) is None
        assert waits == []
    finally:
        stream.close()


def test_a_frame_half_buffered_is_not_lost_by_a_read_of_no_time(raw: RawSocket) -> None:
    stream = EventStream(f"http://127.0.0.1:{raw.port}", "client", 5.0)
    stream.connect()
    try:
        whole = RawSocket.frame(READ)
        raw.send(whole[:20])  # the header and part of the payload
        _readable(stream)
        assert stream.recv(0.0) is None  # what came is kept by the frame reader, not dropped with the socket
        assert stream.ws is not None, "a socket with half a frame in it was taken for a broken one"
        raw.send(whole[20:])
        message = stream.recv(5.0)
        assert message is not None and message["type"] == "executing" and message["data"]["node"] is None
    finally:
        stream.close()


def test_a_ping_is_answered_with_a_pong_and_a_close_frame_loses_the_socket(raw: RawSocket) -> None:
    from comfysup.comfy import SocketLost

    stream = EventStream(f"http://127.0.0.1:{raw.port}", "client", 5.0)
    stream.connect()
    try:
        raw.send(bytes([0x89, 4]) + b"beat" + RawSocket.frame(READ))
        message = stream.recv(5.0)
        assert message is not None and message["type"] == "executing"
        raw.conn.settimeout(5)
        head = raw.conn.recv(2)  # the client's pong: masked (as every client frame is), the ping's payload
        assert head == bytes([0x8A, 0x80 | 4])
        mask, body = raw.conn.recv(4), raw.conn.recv(4)
        assert bytes(b ^ mask[i % 4] for i, b in enumerate(body)) == b"beat"
        raw.send(bytes([0x88, 0]))
        with pytest.raises(SocketLost, match="closed by the server"):
            stream.recv(5.0)
        assert stream.ws is None and stream.frames is None
    finally:
        stream.close()
