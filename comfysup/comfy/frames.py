"""ComfyUI's WebSocket frames, read from a buffer: websocket-client makes the connection (the handshake, TLS,
proxies) and sends (a pong, the close), and the frames the server sends after the handshake are parsed here.

Why not websocket-client's own ``recv_data``: it reads each frame with two or three ``recv`` calls (the two
header bytes, the length, the payload), each a system call and several layers of pure-Python frame objects.
A runner reads about 19 frames a job (ComfyUI's ``status``, ``execution_start``, ``executing`` for each node,
``progress_state``, ...), and in a profile of the runner (bench/profile_runner.py --profile cpu) that was a
fifth of its CPU per job. Here one ``recv_into`` of up to 64 KiB takes whatever the kernel holds, often every
message of a prompt at once, and each frame is two byte reads and a slice.

A server's frames are checked as RFC 6455 says a client must: no reserved bits (no extension was
negotiated), never masked, control frames short and whole, continuation frames only inside a fragmented
message. A message is bounded (MAX_MESSAGE_BYTES): a hostile or broken server cannot make the runner hold an
endless frame. Any violation is a ``ProtocolError``, which the caller treats as a lost socket.

The socket is put in non-blocking mode once, at the start: a read of no time is one ``recv`` that finds
the kernel's buffer empty or not, and a read that may wait polls first. Python's own ``settimeout`` before
each read was an ``ioctl`` every time (19 a job), and a timeout, however short, is a ``poll()`` of whole
milliseconds.

Pure parsing over the bytes ``fill`` reads; its ``recv`` and ``poll`` are the only I/O.
"""

from __future__ import annotations

import math
import select
import socket
import ssl
import time

MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message (a whole frame, or a fragmented message put together) the reader holds. ComfyUI's
largest are binary previews (a JPEG or PNG of the latent, a few hundred KiB at 1024 px); a text message about
one prompt is far smaller."""

RECV_BYTES = 64 * 2**10
"""How much one read takes at most, into one buffer kept for the connection (no allocation a read): every
message of a trivial prompt usually fits, a large preview takes a few."""

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_DATA = (TEXT, BINARY)
_CONTROL = (CLOSE, PING, PONG)
_WHOLE_DATA = (0x80 | TEXT, 0x80 | BINARY)
"""The first byte of an unfragmented text or binary frame without reserved bits: with a second byte under 126
(unmasked, its 7-bit length) the frame is one a server may send, nothing more to check (most of ComfyUI's)."""


NOTHING_BUFFERED = (BlockingIOError, ssl.SSLWantReadError)
"""What a non-blocking read of an empty socket raises: plain (EAGAIN), or through TLS (a wss:// server, whose
record has not all arrived)."""


class ProtocolError(Exception):
    """The server sent bytes that are not a WebSocket frame a client may receive; the text says what."""


class Closed(Exception):
    """The server closed the connection (end of stream) without a close frame."""


class FrameReader:
    """The messages of one connection: ``message()`` returns the next whole one from what ``fill()`` read, or
    None when more bytes are needed. A message is ``(opcode, payload)``: TEXT or BINARY (fragments put
    together), CLOSE, PING or PONG."""

    __slots__ = ("_buf", "_chunk", "_parts", "_parts_opcode", "_parts_size", "_poll", "_pos", "_sock")

    def __init__(self, sock: socket.socket | ssl.SSLSocket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._buf = bytearray()
        self._chunk = memoryview(bytearray(RECV_BYTES))
        self._pos = 0
        self._parts: list[bytes] = []
        self._parts_opcode = 0
        self._parts_size = 0

    def fill(self, until: float | None = None) -> bool:
        """Read what the socket holds into the buffer; True once some bytes came. ``until`` (a monotonic time):
        wait for them until then; None: only what is there now, never waiting. False when none came in time.
        Raises Closed at the end of the stream, and OSError (ssl.SSLError included) for a broken one."""
        sock = self._sock
        while True:
            try:
                got = sock.recv_into(self._chunk)
                break
            except NOTHING_BUFFERED:
                if until is None:
                    return False
                left = until - time.monotonic()
                if left <= 0 or not self._poll.poll(math.ceil(left * 1000)):
                    return False
        if not got:
            raise Closed("the server closed the connection")
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += self._chunk[:got]
        return True

    def buffered(self) -> int:
        """Bytes read from the socket and not yet handed out as a message (a frame not yet whole)."""
        return len(self._buf) - self._pos

    def message(self) -> tuple[int, bytes] | None:
        """The next whole message among the bytes read so far, or None when its frame has not all arrived."""
        while True:
            frame = self._frame()
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode in _CONTROL:
                return opcode, payload  # control frames may come between the fragments of a message
            if opcode == CONTINUATION:
                if not self._parts_opcode:
                    raise ProtocolError("a continuation frame outside a fragmented message")
                self._add_part(payload)
                if not fin:
                    continue
                opcode, payload = self._parts_opcode, b"".join(self._parts)
                self._parts, self._parts_opcode, self._parts_size = [], 0, 0
                return opcode, payload
            if self._parts_opcode:
                raise ProtocolError("a new message began inside a fragmented one")
            if fin:
                return opcode, payload
            self._parts_opcode = opcode
            self._add_part(payload)

    def _add_part(self, payload: bytes) -> None:
        self._parts_size += len(payload)
        if self._parts_size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a fragmented message of more than {MAX_MESSAGE_BYTES:,} bytes")
        self._parts.append(payload)

    def _frame(self) -> tuple[bool, int, bytes] | None:
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if available < 2:
            return None
        first, second = buf[pos], buf[pos + 1]
        if first in _WHOLE_DATA and second < 126:  # the common frame: nothing to check
            opcode, size, head = first & 0x0F, second, 2
        else:
            opcode = _checked_opcode(first, second)
            length = _payload_length(buf, pos, second & 0x7F, available)
            if length is None:
                return None
            size, head = length
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a frame of {size:,} bytes, over {MAX_MESSAGE_BYTES:,}")
        end = pos + head + size
        if len(buf) < end:
            return None
        payload = bytes(buf[pos + head:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return bool(first & 0x80), opcode, payload


def _checked_opcode(first: int, second: int) -> int:
    """The opcode of a frame whose first two bytes are ``first`` and ``second``, once they are what a server may
    send: no reserved bit, no mask, a known opcode, a control frame short and whole."""
    if first & 0x70:
        raise ProtocolError("a frame with reserved bits set, though no extension was negotiated")
    if second & 0x80:
        raise ProtocolError("a masked frame: a server's frames are never masked")
    opcode = first & 0x0F
    if opcode not in _DATA and opcode not in _CONTROL and opcode != CONTINUATION:
        raise ProtocolError(f"a frame of unknown opcode {opcode:#x}")
    if opcode in _CONTROL and (second & 0x7F > 125 or not first & 0x80):
        raise ProtocolError(f"a control frame (opcode {opcode:#x}) that is long or fragmented")
    return opcode


def _payload_length(buf: bytearray, pos: int, size: int, available: int) -> tuple[int, int] | None:
    """The payload's length and the header's, from the 7-bit ``size`` or the 16- or 64-bit length after it;
    None while those bytes have not arrived."""
    if size == 126:
        if available < 4:
            return None
        return int.from_bytes(buf[pos + 2:pos + 4], "big"), 4
    if size == 127:
        if available < 10:
            return None
        return int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
    return size, 2
