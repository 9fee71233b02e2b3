"""Everything ComfyUI answers is untrusted input: this module checks each shape before the runner reads it.

ComfyUI is a large Python server full of custom nodes; any answer can be malformed, truncated, enormous or
deeply nested. A runner that reads ``entry["status"]["status_str"]`` from whatever came back dies of an
AttributeError on the first string where an object was expected, the supervisor counts the crash as a
quick failure, and one bad answer takes a GPU out of service. So every body and message passes through one
function here, which returns the same plain shape the runner already reads (dicts and lists whose types are
now guaranteed, unknown keys dropped) or raises :class:`Malformed` with what was wrong
(``/history entry: status is a str``). The client turns that into a transient, classified failure of the
attempt (kind ``malformed``), retried and counted like any other.

Pure functions, no I/O: the client reads bounded bytes, these judge them.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_ITEMS = 10_000
"""Lists longer than this (outputs of one node, queue entries, messages) are not a real server's answer."""
MAX_NUMBER = 2**53
"""Prompt numbers, progress values: JSON numbers a client can hold exactly."""
MAX_TEXT = 1 << 20
"""Strings ComfyUI sends about one prompt (a traceback, an exception message) are far below a MiB."""


class Malformed(ValueError):
    """ComfyUI answered something that is not the shape it documents; the text says what and where."""


