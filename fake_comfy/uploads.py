"""Input files, as ComfyUI 0.3.64 handles them (tests/recorded/uploads.json): POST /upload/image and
/upload/mask (a mask composited into the alpha of an existing image), and the
LoadImage / LoadImageMask nodes reading real files with the pixel arithmetic of ComfyUI's tensors.

Upload: multipart with an ``image`` file part and optional ``type`` (input, temp, output; anything else is a
500), ``subfolder`` and ``overwrite`` (only ``true`` or ``1``). A name already taken by other bytes becomes
``stem (1).ext``, ``stem (2).ext``, …; a name holding identical bytes is returned and nothing is written.
Traversal out of the type's folder is a 400. The answer is ``{name, subfolder, type}``.

Pixels: ComfyUI loads an image as float32 ``v / 255``, ImageInvert computes ``1.0 - x``, SaveImage writes
``uint8(clip(255 * x))``, which truncates, so an inverted ``v`` is ``uint8(trunc(255·(1 − float32(v)/255)))``,
most often ``254 - v``. Float32 is emulated by rounding each step's double through ``struct`` (a single
operation on float32 operands computed in double and rounded once is exactly IEEE float32's result).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from fake_comfy.images import PNG_MAGIC, _png_chunk

LOADERS = ("LoadImage", "LoadImageMask")
LOAD_IMAGE_MASK_INFO: dict[str, Any] = {
    "input": {"required": {"image": [[], {"image_upload": True}], "channel": [["alpha", "red", "green", "blue"]]}},
    "input_order": {"required": ["image", "channel"]}, "output": ["MASK"], "output_is_list": [False],
    "output_name": ["MASK"], "name": "LoadImageMask", "display_name": "Load Image (as Mask)", "description": "",
    "python_module": "nodes", "category": "mask", "output_node": False,
}
"""As recorded (uploads.json object_info); its choices are every top-level file of the input folder."""


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


_LOAD = [f32(f32(float(v)) / f32(255.0)) for v in range(256)]
"""LoadImage: uint8 → float32 v/255."""


def to_uint8(x: float) -> int:
    """SaveImage: clip(255 * x) as float32, then astype(uint8), which truncates."""
    return int(min(255.0, max(0.0, f32(255.0 * x))))


@dataclass(frozen=True)
class Pixels:
    """An image (or mask, channels=1) as ComfyUI's float32 tensor would hold it, one value per channel."""

    width: int
    height: int
    channels: int
    data: tuple[float, ...]

    def invert(self) -> Pixels:
        return Pixels(self.width, self.height, self.channels, tuple(f32(1.0 - x) for x in self.data))

    def as_rgb(self) -> Pixels:
        if self.channels == 3:
            return self
        return Pixels(self.width, self.height, 3, tuple(x for x in self.data for _ in range(3)))

    def png(self, text: dict[str, str] | None = None) -> bytes:
        rgb = self.as_rgb()
        values = bytes(to_uint8(x) for x in rgb.data)
        row = rgb.width * 3
        raw = b"".join(b"\x00" + values[y * row:(y + 1) * row] for y in range(rgb.height))
        chunks = [_png_chunk(b"IHDR", struct.pack(">IIBBBBB", rgb.width, rgb.height, 8, 2, 0, 0, 0))]
        for key, value in (text or {}).items():
            chunks.append(_png_chunk(b"tEXt", key.encode("latin-1") + b"\x00" + value.encode("latin-1", "replace")))
        chunks += [_png_chunk(b"IDAT", zlib.compress(raw, 4)), _png_chunk(b"IEND", b"")]
        return PNG_MAGIC + b"".join(chunks)


class NotAnImage(Exception):
    """PIL.UnidentifiedImageError, as LoadImage raises it for bytes that are not an image."""


