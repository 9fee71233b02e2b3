"""The WebSocket side: ComfyUI's `sockets` dict, its send rules and its ordered outbound queue.

The executor never writes to a socket itself: like ComfyUI's send_sync it posts to one queue that a
single publisher task drains, so messages leave in the order they were made and a slow client cannot
stall a prompt. Actions (cut a client off, crash) go through the same queue, after what came before.

One socket per client id: a new connection with the same id replaces the old one in the dict (the old
one stays open but hears nothing), and when any socket closes its id is popped, so closing the OLD
socket silences the NEW one. That is what ComfyUI 0.3.64 does (reconnect.json), and comfysup has to
live with it, so the fake does it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import sys
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

#: ComfyUI's BinaryEventTypes.
PREVIEW_IMAGE = 1
PREVIEW_IMAGE_WITH_METADATA = 4

_SEND_ERRORS = (aiohttp.ClientError, ConnectionError, RuntimeError)


class Hub:
    """Registered sockets, their feature flags, and every socket ever opened (to close them at stop)."""

    def __init__(self) -> None:
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.metadata: dict[str, dict[str, Any]] = {}
        self.requests: dict[web.WebSocketResponse, web.Request] = {}
        self._outbox: asyncio.Queue[Callable[[], Any]] = asyncio.Queue()
        self._publisher: asyncio.Task[None] | None = None
        self.rewrite: Callable[[str, Any], list[str | bytes] | None] | None = None
        """Hostile mode: the frames to send instead of a message (None: the message as it is)."""

    def start(self) -> None:
        """Start the publisher (inside the server's event loop)."""
        self._publisher = asyncio.get_running_loop().create_task(self._publish())

    async def stop(self) -> None:
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
            self._publisher = None

    async def _publish(self) -> None:
        while True:
            job = await self._outbox.get()
            try:
                result = job()
                if asyncio.iscoroutine(result):
                    await result
            except Exception as exc:  # a broken action must not silence every later message
                print(f"fake_comfy: publisher: {exc!r}", file=sys.stderr, flush=True)

    def post(self, event: str, data: Any, sid: str | None = None) -> None:
        """send_sync: queue a JSON message for one client id, or for everyone when `sid` is None."""
        self._outbox.put_nowait(lambda: self.send_json(event, data, sid))

    def post_preview(self, image: bytes, metadata: dict[str, Any] | None, sid: str | None) -> None:
        """Queue a preview frame: event 4 with `metadata`, or the legacy event 1 when it is None."""
        if metadata is None:
            self._outbox.put_nowait(lambda: self.send_legacy_preview(image, sid))
        else:
            self._outbox.put_nowait(lambda: self.send_preview(image, metadata, sid))

    def post_action(self, action: Callable[[], Any]) -> None:
        """Run `action` once everything queued before it has been sent."""
        self._outbox.put_nowait(action)

    def register(self, sid: str, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.sockets.pop(sid, None)
        self.sockets[sid] = ws
        self.metadata[sid] = {"feature_flags": {}}
        self.requests[ws] = request

    def unregister(self, sid: str, ws: web.WebSocketResponse) -> None:
        """Called when `ws` closes: pops the id even if a newer socket now holds it, as ComfyUI does."""
        self.sockets.pop(sid, None)
        self.metadata.pop(sid, None)
        self.requests.pop(ws, None)

    def supports(self, sid: str | None, feature: str) -> bool:
        """Whether the client announced a feature in its feature_flags handshake."""
        if sid is None:
            return False
        return bool(self.metadata.get(sid, {}).get("feature_flags", {}).get(feature))

    def _targets(self, sid: str | None) -> list[web.WebSocketResponse]:
        if sid is None:
            return list(self.sockets.values())
        ws = self.sockets.get(sid)
        return [ws] if ws is not None else []

    async def send_json(self, event: str, data: Any, sid: str | None = None) -> None:
        """To one client id, or to every registered socket when `sid` is None; lost sends are ignored."""
        frames = self.rewrite(event, data) if self.rewrite is not None else None
        frames = [json.dumps({"type": event, "data": data})] if frames is None else frames
        for ws in self._targets(sid):
            try:
                for frame in frames:
                    await (ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_str(frame))
            except _SEND_ERRORS:
                pass

    async def send_bytes(self, event: int, payload: bytes, sid: str | None = None) -> None:
        """A binary frame: u32 big-endian event type, then the payload."""
        message = struct.pack(">I", event) + payload
        for ws in self._targets(sid):
            try:
                await ws.send_bytes(message)
            except _SEND_ERRORS:
                pass

    async def send_preview(self, image: bytes, metadata: dict[str, Any], sid: str | None) -> None:
        """Event 4 (u32 metadata length, metadata JSON, image) for clients that asked for metadata."""
        meta = json.dumps(metadata).encode()
        await self.send_bytes(PREVIEW_IMAGE_WITH_METADATA, struct.pack(">I", len(meta)) + meta + image, sid)

    async def send_legacy_preview(self, image: bytes, sid: str | None) -> None:
        """Event 1: u32 image type (1 = JPEG), then the image."""
        await self.send_bytes(PREVIEW_IMAGE, struct.pack(">I", 1) + image, sid)

    def abort(self, sid: str | None) -> bool:
        """Cut a client's connection without a close frame, like a network drop (the "drop" word)."""
        ws = self.sockets.get(sid) if sid is not None else None
        request = self.requests.get(ws) if ws is not None else None
        if request is None or request.transport is None:
            return False
        request.transport.abort()
        return True

    def close_all(self, abort: bool) -> None:
        """End every open socket's connection (registered or replaced) when the server stops."""
        for request in list(self.requests.values()):
            transport = request.transport
            if transport is None:
                continue
            if abort:
                transport.abort()
            else:
                transport.close()
