"""The rest of the hostile catalogue: broken bodies, huge and deep values, control characters,
numbers that break clients, garbage WebSocket frames, hostile file names and /view bodies.

Registered into hostile_kit.CATALOGUE on import (fake_comfy.hostile imports this module, so its CATALOGUE is whole).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from .hostile_kit import (
    CONTROL,
    DEPTH,
    HUGE_LIST,
    HUGE_STRING,
    JSON_ANSWERS,
    NUMBER_TOKENS,
    TRICKLE,
    Raw,
    _mangle,
    noise,
    raw_json,
    register,
)

# Per answer: where a huge string, a huge list, control characters and breaking numbers go.
HUGE_STRING_AT = {"post": "prompt_id", "history": "@.status.status_str", "queue": "queue_pending",
                  "system_stats": "devices.*.name", "object_info": "EmptyImage.display_name"}
HUGE_LIST_AT = {"post": "node_errors", "history": "@.status.messages", "queue": "queue_pending",
                "system_stats": "devices", "object_info": "EmptyImage.output"}
CONTROL_AT = {"post": ["prompt_id"], "history": ["@.status.status_str", "@.status.messages.*.0",
                                                 "@.outputs.*.images.*.filename", "@.outputs.*.images.*.subfolder"],
              "queue": ["queue_pending.*.1"], "system_stats": ["devices.*.name", "system.comfyui_version"],
              "object_info": ["*.name", "*.display_name"]}
NUMBERS_AT = {"post": ["number"], "history": ["@.status.messages.*.1.timestamp", "@.prompt.0"],
              "queue": ["queue_pending.*.0", "queue_running.*.0"],
              "system_stats": ["system.ram_free", "devices.*.vram_free", "devices.*.vram_total"],
              "object_info": ["*.input.required.*.1.max"]}
ERROR_PAGE = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>\n"


def _json_bytes(body: Any) -> bytes:
    return json.dumps(body).encode()


def _deep(prefix: bytes = b"", suffix: bytes = b"") -> bytes:
    """DEPTH levels of arrays, built as bytes (the fake must not recurse to make them either)."""
    return prefix + b"[" * DEPTH + b"]" * DEPTH + suffix


def _body_mutations(where: str) -> None:
    """truncated, cut, not-json, content-type, deep, trickle, endless, huge-*, control, numbers=*."""

    def truncated(body: Any, prompt_id: str) -> Raw:
        text = _json_bytes(body)
        return Raw(text[: max(1, len(text) // 2)])

    def cut(body: Any, prompt_id: str) -> Raw:
        text = _json_bytes(body)
        return Raw(text[: max(1, len(text) // 2)], length=len(text), abort=True)

    def not_json(body: Any, prompt_id: str) -> Raw:
        return Raw(ERROR_PAGE)

    def content_type(body: Any, prompt_id: str) -> Raw:
        return Raw(_json_bytes(body), content_type="text/html; charset=utf-8")

    def deep(body: Any, prompt_id: str) -> Raw:
        if where == "history":
            return Raw(_deep(b"{" + json.dumps(prompt_id).encode() + b": ", b"}"))
        return Raw(_deep())

    def trickle(body: Any, prompt_id: str) -> Raw:
        text = _json_bytes(body)
        return Raw(text, length=len(text), pause_s=TRICKLE, chunk=1)

    def endless(body: Any, prompt_id: str) -> Raw:
        return Raw(b'{"' + prompt_id.encode() + b'": {"status": {"messages": [', tail=b'["x", {}], ' * 1024,
                   endless=True)

    def huge_string(body: Any, prompt_id: str) -> Any:
        return _mangle(body, HUGE_STRING_AT[where], prompt_id, lambda _old: "x" * HUGE_STRING)

    def huge_list(body: Any, prompt_id: str) -> Any:
        return _mangle(body, HUGE_LIST_AT[where], prompt_id, lambda _old: [0] * HUGE_LIST)

    def control(body: Any, prompt_id: str) -> Any:
        for path in CONTROL_AT[where]:
            body = _mangle(body, path, prompt_id, lambda old: f"{old}{CONTROL}")
        return body

    register(f"{where}:truncated", "the body cut mid-JSON (Content-Length honest)")(truncated)
    register(f"{where}:cut", "Content-Length of the whole body, half of it sent, connection dropped")(cut)
    register(f"{where}:not-json", "an HTML 502 page served as application/json")(not_json)
    register(f"{where}:content-type", "the right JSON served as text/html")(content_type)
    register(f"{where}:deep", f"{DEPTH:,} levels of nested arrays")(deep)
    register(f"{where}:trickle", "the right body, one byte per trickle interval, dropped at the cap")(trickle)
    register(f"{where}:endless", "a JSON body that never ends (chunked), dropped at the cap")(endless)
    register(f"{where}:huge-string", f"{HUGE_STRING_AT[where]} is a string of {HUGE_STRING >> 20} MiB")(huge_string)
    register(f"{where}:huge-list", f"{HUGE_LIST_AT[where]} is a list of {HUGE_LIST:,} items")(huge_list)
    register(f"{where}:control", "CR/LF, ESC, BEL, NUL appended to " + ", ".join(CONTROL_AT[where]))(control)
    for label, token in NUMBER_TOKENS.items():
        register(f"{where}:numbers={label}", f"{token[:24]} in " + ", ".join(NUMBERS_AT[where]))(
            _numbers(where, token)
        )


def _numbers(where: str, token: str) -> Any:
    def numbers(body: Any, prompt_id: str) -> Raw:
        placeholder = "\x00fake_comfy_number\x00"
        for path in NUMBERS_AT[where]:
            body = _mangle(body, path, prompt_id, lambda _old: placeholder)
        return Raw(raw_json(body, {placeholder: token}))

    return numbers


for _where in JSON_ANSWERS:
    _body_mutations(_where)


# -- WebSocket frames --------------------------------------------------------------------------------


def _after_start(extra: list[str | bytes]) -> Any:
    """A ws mutation that sends `extra` frames right after the prompt's execution_start."""

    def inject(event: str, data: Any) -> list[str | bytes] | None:
        if event != "execution_start":
            return None
        return [json.dumps({"type": event, "data": data}), *extra]

    return inject