def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, 8-bit samples) of a non-interlaced 8-bit gray/RGB/RGBA PNG (what PIL writes).

    Damaged files fail as PIL fails on them: a wrong chunk checksum (IDAT's aside) raises NotAnImage, a broken
    or short image stream OSError."""
    if not data.startswith(PNG_MAGIC):
        raise NotAnImage("cannot identify image file")
    header, idat = _chunks(data)
    width, height, depth, color, _c, _f, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace:
        raise NotAnImage(f"fake_comfy reads 8-bit gray/RGB/RGBA PNGs only (depth {depth}, colour {color})")
    try:
        raw, stride = zlib.decompress(b"".join(idat)), width * channels
    except zlib.error:
        raise OSError("broken data stream when reading image file") from None  # PIL's words for it
    if len(raw) < height * (stride + 1):
        raise OSError("image file is truncated")
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        _unfilter(raw[y * (stride + 1)], line, prev, channels)
        out += line
        prev = line
    return width, height, channels, bytes(out)


def _chunks(data: bytes) -> tuple[tuple[int, ...], list[bytes]]:
    """The IHDR fields and the IDAT bodies of a PNG, every other chunk's checksum checked as PIL checks them."""
    pos, idat, header = 8, [], None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind != b"IDAT" and data[pos + 8 + length:pos + 12 + length] != struct.pack(">I", zlib.crc32(kind + body)):
            raise NotAnImage("cannot identify image file")  # PIL checks every chunk but IDAT's CRC as it opens
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    if header is None:
        raise NotAnImage("cannot identify image file")
    return header, idat


def _unfilter(kind: int, line: bytearray, prev: bytearray, channels: int) -> None:
    """Undo a scanline's PNG filter (``kind``: 0 none, 1 Sub, 2 Up, 3 Average, 4 Paeth) in place, ``prev`` being
    the line above, already unfiltered."""
    for i in range(len(line)):
        a = line[i - channels] if i >= channels else 0
        b, c = prev[i], prev[i - channels] if i >= channels else 0
        if kind == 1:
            line[i] = (line[i] + a) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + b) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (a + b) // 2) & 0xFF
        elif kind == 4:
            line[i] = (line[i] + _paeth(a, b, c)) & 0xFF


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def load(path: Path, class_type: str, channel: str = "alpha") -> Pixels:
    """LoadImage's IMAGE (RGB) or LoadImageMask's MASK for ``channel`` (alpha inverted, as ComfyUI does)."""
    width, height, channels, samples = decode_png(path.read_bytes())
    pixels = [samples[i:i + channels] for i in range(0, len(samples), channels)]
    if class_type == "LoadImage":
        rgb = [(p[0],) * 3 if channels < 3 else tuple(p[:3]) for p in pixels]
        return Pixels(width, height, 3, tuple(_LOAD[v] for p in rgb for v in p))
    index = {"red": 0, "green": 1, "blue": 2, "alpha": 3}[channel]
    if channels in (1, 2):
        index = 0 if index < 3 else 1
    if index >= channels:  # no such channel: ComfyUI gives a zero mask of 64x64
        return Pixels(64, 64, 1, (0.0,) * 64 * 64)
    values = tuple(_LOAD[p[index]] for p in pixels)
    if channel == "alpha":
        values = tuple(f32(1.0 - x) for x in values)
    return Pixels(width, height, 1, values)


def loaded_path(name: str, input_dir: Path, directory_for_type: Any) -> Path | None:
    """folder_paths.get_annotated_filepath: ``sub/name.png``, ``name.png [temp]``; None when it does not exist."""
    folder = input_dir
    for kind in ("input", "temp", "output"):
        if name.endswith(f" [{kind}]"):
            name, folder = name[: -len(kind) - 3], directory_for_type(kind)
    path = Path(os.path.join(folder, name))
    return path if path.is_file() else None


def file_sha256(path: Path) -> str:
    """LoadImage's IS_CHANGED: the file's content, so new bytes under an old name are run again."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- POST /upload/image -----------------------------------------------------------------------------------


async def upload_image(request: web.Request, directory_for_type: Any) -> web.Response:
    """ComfyUI's image_upload handler (server.py), with its 400s and 500s as recorded."""
    if not (request.content_type or "").startswith("multipart/"):
        return web.Response(status=400)
    return _receive(await request.post(), directory_for_type, _write_bytes)


