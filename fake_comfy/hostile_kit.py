"""The hostile catalogue's kit: its table, the primitives a mutation is made of, and the mutations of typed paths.

The complete catalogue is `fake_comfy.hostile` (this module's mutations and hostile_bodies').


comfysup must treat every answer of ComfyUI as untrusted input, for days, unattended. A mutation is a
small function registered in `CATALOGUE` under a name `WHERE:WHAT`, where WHERE says which answer it
mangles (see `WHERE`) and WHAT how; a chaos checker lists them with `CATALOGUE` (or `--help`). The
script word `hostile:NAME` gives one prompt one mutation; `--hostile-seed` picks them at random
(`choose`). How each kind of mutation reaches the wire is in hostile_serve.py.

Kinds of function, by WHERE:
- JSON answers (post, history, queue, system_stats, object_info): ``fn(body, prompt_id)`` returns the
  new JSON value or a `Raw` body (bytes sent as they are: cut, trickled, endless, not JSON).
- ws: ``fn(event, data)`` returns the frames (str: text, bytes: binary) to send instead of that
  message, or None to leave it alone.
- names: ``fn(image)`` renames one output item {filename, subfolder, type} (history and `executed`).
- view: ``fn(file_bytes)`` returns the `Raw` answer to /view of one of the prompt's files.
- run: the executor's behaviour (see faults.FAULT_AT); the function is not called.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Which answer a mutation mangles, and when.
WHERE: dict[str, str] = {
    "post": "the answer to POST /prompt of that prompt",
    "history": "GET /history and /history/{id} whenever they hold that prompt's entry",
    "queue": "the next GET /queue after that prompt was posted (once)",
    "system_stats": "the next GET /system_stats after that prompt was posted (once)",
    "object_info": "the next GET /object_info after that prompt was posted (once)",
    "ws": "the WebSocket messages about that prompt (text frames, and binary frames sent with them)",
    "names": "the names of that prompt's output files, in its history entry and `executed` messages",
    "view": "GET /view of that prompt's output files",
    "run": "how that prompt runs",
}
#: The answers that are not about one prompt: a mutation of theirs fires once, on the next answer.
ONCE = ("queue", "system_stats", "object_info")
JSON_ANSWERS = ("post", "history", "queue", "system_stats", "object_info")

DEPTH = 200_000
HUGE_STRING = 8 << 20
HUGE_LIST = 1_000_000
CHUNK = 64 << 10
TRICKLE = -1.0
"""Raw.pause_s that means "the trickle interval" (Options.hostile_trickle_s, one byte each)."""
CONTROL = "\r\nX-Injected: 1\x1b[2J\x1b]0;pwned\x07\x00"
NUMBER_TOKENS = {
    "infinity": "Infinity",
    "nan": "NaN",
    "1e999": "1e999",
    "negative": "-9223372036854775809",
    "huge": "1" + "0" * 400,
}
KINDS: dict[str, Any] = {"str": "fake_comfy: not what you expected", "list": [], "object": {}, "number": -1,
                         "null": None}


@dataclass(frozen=True)
class Raw:
    """A body sent byte for byte: `pause_s` between chunks, `length` declared (None: chunked), then
    `abort` the connection instead of ending the body. `endless` bodies (chunked, no length) repeat
    `tail` until the cap; the others declare `length`, or their own length when it is None."""

    head: bytes
    content_type: str = "application/json; charset=utf-8"
    length: int | None = None
    pause_s: float = 0.0
    chunk: int = CHUNK
    abort: bool = False
    tail: bytes = b""
    endless: bool = False

    def chunks(self) -> Iterator[bytes]:
        for start in range(0, len(self.head), self.chunk):
            yield self.head[start : start + self.chunk]
        while self.endless:
            yield self.tail


@dataclass(frozen=True)
class Mutation:
    name: str
    where: str
    doc: str
    fn: Callable[..., Any] = field(repr=False)


CATALOGUE: dict[str, Mutation] = {}


def register(name: str, doc: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add a function to the catalogue as `name` (its WHERE is the part before the first colon)."""
    where = name.split(":", 1)[0]
    if where not in WHERE:
        raise ValueError(f"unknown place {where!r} in mutation {name!r}")

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        CATALOGUE[name] = Mutation(name, where, doc, fn)
        return fn

    return add


def choose(seed: int, rate: float, prompt_id: str, names: Sequence[str] | None = None) -> str | None:
    """The random mutation of a prompt: the same for the same seed and id, in every process."""
    rng = random.Random(f"{seed}/{prompt_id}")
    pool = [n for n in CATALOGUE if not names or any(n == p or n.startswith(p + ":") for p in names)]
    if not pool or rng.random() >= rate:
        return None
    return rng.choice(pool)


def noise(label: str, size: int) -> bytes:
    """Deterministic bytes (the same garbage for the same label in every run)."""
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{label}/{counter}".encode()).digest()
        counter += 1
    return out[:size]


