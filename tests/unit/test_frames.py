"""comfysup.comfy.frames: the WebSocket frames a server sends, parsed from a buffer, over a socket pair."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from comfysup.comfy import frames
from comfysup.comfy.frames import FrameReader, ProtocolError

pytestmark = pytest.mark.timeout(30)


def frame(payload: bytes, opcode: int = frames.TEXT, fin: bool = True, mask: bytes | None = None,
          rsv: int = 0) -> bytes:
    first = (0x80 if fin else 0) | rsv | opcode
    n = len(payload)
    masked = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes([first, masked | n])
    elif n < 1 << 16:
        head = bytes([first, masked | 126]) + struct.pack(">H", n)
    else:
        head = bytes([first, masked | 127]) + struct.pack(">Q", n)
    if mask is not None:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        head += mask
    return head + payload


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    server, client = socket.socketpair()
    yield server, client
    server.close()
    client.close()


def read_all(reader: FrameReader) -> list[tuple[int, bytes]]:
    """Every whole message, filling from the socket until nothing more comes within 0.2 s."""
    out = []
    while True:
        got = reader.message()
        if got is not None:
            out.append(got)
        elif not reader.fill(time.monotonic() + 0.2):
            return out


def until_whole(reader: FrameReader) -> tuple[int, bytes]:
    while (got := reader.message()) is None:
        assert reader.fill(time.monotonic() + 5), "the frame never came whole"
    return got


def test_many_frames_of_every_length_form_come_out_whole_and_in_order(pair) -> None:
    server, client = pair
    payloads = [b"a" * 5, b"b" * 125, b"c" * 126, b"d" * 70_000, b'{"type": "status"}', b""]
    server.sendall(b"".join(frame(p, frames.BINARY if i == 3 else frames.TEXT) for i, p in enumerate(payloads)))
    got = read_all(FrameReader(client))
    assert [p for _, p in got] == payloads
    assert [op for op, _ in got] == [frames.TEXT] * 3 + [frames.BINARY] + [frames.TEXT] * 2


def test_a_frame_split_anywhere_waits_for_its_rest_and_loses_nothing(pair) -> None:
    server, client = pair
    whole = frame(b"x" * 300) + frame(b"y")
    reader = FrameReader(client)
    for cut in (1, 2, 3, 4, 150):  # inside the header, inside the extended length, inside the payload
        reader = FrameReader(client)
        server.sendall(whole[:cut])
        assert reader.fill(time.monotonic() + 5)
        assert reader.message() is None and reader.buffered() == cut
        assert not reader.fill()  # a read of no time: nothing more yet, and nothing lost
        server.sendall(whole[cut:])
        assert until_whole(reader) == (frames.TEXT, b"x" * 300)
        assert reader.message() == (frames.TEXT, b"y")
        assert reader.message() is None and reader.buffered() == 0


def test_a_fragmented_message_is_put_together_with_a_ping_between_its_fragments(pair) -> None:
    server, client = pair
    server.sendall(frame(b"one ", fin=False) + frame(b"ping!", frames.PING) + frame(b"two ", frames.CONTINUATION,
                   fin=False) + frame(b"three", frames.CONTINUATION) + frame(b"", frames.CLOSE))
    assert read_all(FrameReader(client)) == [(frames.PING, b"ping!"), (frames.TEXT, b"one two three"),
                                             (frames.CLOSE, b"")]


@pytest.mark.parametrize(("data", "says"), [
    (frame(b"x", mask=b"\x01\x02\x03\x04"), "masked"),
    (frame(b"x", rsv=0x40), "reserved bits"),  # permessage-deflate was never negotiated
    (frame(b"x", opcode=0x3), "unknown opcode"),
    (frame(b"x" * 126, frames.PING), "control frame"),
    (frame(b"", frames.CLOSE, fin=False), "control frame"),
    (frame(b"x", frames.CONTINUATION), "continuation frame outside"),
    (frame(b"x", fin=False) + frame(b"y"), "new message began inside"),
    (bytes([0x82, 127]) + struct.pack(">Q", frames.MAX_MESSAGE_BYTES + 1), "over"),
])
def test_what_a_server_may_not_send_is_a_protocol_error(pair, data: bytes, says: str) -> None:
    server, client = pair
    server.sendall(data)
    reader = FrameReader(client)
    with pytest.raises(ProtocolError, match=says):
        until_whole(reader)


def test_a_fragmented_message_over_the_bound_is_refused_before_it_is_all_held(pair, monkeypatch) -> None:
    monkeypatch.setattr(frames, "MAX_MESSAGE_BYTES", 1000)
    server, client = pair
    server.sendall(b"".join(frame(b"z" * 400, frames.CONTINUATION if i else frames.BINARY, fin=False)
                            for i in range(3)))
    reader = FrameReader(client)
    with pytest.raises(ProtocolError, match="fragmented message of more than 1,000 bytes"):
        until_whole(reader)


def test_an_empty_socket_waits_only_as_long_as_asked_and_the_end_of_the_stream_is_closed(pair) -> None:
    server, client = pair
    reader = FrameReader(client)
    assert not reader.fill()  # no time: at once
    start = time.monotonic()
    assert not reader.fill(start + 0.05)
    assert time.monotonic() - start >= 0.05
    server.close()
    with pytest.raises(frames.Closed):
        reader.fill(time.monotonic() + 5)