def _on(events: tuple[str, ...], make: Any) -> Any:
    """A ws mutation that replaces each message of `events` by make(event, data)."""

    def replace(event: str, data: Any) -> list[str | bytes] | None:
        return make(event, data) if event in events else None

    return replace


_PREVIEW_META = json.dumps({"node_id": "1", "prompt_id": "x", "image_type": "image/jpeg"}).encode()
WS_FRAMES: dict[str, tuple[str, Any]] = {
    "ws:binary-noise": ("a binary frame of noise after execution_start", _after_start([noise("ws", 64)])),
    "ws:unknown-type": ("a message of an unknown type after execution_start", _after_start(
        [json.dumps({"type": "fake_comfy_unknown", "data": {"what": [1, {"x": None}]}})])),
    "ws:not-json": ("every executing message is a text frame that is not JSON", _on(
        ("executing",), lambda e, d: ["<html>not json" + CONTROL])),
    "ws:truncated": ("every executing message cut mid-JSON", _on(
        ("executing",), lambda e, d: [json.dumps({"type": e, "data": d})[:20]])),
    "ws:deep": (f"every executing message has {DEPTH:,} levels of arrays as its data", _on(
        ("executing",), lambda e, d: [_deep(b'{"type": "executing", "data": ', b"}").decode()])),
    "ws:huge-string": (f"every executing message's node is a {HUGE_STRING >> 20} MiB string", _on(
        ("executing",), lambda e, d: [json.dumps({"type": e, "data": {**d, "node": "x" * HUGE_STRING}})])),
    "ws:huge-list": (f"every progress_state's nodes is a list of {HUGE_LIST:,} items", _on(
        ("progress_state",), lambda e, d: [json.dumps({"type": e, "data": {**d, "nodes": [0] * HUGE_LIST}})])),
    "ws:control": ("control characters in every executing message's node id", _on(
        ("executing",), lambda e, d: [json.dumps({"type": e, "data": {**d, "node": f"{d.get('node')}{CONTROL}"}})])),
    "ws:preview-short": ("a 3-byte binary frame (shorter than the event type)", _after_start([b"\x00\x00\x01"])),
    "ws:preview-unknown-event": ("a binary frame of event type 0x7fffffff", _after_start(
        [struct.pack(">I", 0x7FFFFFFF) + noise("event", 32)])),
    "ws:preview-bad-length": ("a metadata preview (event 4) whose metadata length is 0xffffffff", _after_start(
        [struct.pack(">II", 4, 0xFFFFFFFF) + _PREVIEW_META])),
    "ws:preview-metadata-not-json": ("a metadata preview (event 4) whose metadata is not JSON", _after_start(
        [struct.pack(">II", 4, 12) + b"\xff\xfenot json!!" + noise("jpeg", 16)])),
    "ws:preview-not-an-image": ("a legacy JPEG preview (event 1) that is noise", _after_start(
        [struct.pack(">II", 1, 1) + noise("preview", 256)])),
    "ws:preview-huge": (f"a legacy preview (event 1) of {HUGE_STRING >> 20} MiB", _after_start(
        [struct.pack(">II", 1, 1) + b"\xff\xd8" + bytes(HUGE_STRING)])),
}
for _name, (_doc, _fn) in WS_FRAMES.items():
    register(_name, _doc)(_fn)


