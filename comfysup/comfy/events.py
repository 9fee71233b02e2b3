"""ComfyUI's WebSocket for one client id: connect, read JSON messages within a time bound, drain, reconnect.

The frames after websocket-client's handshake are read by comfysup.comfy.frames from one buffer; every
message passes comfysup.comfy.wire's checks before anything reads it.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import websocket

from comfysup.comfy import frames, wire
from comfysup.comfy.errors import MalformedAnswer, SocketLost, short

_CONNECTIONS = itertools.count(1)

class EventStream:
    """ComfyUI's WebSocket for one client id: its JSON messages, and its binary preview frames as ``preview``
    messages when ``previews`` (comfysup.comfy.wire ``ws_preview``; any other binary frame is skipped)."""

    previews = False
    """Whether preview frames are read (the runner's streams: the API's SSE ``preview`` events)."""

    def __init__(self, url: str, client_id: str, connect_timeout_seconds: float) -> None:
        self.url = "ws" + url[4:] + f"/ws?clientId={client_id}" if url.startswith("http") else url
        self.client_id = client_id
        self.connect_timeout_seconds = connect_timeout_seconds
        self.ws: websocket.WebSocket | None = None
        self.frames: frames.FrameReader | None = None
        """The frames after the handshake are read here (comfysup.comfy.frames), not by websocket-client."""
        self.connection = 0
        """Which connection reads now (unique in the process, 0 before the first): a message read on another
        one came before a reconnect, and the messages sent in between are lost."""

    def connect(self) -> None:
        """(Re)connect with the same client id. The old socket is closed first: when an old socket of one
        client id closes after a new one opened, ComfyUI silently stops sending to the new one."""
        self.close()
        try:
            # skip_utf8_validation: websocket-client reads frames only in its close() now (its handshake
            # reads byte by byte, so nothing after it is left in a buffer of its own); text is checked by
            # wire.decode's strict UTF-8 anyway.
            self.ws = websocket.create_connection(self.url, timeout=self.connect_timeout_seconds,
                                                  enable_multithread=False, skip_utf8_validation=True)
            self.frames = frames.FrameReader(self.ws.sock)
            self.connection = next(_CONNECTIONS)
        except (OSError, websocket.WebSocketException) as exc:
            self.ws = None
            raise SocketLost(f"WebSocket connect: {short(exc)}") from exc

    def recv(self, timeout_seconds: float) -> dict[str, Any] | None:
        """The next JSON message the runner reads, or None when ``timeout_seconds`` passed without one.

        ``timeout_seconds`` bounds the whole call, not each frame: frames the runner does not read (a custom
        node's messages, previews, ComfyUI's progress_state) can come faster than it, and the caller's wake-up
        (its heartbeat, a cancel, a stop, the deadline) must not wait for a message it reads. A call of no time
        reads only what is buffered, never waiting: a timeout, however short, is a poll() of at least 1 ms."""
        if self.ws is None or self.frames is None:
            raise SocketLost("WebSocket not connected")
        until = time.monotonic() + timeout_seconds if timeout_seconds > 0 else None
        while True:
            got = self._next(until)
            if got is None:
                return None
            opcode, data = got
            if opcode == frames.TEXT:
                try:
                    message = wire.ws_message(data)
                except wire.Malformed as exc:
                    raise MalformedAnswer(f"server sent a malformed WebSocket message: {exc}") from None
                if message is not None:
                    return message
            elif self.previews and (preview := wire.ws_preview(data)) is not None:
                return preview
            # A frame not read (unread types, other binary frames): on for what is left of the call's time.

    def _next(self, until: float | None) -> tuple[int, bytes] | None:
        """The next data message (TEXT or BINARY), answering pings and reading more from the socket as needed;
        None when nothing whole came by ``until`` (None: among what is buffered now)."""
        reader = self.frames
        assert self.ws is not None and reader is not None
        while True:
            try:
                got = reader.message()
                if got is None:
                    if not reader.fill(until):
                        return None
                    continue
            except frames.ProtocolError as exc:
                self.close()
                raise SocketLost(f"WebSocket lost: {exc}") from None
            except frames.Closed:
                self.close()
                raise SocketLost("WebSocket closed by the server") from None
            except OSError as exc:
                self.close()
                raise SocketLost(f"WebSocket lost: {short(exc)}") from exc
            opcode, data = got
            if opcode in (frames.TEXT, frames.BINARY):
                return got
            if opcode == frames.CLOSE:
                self.close()
                raise SocketLost("WebSocket closed by the server")
            if opcode == frames.PING:
                try:
                    self.ws.pong(data)
                except (OSError, websocket.WebSocketException) as exc:
                    self.close()
                    raise SocketLost(f"WebSocket lost: {short(exc)}") from exc

    def drain(self) -> None:
        """Discard what is already buffered (a finished prompt's last messages, status broadcasts) without
        waiting; a socket found broken is closed, for the caller to reconnect. A frame not yet whole stays in
        the reader for the next call, as the socket's bytes would."""
        if self.ws is None:
            return
        try:
            while self._next(None) is not None:
                pass
        except SocketLost:
            pass  # closed already: the caller reconnects

    def close(self) -> None:
        self.frames = None
        if self.ws is not None:
            try:
                self.ws.close(timeout=0.5)
            except Exception:
                pass
            self.ws = None
