"""The workflows ComfyUI writes into the images it saves: ``prompt`` (API format) and ``workflow`` (UI format).

PNG (SaveImage, PreviewImage): text chunks keyed ``prompt`` and ``workflow`` (tEXt; iTXt or zTXt when written
so), before or after the image data. Animated WEBP (SaveAnimatedWEBP): the EXIF chunk's first IFD holds
``prompt:<json>`` in tag 0x0110 (Model) and ``workflow:<json>`` in 0x010F (Make), the extra_pnginfo keys
counting down from there. Only the metadata is read: the image data is skipped, never decoded, and every
read is bounded, since an image is a file from anywhere.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import IO, Any, NamedTuple

from comfysup.workflows.errors import UIWorkflowError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_TEXT_BYTES = 32 << 20
"""One metadata chunk at most (compressed or not): a large UI workflow is a few megabytes."""
MAX_CHUNKS = 100_000
_KEYS = ("prompt", "workflow")


class ImageWorkflows(NamedTuple):
    """What an image carries: the API prompt and the UI workflow it was made with (None where absent)."""

    prompt: dict[str, Any] | None
    workflow: dict[str, Any] | None


def read(path: str | Path) -> ImageWorkflows:
    """The workflows in a PNG or WEBP file; raises UIWorkflowError for other files or unreadable metadata."""
    with open(path, "rb") as file:
        return read_from(file, str(path))


def read_from(file: IO[bytes], name: str = "the image") -> ImageWorkflows:
    head = file.read(12)
    if head[:8] == PNG_SIGNATURE:
        file.seek(8)
        texts = _png_texts(file, name)
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        texts = _webp_texts(file, name)
    else:
        raise UIWorkflowError([f"{name}: not a PNG or WEBP image"])
    return ImageWorkflows(_json(texts.get("prompt"), name, "prompt"), _json(texts.get("workflow"), name, "workflow"))


def _json(text: str | None, name: str, key: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UIWorkflowError([f"{name}: its {key!r} metadata is not JSON ({error})"]) from None
    return value if isinstance(value, dict) else None


def _bounded(file: IO[bytes], length: int, name: str) -> bytes:
    if length > MAX_TEXT_BYTES:
        raise UIWorkflowError([f"{name}: a metadata chunk of {length} bytes (at most {MAX_TEXT_BYTES})"])
    data = file.read(length)
    if len(data) != length:
        raise UIWorkflowError([f"{name}: the file ends inside a chunk"])
    return data


def _inflate(data: bytes, name: str) -> bytes:
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, MAX_TEXT_BYTES)
    if inflater.unconsumed_tail:
        raise UIWorkflowError([f"{name}: a compressed text chunk inflates past {MAX_TEXT_BYTES} bytes"])
    return out


def _text_chunk(kind: bytes, data: bytes, name: str) -> tuple[str, str] | None:
    """(keyword, text) of a tEXt, zTXt or iTXt chunk."""
    keyword, _, rest = data.partition(b"\0")
    key = keyword.decode("latin-1")
    if key not in _KEYS:
        return None
    if kind == b"tEXt":
        return key, rest.decode("latin-1")
    if kind == b"zTXt":
        return key, _inflate(rest[1:], name).decode("latin-1")
    compressed = rest[:1] == b"\1"
    _language, _, rest = rest[2:].partition(b"\0")
    _translated, _, text = rest.partition(b"\0")
    return key, (_inflate(text, name) if compressed else text).decode("utf-8", "replace")


def _png_texts(file: IO[bytes], name: str) -> dict[str, str]:
    texts: dict[str, str] = {}
    for _ in range(MAX_CHUNKS):
        header = file.read(8)
        if len(header) < 8:
            return texts
        length, kind = struct.unpack(">I4s", header)
        if kind == b"IEND":
            return texts
        if kind in (b"tEXt", b"zTXt", b"iTXt"):
            found = _text_chunk(kind, _bounded(file, length, name), name)
            if found:
                texts.setdefault(*found)
            file.seek(4, 1)
        else:
            file.seek(length + 4, 1)
    raise UIWorkflowError([f"{name}: more than {MAX_CHUNKS} PNG chunks"])


def _webp_texts(file: IO[bytes], name: str) -> dict[str, str]:
    for _ in range(MAX_CHUNKS):
        header = file.read(8)
        if len(header) < 8:
            return {}
        kind, length = struct.unpack("<4sI", header)
        if kind == b"EXIF":
            return _exif_texts(_bounded(file, length, name))
        file.seek(length + (length & 1), 1)
    raise UIWorkflowError([f"{name}: more than {MAX_CHUNKS} WEBP chunks"])


def _exif_texts(exif: bytes) -> dict[str, str]:
    """The ``key:value`` ASCII entries of the first IFD whose key is prompt or workflow."""
    if exif.startswith(b"Exif\0\0"):
        exif = exif[6:]
    order = {b"II": "<", b"MM": ">"}.get(exif[:2])
    if order is None or len(exif) < 8:
        return {}
    (first,) = struct.unpack(order + "I", exif[4:8])
    if first + 2 > len(exif):
        return {}
    (count,) = struct.unpack(order + "H", exif[first:first + 2])
    texts = {}
    for index in range(count):
        entry = exif[first + 2 + 12 * index:first + 14 + 12 * index]
        if len(entry) < 12:
            break
        _tag, kind, size, offset = struct.unpack(order + "HHII", entry)
        if kind != 2:
            continue
        raw = entry[8:8 + size] if size <= 4 else exif[offset:offset + size]
        key, _, value = raw.rstrip(b"\0").decode("utf-8", "replace").partition(":")
        if key in _KEYS:
            texts.setdefault(key, value)
    return texts
