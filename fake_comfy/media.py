"""Animated files without PIL or ffmpeg: the WebP SaveAnimatedWEBP writes and the WebM container of SaveWEBM; and the
headers of the MP4 SaveVideo and VHS_VideoCombine write and the FLAC of SaveAudio (their media are not coded).

WebP: each frame a lossless (VP8L) picture of one colour, which needs no pixel coding at all: every prefix
code is a one-symbol code, so each pixel takes zero bits (RFC 9649). One frame is a still WebP, as PIL
writes one; more are an animation (VP8X, ANIM, one ANMF per frame at the fps). Any WebP decoder reads them.

WebM: the EBML header, the segment's info (duration), the video track (codec, width, height) and one block
per frame at the fps, so a probe sees the right type, size, codec, frame count and duration; the blocks carry
no coded picture (the fake encodes no VP9 or AV1), so a player shows nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

RGB = tuple[int, int, int]


class _Bits:
    """VP8L's bit order: least significant bit first."""

    def __init__(self) -> None:
        self.value = 0
        self.count = 0

    def put(self, value: int, bits: int) -> None:
        self.value |= (value & ((1 << bits) - 1)) << self.count
        self.count += bits

    def bytes(self) -> bytes:
        return self.value.to_bytes((self.count + 7) // 8, "little")


def vp8l_solid(width: int, height: int, rgb: RGB) -> bytes:
    """A VP8L bitstream (signature 0x2f first) of one opaque colour, width and height at most 16384."""
    bits = _Bits()
    bits.put(width - 1, 14)
    bits.put(height - 1, 14)
    bits.put(0, 1)  # alpha_is_used
    bits.put(0, 3)  # version
    bits.put(0, 1)  # no transform
    bits.put(0, 1)  # no colour cache
    bits.put(0, 1)  # no meta prefix codes: one group of five codes for the whole image
    red, green, blue = rgb
    for symbol in (green, red, blue, 255, 0):  # green (+ lengths), red, blue, alpha, distance
        bits.put(1, 1)  # a simple code ...
        bits.put(0, 1)  # ... of one symbol: zero bits per pixel
        if symbol < 2:
            bits.put(0, 1)
            bits.put(symbol, 1)
        else:
            bits.put(1, 1)
            bits.put(symbol, 8)
    return b"\x2f" + bits.bytes()


def _riff_chunk(fourcc: bytes, data: bytes) -> bytes:
    return fourcc + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) % 2 else b"")


def _u24(value: int) -> bytes:
    return value.to_bytes(3, "little")


def webp(width: int, height: int, frames: Sequence[RGB], duration_ms: int) -> bytes:
    """A WebP of these frames (each one colour): still for one frame, animated (looping) for more."""
    width, height = min(max(width, 1), 16384), min(max(height, 1), 16384)
    if len(frames) <= 1:
        body = _riff_chunk(b"VP8L", vp8l_solid(width, height, frames[0] if frames else (0, 0, 0)))
    else:
        vp8x = bytes([0x02, 0, 0, 0]) + _u24(width - 1) + _u24(height - 1)  # the animation flag
        anim = bytes([0, 0, 0, 0]) + struct.pack("<H", 0)  # background colour, loop forever
        body = _riff_chunk(b"VP8X", vp8x) + _riff_chunk(b"ANIM", anim)
        for rgb in frames:
            header = _u24(0) + _u24(0) + _u24(width - 1) + _u24(height - 1) + _u24(min(duration_ms, 0xFFFFFF))
            frame = header + bytes([0x02]) + _riff_chunk(b"VP8L", vp8l_solid(width, height, rgb))  # no blending
            body += _riff_chunk(b"ANMF", frame)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def _element(element_id: int, payload: bytes) -> bytes:
    """An EBML element: its id's bytes, an 8-byte size, the payload."""
    return element_id.to_bytes((element_id.bit_length() + 7) // 8, "big") + b"\x01" + len(payload).to_bytes(7, "big") \
        + payload


def _uint(element_id: int, value: int) -> bytes:
    return _element(element_id, value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big"))


def webm(width: int, height: int, frames: int, fps: float, codec: str) -> bytes:
    """A WebM container: one video track (V_VP9 or V_AV1) of width × height, ``frames`` blocks at ``fps``."""
    header = _element(0x1A45DFA3, _uint(0x4286, 1) + _uint(0x42F7, 1) + _uint(0x42F2, 4) + _uint(0x42F3, 8)
                      + _element(0x4282, b"webm") + _uint(0x4287, 4) + _uint(0x4285, 2))
    step_ms = 1000.0 / fps if fps > 0 else 1000.0
    info = _element(0x1549A966, _uint(0x2AD7B1, 1_000_000) + _element(0x4D80, b"fake_comfy")
                    + _element(0x5741, b"fake_comfy") + _element(0x4489, struct.pack(">d", frames * step_ms)))
    video = _element(0xE0, _uint(0xB0, width) + _uint(0xBA, height))
    codec_id = b"V_AV1" if codec == "av1" else b"V_VP9"
    track = _element(0xAE, _uint(0xD7, 1) + _uint(0x73C5, 1) + _uint(0x83, 1) + _element(0x86, codec_id) + video)
    blocks = b"".join(_element(0xA3, b"\x81" + struct.pack(">hB", min(round(i * step_ms), 32767), 0x80))
                      for i in range(frames))
    cluster = _element(0x1F43B675, _uint(0xE7, 0) + blocks)
    return header + _element(0x18538067, info + _element(0x1654AE6B, track) + cluster)


def flac(sample_rate: int, channels: int, samples: int) -> bytes:
    """A FLAC stream of silence as a probe reads it: the ``fLaC`` marker and its STREAMINFO (rate, channels,
    16-bit, total samples, so its duration), no audio frames (the fake encodes nothing)."""
    rate, channels, samples = min(max(sample_rate, 1), (1 << 20) - 1), min(max(channels, 1), 8), max(samples, 0)
    packed = (rate << 44) | ((channels - 1) << 41) | ((16 - 1) << 36) | min(samples, (1 << 36) - 1)
    info = struct.pack(">HH", 4096, 4096) + _u24(0) + _u24(0) + packed.to_bytes(8, "big") + bytes(16)  # no MD5
    return b"fLaC" + bytes([0x80]) + _u24(len(info))[::-1] + info  # last block, type 0 (STREAMINFO)


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def mp4(width: int, height: int, frames: int, fps: float) -> bytes:
    """An MP4 (ISO BMFF) as a probe reads its header: ``ftyp`` and a ``moov`` whose ``mvhd`` gives the duration
    (1000 units a second) and whose ``tkhd`` gives width × height; no media data (the fake encodes no H.264)."""
    duration = round(frames * 1000.0 / fps) if fps > 0 else 0
    mvhd = bytes(4) + struct.pack(">IIII", 0, 0, 1000, duration) + struct.pack(">IH", 0x00010000, 0x0100) \
        + bytes(10) + struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000) + bytes(24) \
        + struct.pack(">I", 2)
    tkhd = bytes([0, 0, 0, 3]) + struct.pack(">IIIII", 0, 0, 1, 0, duration) + bytes(8) \
        + struct.pack(">hhhh", 0, 0, 0, 0) + struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000) \
        + struct.pack(">II", min(width, 0xFFFF) << 16, min(height, 0xFFFF) << 16)
    return _box(b"ftyp", b"isom" + struct.pack(">I", 512) + b"isomiso2mp41") \
        + _box(b"moov", _box(b"mvhd", mvhd) + _box(b"trak", _box(b"tkhd", tkhd)))