def _ws_numbers(token: str) -> Any:
    placeholder = "\x00fake_comfy_number\x00"

    def numbers(event: str, data: Any) -> list[str | bytes] | None:
        if event != "progress_state":
            return None
        nodes = {k: {**v, "value": placeholder, "max": placeholder} for k, v in data.get("nodes", {}).items()}
        return [raw_json({"type": event, "data": {**data, "nodes": nodes}}, {placeholder: token}).decode()]

    return numbers


for _label, _token in NUMBER_TOKENS.items():
    register(f"ws:numbers={_label}", f"{_token[:24]} as every progress_state's value and max")(_ws_numbers(_token))


# -- output names, /view, the run ----------------------------------------------------------------------

NAMES = {
    "names:traversal": ("../ in file name and subfolder", lambda i: {**i, "filename": "../../" + i["filename"],
                                                                     "subfolder": "../../.."}),
    "names:absolute": ("absolute file name and subfolder", lambda i: {**i, "filename": "/etc/" + i["filename"],
                                                                      "subfolder": "/tmp"}),
    "names:crlf": ("CR/LF in the file name", lambda i: {**i, "filename": i["filename"] + "\r\nX-Injected: 1"}),
    "names:control": ("ESC, BEL and NUL in file name and subfolder", lambda i: {
        **i, "filename": "\x1b[2J" + i["filename"] + "\x00.png", "subfolder": "\x07\x1b]0;x"}),
    "names:type-path": ("an output item whose type is a path, not output or temp", lambda i: {
        **i, "type": "../../etc"}),
}
for _name, (_doc, _fn) in NAMES.items():
    register(_name, _doc)(_fn)

VIEW = {
    "view:truncated": ("half the file (Content-Length honest)", lambda b: Raw(b[: len(b) // 2],
                                                                             content_type="image/png")),
    "view:cut": ("Content-Length of the file, half sent, connection dropped", lambda b: Raw(
        b[: len(b) // 2], content_type="image/png", length=len(b), abort=True)),
    "view:content-type": ("the file served as text/html", lambda b: Raw(b, content_type="text/html")),
    "view:not-an-image": ("an HTML 502 page served as image/png", lambda b: Raw(ERROR_PAGE, content_type="image/png")),
    "view:trickle": ("the file, one byte per trickle interval, dropped at the cap", lambda b: Raw(
        b, content_type="image/png", length=len(b), pause_s=TRICKLE, chunk=1)),
    "view:endless": ("a PNG that never ends (chunked), dropped at the cap", lambda b: Raw(
        b[:16], content_type="image/png", tail=noise("png", 64 << 10), endless=True)),
}
for _name, (_doc, _fn) in VIEW.items():
    register(_name, _doc)(_fn)


@register("run:store-temp-name", "SaveImage also writes each file under a result store's temporary name "
          "(.<name>.part) and lists that copy first: a client that streams into that name and renames it loses the "
          "file it recorded before")
def store_temp_name() -> None:
    """Carried out by SaveImage (nodework.save); listed here so that checkers see it."""


@register("run:ignore-interrupt", "stops at the second node and never checks the interrupt flag: it stays "
          "running after POST /interrupt until the server stops or is killed")
def ignore_interrupt() -> None:
    """Carried out by the executor (faults.FAULT_AT); listed here so that checkers see it."""