# -- paths ------------------------------------------------------------------------------------------

PID = "@"
"""In a history path: the prompt's own id (the key of its entry)."""


def replace_at(value: Any, path: Sequence[str], make: Callable[[Any], Any]) -> bool:
    """Replace what `path` names inside `value` with make(old), in place; '*' is every key or item.

    Iterative over the path (short), so any depth of value is fine. Returns whether anything changed.
    """
    changed = False
    level = [value]
    for depth, head in enumerate(path):
        last = depth == len(path) - 1
        following = []
        for holder in level:
            if isinstance(holder, dict):
                keys: list[Any] = list(holder) if head == "*" else [head] if head in holder else []
            elif isinstance(holder, list):
                keys = list(range(len(holder))) if head == "*" else (
                    [int(head)] if head.isdigit() and int(head) < len(holder) else [])
            else:
                keys = []
            for key in keys:
                if last:
                    holder[key] = make(holder[key])
                    changed = True
                else:
                    following.append(holder[key])
        level = following
    return changed


def _path(text: str, prompt_id: str) -> list[str]:
    return [prompt_id if part == PID else part for part in text.split(".")] if text else []


def _mangle(body: Any, path: str, prompt_id: str, make: Callable[[Any], Any]) -> Any:
    """A deep copy of `body` with `path` replaced (the root itself when the path is empty)."""
    if not path:
        return make(body)
    body = copy.deepcopy(body)
    replace_at(body, _path(path, prompt_id), make)
    return body


def raw_json(value: Any, tokens: dict[str, str]) -> bytes:
    """JSON text with each placeholder string replaced by a raw token (Infinity, 1e999, ...)."""
    text = json.dumps(value)
    for placeholder, token in tokens.items():
        text = text.replace(json.dumps(placeholder), token)
    return text.encode()


# -- wrong types, at every level a client reads -----------------------------------------------------

#: Per answer: path -> the type that belongs there (a wrong-type mutation is made for each other kind).
TYPED_PATHS: dict[str, dict[str, str]] = {
    "post": {"": "object", "prompt_id": "str", "number": "number", "node_errors": "object"},
    "history": {
        "": "object",
        "@": "object",
        "@.prompt": "list",
        "@.outputs": "object",
        "@.outputs.*": "object",
        "@.outputs.*.images": "list",
        "@.outputs.*.images.*": "object",
        "@.outputs.*.images.*.filename": "str",
        "@.outputs.*.images.*.subfolder": "str",
        "@.outputs.*.images.*.type": "str",
        "@.status": "object",
        "@.status.status_str": "str",
        "@.status.completed": "bool",
        "@.status.messages": "list",
        "@.status.messages.*": "list",
        "@.status.messages.*.0": "str",
        "@.status.messages.*.1": "object",
        "@.meta": "object",
    },
    "queue": {"": "object", "queue_running": "list", "queue_pending": "list", "queue_pending.*": "list"},
    "system_stats": {
        "": "object",
        "system": "object",
        "system.comfyui_version": "str",
        "system.ram_free": "number",
        "devices": "list",
        "devices.*": "object",
        "devices.*.name": "str",
        "devices.*.vram_free": "number",
        "devices.*.vram_total": "number",
    },
    "object_info": {"": "object", "*": "object", "*.input": "object", "*.input.required": "object",
                    "*.output": "list"},
    "ws": {
        "": "object",
        "type": "str",
        "data": "object",
        "data.prompt_id": "str",
        "data.node": "str",
        "data.output": "object",
        "data.output.images": "list",
        "data.nodes": "object",
        "data.nodes.*.value": "number",
    },
}


def _wrong_json(path: str, kind: str) -> Callable[[Any, str], Any]:
    def wrong(body: Any, prompt_id: str) -> Any:
        return _mangle(body, path, prompt_id, lambda _old: copy.deepcopy(KINDS[kind]))

    return wrong


def _wrong_ws(path: str, kind: str) -> Callable[[str, Any], list[str | bytes] | None]:
    def wrong(event: str, data: Any) -> list[str | bytes] | None:
        message = {"type": event, "data": copy.deepcopy(data)}
        if not path:
            return [json.dumps(KINDS[kind])]
        if not replace_at(message, path.split("."), lambda _old: copy.deepcopy(KINDS[kind])):
            return None
        return [json.dumps(message)]

    return wrong


for _where, _paths in TYPED_PATHS.items():
    for _path_text, _expected in _paths.items():
        for _kind in KINDS:
            if _kind == _expected:
                continue
            _name = f"{_where}:{_path_text or '$'}={_kind}"
            _doc = f"{_path_text or 'the body'} is a {_kind} ({_expected} expected)"
            _fn = _wrong_ws(_path_text, _kind) if _where == "ws" else _wrong_json(_path_text, _kind)
            register(_name, _doc)(_fn)

