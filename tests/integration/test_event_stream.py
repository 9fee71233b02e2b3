"""comfysup.runner.client.EventStream.recv: its timeout bounds the whole call, however many frames the runner
does not read come meanwhile (ComfyUI's progress_state at every step of a node, a custom node's own messages,
previews). The attempt wakes up on that timeout for its heartbeat, a cancel, a stop and its deadline."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from comfysup.runner.client import EventStream

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