async def upload_mask(request: web.Request, directory_for_type: Any) -> web.Response:
    """ComfyUI's upload_mask: the image named by the form's ``original_ref`` ({filename, subfolder, type},
    type ``output`` when absent), made RGBA with its alpha replaced by the uploaded image's alpha, written under
    the uploaded name (text chunks of the original kept). As recorded: an original that is missing or whose
    name has ``..`` still answers 200 with the name and writes nothing; no ``original_ref`` is a 500; the
    same mask again is renamed (the names are compared with the composite on disk, not the mask)."""
    if not (request.content_type or "").startswith("multipart/"):
        return web.Response(status=400)
    post = await request.post()

    def composite(data: bytes, filepath: str) -> None:
        ref = json.loads(post.get("original_ref"))  # type: ignore[arg-type]  # None: a TypeError, a 500
        name = str(ref["filename"])
        folder = None
        for kind in ("input", "temp", "output"):  # folder_paths.annotated_filepath
            if name.endswith(f" [{kind}]"):
                name, folder = name[: -len(kind) - 3], directory_for_type(kind)
        if not name or name.startswith("/") or ".." in name:
            return
        folder = folder or directory_for_type(ref.get("type", "output"))
        if folder is None:
            return
        folder = os.path.abspath(folder)
        if ref.get("subfolder", ""):
            inner = os.path.join(folder, ref["subfolder"])
            if os.path.commonpath((os.path.abspath(inner), folder)) != folder:
                return
            folder = inner
        original = Path(folder) / name
        if not original.is_file():
            return
        source = original.read_bytes()
        width, height, channels, samples = decode_png(source)
        _mw, _mh, mask_channels, mask = decode_png(data)
        rgba = bytearray()
        for i in range(width * height):
            pixel = samples[i * channels:(i + 1) * channels]
            rgb = bytes(pixel[:1] * 3) if channels < 3 else bytes(pixel[:3])
            alpha = mask[i * mask_channels + mask_channels - 1] if mask_channels in (2, 4) else 255
            rgba += rgb + bytes((alpha,))
        Path(filepath).write_bytes(rgba_png(width, height, bytes(rgba), text_chunks(source)))

    return _receive(post, directory_for_type, composite)


def _write_bytes(data: bytes, filepath: str) -> None:
    with open(filepath, "wb") as f:
        f.write(data)


def _receive(post: Any, directory_for_type: Any, save: Any) -> web.Response:
    """image_upload's shared part: the form's checks, the name (renamed on a collision), then ``save``."""
    image = post.get("image")
    overwrite = post.get("overwrite")
    kind = post.get("type") or "input"
    upload_dir = directory_for_type(kind) if isinstance(kind, str) else None
    if upload_dir is None:
        raise UnboundLocalError("cannot access local variable 'type_dir' where it is not associated with a value")
    if not image:
        return web.Response(status=400)
    data = image.file.read()  # a plain field (str, bytearray) has no .file: a 500, as ComfyUI answers
    filename = image.filename
    if not filename:
        return web.Response(status=400)
    subfolder = str(post.get("subfolder", ""))
    base = os.path.abspath(upload_dir)
    folder = os.path.join(base, os.path.normpath(subfolder))
    filepath = os.path.abspath(os.path.join(folder, filename))
    if os.path.commonpath((base, filepath)) != base:
        return web.Response(status=400)
    os.makedirs(folder, exist_ok=True)
    stem, ext = os.path.splitext(filename)
    duplicate = False
    if overwrite not in ("true", "1"):
        i = 1
        while os.path.exists(filepath):
            if _same_bytes(filepath, data):
                duplicate = True
                break
            filename = f"{stem} ({i}){ext}"
            filepath = os.path.join(folder, filename)
            i += 1
    if not duplicate:
        save(data, filepath)
    return web.json_response({"name": filename, "subfolder": subfolder, "type": kind})


def text_chunks(data: bytes) -> dict[str, str]:
    """A PNG's tEXt chunks (PIL's ``.text``), which upload_mask carries over to the composite."""
    out, pos = {}, len(PNG_MAGIC)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\x00")
            out[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    return out


def rgba_png(width: int, height: int, rgba: bytes, text: dict[str, str]) -> bytes:
    """An 8-bit RGBA PNG (compress level 4, as upload_mask saves), with ``text`` as tEXt chunks."""
    row = width * 4
    raw = b"".join(b"\x00" + rgba[y * row:(y + 1) * row] for y in range(height))
    chunks = [_png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))]
    chunks += [_png_chunk(b"tEXt", k.encode("latin-1") + b"\x00" + v.encode("latin-1")) for k, v in text.items()]
    chunks += [_png_chunk(b"IDAT", zlib.compress(raw, 4)), _png_chunk(b"IEND", b"")]
    return PNG_MAGIC + b"".join(chunks)


def _same_bytes(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    except OSError:
        return False
