"""Input images for the tests, shared by the integration tests and the chaos suite: the
LoadImage → ImageInvert → SaveImage workflow, PNGs of random pixels, and the pixel rule an inverted output
must follow (``uint8(trunc(255·(1 − float32(v)/255)))``, ComfyUI's float32 arithmetic; see
fake_comfy/uploads.py). One copy of the rule, so a checker cannot drift from the tests."""

from __future__ import annotations

import random
import struct
import zlib
from typing import Any

INVERT: dict[str, Any] = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inv"}},
}


def random_png(seed: int, width: int = 16, height: int = 16, pad: int = 0) -> bytes:
    """An RGB PNG of random pixels (``pad`` bytes of a text chunk make it larger)."""
    rng = random.Random(seed)
    raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(width * 3)) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    extra = chunk(b"tEXt", b"pad\x00" + b"x" * pad) if pad else b""
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + extra
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def expected_inverse(v: int) -> int:
    """What ImageInvert then SaveImage make of an 8-bit value ``v``, in ComfyUI's float32."""
    def f32(x: float) -> float:
        return struct.unpack("f", struct.pack("f", x))[0]

    return int(f32(255.0 * f32(1.0 - f32(f32(float(v)) / f32(255.0)))))