def _no_constant(name: str) -> Any:
    raise Malformed(f"{name} is not a number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Malformed(f"{text[:40]} is not a finite number")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def decode(raw: bytes | str, what: str) -> Any:
    """JSON without NaN, Infinity or overflowing numbers; never a RecursionError."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
        return _DECODER.decode(text)
    except Malformed as exc:
        raise Malformed(f"{what}: {exc}") from None
    except RecursionError:
        raise Malformed(f"{what} is nested too deeply to be JSON of ComfyUI's") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(f"{what} is not JSON ({str(exc)[:80]})") from None


def _get(body: dict[str, Any], key: str, default: Any) -> Any:
    """``body[key]``, or ``default`` when the key is absent or null (never when it is "" or [])."""
    value = body.get(key)
    return default if value is None else value


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed(f"{where} is a {_type(value)}, not an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise Malformed(f"{where} is a {_type(value)}, not a list")
    if len(value) > MAX_ITEMS:
        raise Malformed(f"{where} has {len(value)} items")
    return value


def _str(value: Any, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise Malformed(f"{where} is a {_type(value)}, not a string")
    if len(value) > MAX_TEXT:
        raise Malformed(f"{where} is {len(value)} characters long")
    return value


def _int(value: Any, where: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_NUMBER <= value <= MAX_NUMBER:
        raise Malformed(f"{where} is {_type(value) if not isinstance(value, int) else 'out of range'}, "
                        "not a prompt number")
    return value


def _number(value: Any, where: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Malformed(f"{where} is a {_type(value)}, not a number")
    # An int is compared as it is: math.isfinite of a 400-digit int raises OverflowError.
    if not ((isinstance(value, int) or math.isfinite(value)) and -MAX_NUMBER <= value <= MAX_NUMBER):
        raise Malformed(f"{where} is out of range")
    return value


def _node_id(value: Any, where: str) -> str | None:
    """Node ids are strings ("3", "12:4" inside subgraphs); None means none (executing's end)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str(value, where)


# ---- POST /prompt, GET /queue ----------------------------------------------------------------------------

def prompt_number(body: Any) -> int:
    """The ``number`` of a 200 answer to POST /prompt."""
    number = _int(_obj(body, "POST /prompt's answer").get("number"), "POST /prompt's number")
    assert number is not None
    return number


def upload_answer(body: Any) -> tuple[str, str, str]:
    """POST /upload/image's 200 answer: ``{name, subfolder, type}`` (uploads.json), as (name, subfolder, type)."""
    body = _obj(body, "POST /upload/image's answer")
    out = []
    for key in ("name", "subfolder", "type"):
        value = body.get(key)
        if not isinstance(value, str) or len(value) > 4096:
            raise Malformed(f"POST /upload/image's answer: {key} is not a string of at most 4096 characters")
        out.append(value)
    return out[0], out[1], out[2]


def queue(body: Any) -> list[tuple[int, str, str | None, bool]]:
    """GET /queue as (number, prompt id, client id, running) for each entry, running ones first."""
    body = _obj(body, "/queue")
    out = []
    for key, running in (("queue_running", True), ("queue_pending", False)):
        for i, item in enumerate(_list(_get(body, key, []), f"/queue {key}")):
            where = f"/queue {key}[{i}]"
            item = _list(item, where)
            if len(item) < 2:
                raise Malformed(f"{where} has {len(item)} fields")
            number = _int(item[0], f"{where}'s number")
            prompt_id = _str(item[1], f"{where}'s prompt id")
            extra = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
            client = extra.get("client_id")
            out.append((number, prompt_id, client if isinstance(client, str) else None, running))
    return out  # type: ignore[return-value]


# ---- GET /history?max_items=N ---------------------------------------------------------------------------------

def history_numbers(body: Any) -> dict[str, int]:
    """GET /history (some entries) as each prompt id's number; nothing else of an entry is read."""
    body = _obj(body, "/history")
    if len(body) > MAX_ITEMS:
        raise Malformed(f"/history has {len(body)} entries")
    out = {}
    for prompt_id, entry in body.items():
        prompt = _list(_get(_obj(entry, "/history entry"), "prompt", None), "/history entry's prompt")
        if not prompt:
            raise Malformed("/history entry's prompt is empty")
        out[_str(prompt_id, "/history's prompt id")] = _int(prompt[0], "/history entry's number")
    return out  # type: ignore[return-value]


# ---- GET /history/{id} -------------------------------------------------------------------------------------

def history_entry(body: Any, prompt_id: str, *, max_files: int = MAX_ITEMS,
                  where: str = "/history entry") -> dict[str, Any] | None:
    """The entry of ``prompt_id`` in a /history/{id} answer, checked at every level the runner reads, or None
    while ComfyUI has not written it. Output items keep only filename, subfolder and type. ``where`` names the
    entry in what a Malformed says (one made of a run's messages is not a /history answer)."""
    body = _obj(body, "/history")
    if prompt_id not in body:
        return None
    entry = _obj(body[prompt_id], where)
    number = _entry_number(entry.get("prompt"), where)
    status = _obj(_get(entry, "status", {}), f"{where}'s status")
    status_str = _str(status.get("status_str"), f"{where}'s status_str", optional=True)
    messages = [_status_message(i, message, where)
                for i, message in enumerate(_list(_get(status, "messages", []), f"{where}'s status messages"))]
    files = _FileCount(max_files, where)
    outputs = {str(node_id): _node_outputs(node_id, _obj(node, f"{where}'s outputs of node {node_id}"), files, where)
               for node_id, node in _obj(_get(entry, "outputs", {}), f"{where}'s outputs").items()}
    return {"prompt": [number] if number is not None else [], "status": {"status_str": status_str,
                                                                          "messages": messages},
            "outputs": outputs}


def _entry_number(prompt: Any, where: str) -> int | None:
    """The prompt's number, the first field of the entry's ``prompt`` (None when the entry has none)."""
    if prompt is None:
        return None
    prompt = _list(prompt, f"{where}'s prompt")
    if not prompt:
        raise Malformed(f"{where}'s prompt is empty")
    return _int(prompt[0], f"{where}'s prompt number")


def _status_message(i: int, message: Any, where: str) -> list[Any]:
    """One ``[type, data]`` of the entry's status messages; an event's data checked as its message's is."""
    message = _list(message, f"{where}'s status message {i}")
    if len(message) != 2:
        raise Malformed(f"{where}'s status message {i} has {len(message)} fields, not 2")
    kind = _str(message[0], f"{where}'s status message {i}'s type")
    data = _obj(message[1], f"{where}'s status message {i} ({kind})")
    return [kind, _event_data(kind, data, f"{where}'s {kind}") if kind in _EVENTS else data]


class _FileCount:
    """The files an entry names so far; past ``limit`` ([store] max_files_per_job) the entry is Malformed."""

    def __init__(self, limit: int, where: str) -> None:
        self.limit, self.where, self.files = limit, where, 0

    def add(self) -> None:
        self.files += 1
        if self.files > self.limit:
            raise Malformed(f"{self.where} names more than {self.limit} files ([store] max_files_per_job)")


def _node_outputs(node_id: Any, node: dict[str, Any], files: _FileCount,
                  where: str) -> dict[str, list[dict[str, str]]]:
    """A node's outputs: each list of files, every item with filename, subfolder and type only. Other output
    kinds (text, booleans of custom nodes) and items that are not files are passed over."""
    kept: dict[str, list[dict[str, str]]] = {}
    for key, items in node.items():
        if not isinstance(items, list):
            continue
        checked = []
        for i, item in enumerate(_list(items, f"{where}'s node {node_id} {key}")):
            if not isinstance(item, dict) or "filename" not in item:
                continue
            what = f"{where}'s node {node_id} {key}[{i}]"
            checked.append({"filename": _str(item["filename"], f"{what} filename") or "",
                            "subfolder": _str(_get(item, "subfolder", ""), f"{what} subfolder") or "",
                            "type": _str(item.get("type", "output"), f"{what} type") or "output"})
            files.add()
        kept[key] = checked
    return kept


# ---- WebSocket messages -------------------------------------------------------------------------------------

_EVENTS = frozenset({"execution_start", "execution_cached", "executing", "executed", "progress",
                     "execution_success", "execution_error", "execution_interrupted"})
"""The events about one prompt that the runner reads; every other type (status aside) passes unread. ComfyUI's
``progress_state`` (every node's state, sent again at each step: a third of a trivial run's messages) passes
unread too: the trace is made of ``executing`` and ``progress``, which say the same."""


_READ_TYPES = frozenset({*_EVENTS, "status"})
_TYPE_FIRST = b'{"type": "'
"""How ComfyUI's ``send_json`` begins every message: ``json.dumps({"type": event, "data": data})``."""


def _unread_type(raw: str | bytes) -> bool:
    """True when ``raw`` plainly begins with a type the runner does not read: it is passed over unparsed (no
    JSON decoding of a ``progress_state``, a third of a trivial run's messages, or of a custom node's). Only a
    plain type (no escape in it) counts; anything else, and every message of a type read, is decoded whole."""
    if not isinstance(raw, bytes | bytearray) or not raw.startswith(_TYPE_FIRST):
        return False
    start = len(_TYPE_FIRST)
    end = raw.find(b'"', start, start + 128)
    if end < 0:
        return False
    kind = raw[start:end]
    return b"\\" not in kind and kind.decode("utf-8", "replace") not in _READ_TYPES


def ws_message(raw: str | bytes) -> dict[str, Any] | None:
    """A text frame as ``{"type": str, "data": dict}`` with the fields of its type checked; None for a type
    the runner does not read (ComfyUI 0.38 broadcasts ``assets.seed.*``; custom nodes send their own). A
    message of such a type is not parsed at all when its first bytes say so (``_unread_type``): what it holds,
    well formed or not, is never read."""
    if _unread_type(raw):
        return None
    message = _obj(decode(raw, "a WebSocket message"), "a WebSocket message")
    kind = _str(message.get("type"), "a WebSocket message's type")
    assert kind is not None
    if kind == "status":
        data = _obj(_get(message, "data", {}), "the status message's data")
        status = _obj(_get(data, "status", {}), "the status message's status")
        info = _obj(_get(status, "exec_info", {}), "the status message's exec_info")
        remaining = info.get("queue_remaining")
        remaining = _int(remaining, "queue_remaining", optional=True)
        return {"type": "status", "data": {"status": {"exec_info": {"queue_remaining": remaining}}}}
    if kind not in _EVENTS:
        return None
    data = _obj(message.get("data"), f"the {kind} message's data")
    return {"type": kind, "data": _event_data(kind, data, f"the {kind} message")}


PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA = 1, 4
"""ComfyUI's binary event types of a preview: a u32 (big-endian) image format (1 JPEG, 2 PNG) then the image; or,
for a client that sent ``feature_flags`` ``supports_preview_metadata``, a u32 length, that much JSON (the node,
the prompt, ``image_type``), then the image."""
_PREVIEW_FORMATS = {1: "image/jpeg", 2: "image/png"}
MAX_PREVIEW_BYTES = 512 * 1024
"""A larger preview is passed over (a sampler's latent preview is a few to a few hundred KiB)."""


def ws_preview(raw: bytes) -> dict[str, Any] | None:
    """A binary frame as ``{"type": "preview", "data": {"prompt_id", "node_id", "content_type", "image"}}`` (the ids
    None when the legacy frame has none); None for any other binary frame, a malformed one, an image that is not
    a JPEG, PNG or WebP, or one larger than MAX_PREVIEW_BYTES: a preview is a nicety, never a reason to fail."""
    if len(raw) < 8 or len(raw) > MAX_PREVIEW_BYTES + 4096:
        return None
    event, word = int.from_bytes(raw[:4], "big"), int.from_bytes(raw[4:8], "big")
    if event == PREVIEW_IMAGE:
        data = {"prompt_id": None, "node_id": None, "content_type": _PREVIEW_FORMATS.get(word), "image": raw[8:]}
    elif event == PREVIEW_IMAGE_WITH_METADATA and 8 + word <= len(raw) and word <= 4096:
        data = _preview_with_metadata(raw, word)
    else:
        return None
    image = data and data["image"]
    if not image or data["content_type"] not in ("image/jpeg", "image/png", "image/webp") or \
            len(image) > MAX_PREVIEW_BYTES:
        return None
    return {"type": "preview", "data": {**data, "image": bytes(image)}}


def _preview_with_metadata(raw: bytes, length: int) -> dict[str, Any] | None:
    """A preview frame whose ``length`` bytes of JSON name the prompt, the node and the image's type; None when
    that JSON is not an object."""
    try:
        meta = json.loads(raw[8:8 + length])
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    prompt_id, node_id = meta.get("prompt_id"), meta.get("display_node_id") or meta.get("node_id")
    return {"prompt_id": prompt_id if isinstance(prompt_id, str) else None,
            "node_id": str(node_id)[:64] if isinstance(node_id, str | int) and not isinstance(node_id, bool) else None,
            "content_type": meta.get("image_type"), "image": raw[8 + length:]}


def _event_data(kind: str, data: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields of one event that the runner and its trace read, each of the type they expect."""
    out: dict[str, Any] = {"prompt_id": _str(data.get("prompt_id"), f"{where}'s prompt_id", optional=True)}
    if "timestamp" in data:
        out["timestamp"] = _number(data["timestamp"], f"{where}'s timestamp")
    if kind == "execution_cached":
        out["nodes"] = [_node_id(n, f"{where}'s nodes") for n in _list(_get(data, "nodes", []), f"{where}'s nodes")]
    elif kind in ("executing", "executed", "progress"):
        out["node"] = _node_id(data.get("node"), f"{where}'s node")
        if "display_node" in data:
            out["display_node"] = _node_id(data["display_node"], f"{where}'s display_node")
    if kind == "progress":
        out["value"] = _number(data.get("value"), f"{where}'s value")
        out["max"] = _number(data.get("max"), f"{where}'s max")
    elif kind == "executed" and "output" in data:
        out["output"] = _obj(_get(data, "output", {}), f"{where}'s output")
    elif kind in ("execution_error", "execution_interrupted"):
        out["node_id"] = _node_id(data.get("node_id"), f"{where}'s node_id")
        out["node_type"] = _str(data.get("node_type"), f"{where}'s node_type", optional=True)
        if kind == "execution_error":
            out["exception_type"] = _str(_get(data, "exception_type", ""), f"{where}'s exception_type")
            out["exception_message"] = _str(_get(data, "exception_message", ""), f"{where}'s exception_message")
            out["traceback"] = [_str(line, f"{where}'s traceback") for line in
                                _list(_get(data, "traceback", []), f"{where}'s traceback")]
    return out


# ---- GET /system_stats, GET /object_info --------------------------------------------------------------------

def system_stats(body: Any) -> dict[str, Any]:
    """``system`` (versions, RAM) and ``devices`` (name, type, index, VRAM) with the types health reads."""
    body = _obj(body, "/system_stats")
    system = _obj(_get(body, "system", {}), "/system_stats system")
    devices = []
    for i, device in enumerate(_list(_get(body, "devices", []), "/system_stats devices")):
        device = _obj(device, f"/system_stats device {i}")
        clean: dict[str, Any] = {}
        for key in ("name", "type"):
            if key in device:
                clean[key] = _str(device[key], f"/system_stats device {i} {key}", optional=True)
        for key in ("index", "vram_total", "vram_free", "torch_vram_total", "torch_vram_free"):
            if device.get(key) is not None:
                clean[key] = _number(device[key], f"/system_stats device {i} {key}")
        devices.append(clean)
    clean_system: dict[str, Any] = {}
    for key in ("os", "comfyui_version", "python_version", "pytorch_version", "embedded_python"):
        if key in system:
            value = system[key]
            clean_system[key] = value if isinstance(value, bool) else _str(value, f"/system_stats {key}",
                                                                            optional=True)
    for key in ("ram_total", "ram_free"):
        if system.get(key) is not None:
            clean_system[key] = _number(system[key], f"/system_stats {key}")
    return {"system": clean_system, "devices": devices}


def object_info(body: Any) -> dict[str, dict[str, Any]]:
    """Node classes by name, each an object whose ``input`` and its ``required``/``optional`` sections are
    objects where present (what the catalogue check reads); anything else is malformed."""
    body = _obj(body, "/object_info")
    return {str(name): _node_class(info, f"/object_info {str(name)[:80]}") for name, info in body.items()}


def _node_class(info: Any, where: str) -> dict[str, Any]:
    """A class whose ``input`` or section is there and not an object (null included: ComfyUI leaves out what a
    class lacks, and the submit side's ``ObjectInfo`` reads them with ``.get(key, {})``) is malformed."""
    info = _obj(info, where)
    if "input" in info:
        inputs = _obj(info["input"], f"{where}.input")
        for section in ("required", "optional"):
            if section in inputs:
                _obj(inputs[section], f"{where}.input.{section}")
    return info
