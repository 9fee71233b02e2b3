"""Real image files without PIL: solid-colour PNGs for SaveImage/PreviewImage and a JPEG for previews.

Tests download what the fake writes and hash it, so the files must be real, decodable images; the
pixels themselves do not matter, which is why every image is one solid colour (they compress to a
few hundred bytes, like the recorded 64x64 ones).
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff\xe0"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(
    width: int, height: int, rgb: tuple[int, int, int], text: dict[str, str] | None = None
) -> bytes:
    """An 8-bit RGB PNG of one colour; `text` becomes tEXt chunks, as ComfyUI stores the prompt there."""
    return png_raw(width, height, (b"\x00" + bytes(rgb) * width) * height, text)


@dataclass(frozen=True)
class Raster:
    """A batch of images as grids of coloured cells stretched over width × height pixels (nearest neighbour):
    what the fake's VAEDecode makes of a latent (one cell per latent pixel, 8 × 8 image pixels). Scaling
    changes the size and keeps the cells, so an upscaled image is the same picture, bigger."""

    width: int
    height: int
    grid: tuple[int, int]
    """Cells across and down."""
    frames: tuple[bytes, ...]
    """One per image of the batch: grid[0] × grid[1] RGB cells, row by row."""

    @property
    def batch(self) -> int:
        return len(self.frames)

    def resized(self, width: int, height: int) -> Raster:
        return Raster(max(1, width), max(1, height), self.grid, self.frames)

    def scanlines(self, index: int) -> bytes:
        """Image ``index`` as PNG scanlines (filter byte 0, then RGB)."""
        (across, down), cells, width = self.grid, self.frames[index], self.width
        spans = [0] * across
        for x in range(width):
            spans[x * across // width] += 1
        rows = [b"\x00" + b"".join(cells[(r * across + c) * 3:(r * across + c) * 3 + 3] * n
                                   for c, n in enumerate(spans) if n) for r in range(down)]
        return b"".join(rows[y * down // self.height] for y in range(self.height))

    def png(self, index: int, text: dict[str, str] | None = None) -> bytes:
        return png_raw(self.width, self.height, self.scanlines(index), text)

    def mean(self, index: int) -> tuple[int, int, int]:
        """The average colour of image ``index`` (what a format the fake cannot draw cells in shows)."""
        cells = self.frames[index]
        count = max(len(cells) // 3, 1)
        return (sum(cells[0::3]) // count, sum(cells[1::3]) // count, sum(cells[2::3]) // count)


def png_raw(width: int, height: int, scanlines: bytes, text: dict[str, str] | None = None) -> bytes:
    """An 8-bit RGB PNG of these scanlines; `text` becomes tEXt chunks."""
    chunks = [_png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))]
    for key, value in (text or {}).items():
        chunks.append(
            _png_chunk(b"tEXt", key.encode("latin-1") + b"\x00" + value.encode("latin-1", "replace"))
        )
    chunks.append(_png_chunk(b"IDAT", zlib.compress(scanlines, 4)))
    chunks.append(_png_chunk(b"IEND", b""))
    return PNG_MAGIC + b"".join(chunks)


class _BitWriter:
    """Entropy-coded JPEG data: MSB first, 0xFF bytes stuffed with 0x00, padded with 1 bits."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def write(self, value: int, length: int) -> None:
        for i in range(length - 1, -1, -1):
            self.acc = (self.acc << 1) | ((value >> i) & 1)
            self.n += 1
            if self.n == 8:
                self.out.append(self.acc)
                if self.acc == 0xFF:
                    self.out.append(0)
                self.acc, self.n = 0, 0

    def flush(self) -> bytes:
        if self.n:
            self.write((1 << (8 - self.n)) - 1, 8 - self.n)
        return bytes(self.out)


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">HH", marker, len(payload) + 2) + payload


def _category(diff: int) -> int:
    return abs(diff).bit_length()


