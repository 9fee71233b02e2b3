"""the previews: ComfyUI's binary preview frames as the runner reads them (comfysup.comfy.wire
``ws_preview``), and the bound on what an SSE stream holds of them (comfysup.api.events ``Stream.push_preview``):
one preview waiting, the newest, however many come and however slowly the client reads."""

from __future__ import annotations

import asyncio
import json
import struct

from hypothesis import given
from hypothesis import strategies as st

from comfysup.api.events import BACKLOG, PREVIEW_READY, Stream, frame, preview_frame
from comfysup.comfy.wire import MAX_PREVIEW_BYTES, ws_preview
from comfysup.queue.base import Preview

JPEG = b"\xff\xd8\xff\xe0" + b"x" * 100


def legacy(image: bytes, fmt: int = 1) -> bytes:
    return struct.pack(">II", 1, fmt) + image


def with_metadata(image: bytes, meta: dict[str, object]) -> bytes:
    text = json.dumps(meta).encode()
    return struct.pack(">II", 4, len(text)) + text + image


def test_both_frame_layouts_are_read() -> None:
    assert ws_preview(legacy(JPEG)) == {"type": "preview", "data": {"prompt_id": None, "node_id": None,
                                                                    "content_type": "image/jpeg", "image": JPEG}}
    got = ws_preview(with_metadata(JPEG, {"node_id": "3", "display_node_id": "12", "prompt_id": "p",
                                          "image_type": "image/png"}))
    assert got is not None and got["data"] == {"prompt_id": "p", "node_id": "12", "content_type": "image/png",
                                               "image": JPEG}


def test_anything_else_is_passed_over_never_an_error() -> None:
    for raw in (b"", b"\x00\x00\x00\x01", legacy(JPEG, fmt=9), legacy(b""), struct.pack(">II", 3, 1) + JPEG,
                struct.pack(">II", 4, 999) + b"{}", with_metadata(JPEG, {"image_type": "text/html"}),
                struct.pack(">II", 4, 3) + b"[1]" + JPEG, struct.pack(">II", 4, 2) + b"{]" + JPEG,
                legacy(b"x" * (MAX_PREVIEW_BYTES + 1))):
        assert ws_preview(raw) is None, raw[:16]


@given(head=st.sampled_from([1, 4, 2, 0]), word=st.integers(0, 2**32 - 1), body=st.binary(max_size=600))
def test_any_frame_is_a_preview_of_the_right_shape_or_nothing(head: int, word: int, body: bytes) -> None:
    got = ws_preview(struct.pack(">II", head, word) + body)
    if got is not None:
        data = got["data"]
        assert data["content_type"] in ("image/jpeg", "image/png", "image/webp") and data["image"]
        assert data["node_id"] is None or isinstance(data["node_id"], str)
        assert data["prompt_id"] is None or isinstance(data["prompt_id"], str)


def test_a_slow_stream_holds_one_preview_the_newest_and_is_never_ended_for_previews() -> None:
    async def go() -> None:
        stream = Stream("job", "http://127.0.0.1:1")
        frames = [preview_frame(Preview(n, "2", "image/jpeg", bytes([n % 256]) * 1000)) for n in range(10 * BACKLOG)]
        for item in frames:
            stream.push_preview(item)
        assert stream.frames.qsize() == 1 and stream.frames.get_nowait() is PREVIEW_READY
        assert stream.preview is frames[-1] and not stream.lagging
        stream.preview = None  # sent, as the handler does when it takes the marker
        stream.push([frame("status", {"status": "running"})])
        stream.push_preview(frames[0])
        stream.push_preview(frames[1])
        assert stream.frames.qsize() == 2 and stream.preview is frames[1]  # one marker for the one now waiting

    asyncio.run(go())