def jpeg_bytes(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A baseline JFIF JPEG of one colour, like the previews a sampler sends.

    A solid block has only a DC coefficient, so the encoder needs no DCT: one DC difference per
    component in the first block, zero afterwards, and an end-of-block code for the AC part.
    """
    r, g, b = rgb
    ycc = (
        round(0.299 * r + 0.587 * g + 0.114 * b),
        round(128 - 0.168736 * r - 0.331264 * g + 0.5 * b),
        round(128 + 0.5 * r - 0.418688 * g - 0.081312 * b),
    )
    first_dc = [8 * (max(0, min(255, c)) - 128) for c in ycc]
    symbols = sorted({0, *(_category(d) for d in first_dc)})
    dc_code = {sym: i for i, sym in enumerate(symbols)}  # canonical codes, all 3 bits long
    dc_counts = bytes([0, 0, len(symbols)] + [0] * 13)
    ac_counts = bytes([0, 1] + [0] * 14)  # one symbol: end of block, code 00
    bits = _BitWriter()
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    for block in range(blocks):
        for comp in range(3):
            diff = first_dc[comp] if block == 0 else 0
            cat = _category(diff)
            bits.write(dc_code[cat], 3)
            if cat:
                bits.write(diff if diff > 0 else diff + (1 << cat) - 1, cat)
            bits.write(0, 2)
    parts = [
        b"\xff\xd8",
        _segment(0xFFE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"),
        _segment(0xFFDB, b"\x00" + b"\x01" * 64),
        _segment(0xFFC0, struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00"),
        _segment(0xFFC4, b"\x00" + dc_counts + bytes(symbols) + b"\x10" + ac_counts + b"\x00"),
        _segment(0xFFDA, b"\x03\x01\x00\x02\x00\x03\x00\x00\x3f\x00"),
        bits.flush(),
        b"\xff\xd9",
    ]
    return b"".join(parts)


def _expand_vars(prefix: str, width: int, height: int) -> str:
    """ComfyUI's %width%/%year%/... substitutions in a filename prefix."""
    now = time.localtime()
    for name, value in (
        ("width", width),
        ("height", height),
        ("year", now.tm_year),
        ("month", f"{now.tm_mon:02}"),
        ("day", f"{now.tm_mday:02}"),
        ("hour", f"{now.tm_hour:02}"),
        ("minute", f"{now.tm_min:02}"),
        ("second", f"{now.tm_sec:02}"),
    ):
        prefix = prefix.replace(f"%{name}%", str(value))
    return prefix


class OutsideOutputFolder(Exception):
    """A filename prefix that would save outside the output folder; ComfyUI raises a plain Exception."""


def save_image_path(
    prefix: str, output_dir: Path, width: int = 0, height: int = 0
) -> tuple[Path, str, int, str]:
    """ComfyUI's folder_paths.get_save_image_path: (folder, file stem, next counter, subfolder).

    The counter continues from the highest `<stem>_NNNNN_` already on disk, so names keep counting up
    across restarts exactly like the real server's do.
    """
    if "%" in prefix:
        prefix = _expand_vars(prefix, width, height)
    normalized = os.path.normpath(prefix)
    subfolder = os.path.dirname(normalized)
    stem = os.path.basename(normalized)
    out = str(output_dir)
    folder = os.path.join(out, subfolder)
    if os.path.commonpath((out, os.path.abspath(folder))) != out:
        raise OutsideOutputFolder(
            "**** ERROR: Saving image outside the output folder is not allowed."
            f"\n full_output_folder: {os.path.abspath(folder)}"
            f"\n         output_dir: {out}"
            f"\n         commonpath: {os.path.commonpath((out, os.path.abspath(folder)))}"
        )
    try:
        counter = max(_existing_counters(os.listdir(folder), stem), default=0) + 1
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        counter = 1
    return Path(folder), stem, counter, subfolder


def _existing_counters(names: list[str], stem: str) -> list[int]:
    prefix_len = len(stem)
    found = []
    for name in names:
        head = name[: prefix_len + 1]
        if os.path.normcase(head[:-1]) != os.path.normcase(stem) or head[-1:] != "_":
            continue
        try:
            found.append(int(name[prefix_len + 1 :].split("_")[0]))
        except ValueError:
            found.append(0)
    return found
