"""The values of a jobs.jsonl line, checked one by one: ids, strict JSON, nesting, paths, callback URLs."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any
from urllib.parse import urlparse

from comfysup.destinations import url_problem
from comfysup.redact import display_url

MAX_URL_CHARS = 2048
MAX_DEPTH = 64
"""Arrays and objects inside each other, at most: every walk over a job's data (masking, rendering, hashing)
then stays far from Python's recursion limit, and no workflow needs more than a handful of levels."""


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""Exactly the strings ``str(uuid.UUID(s)) == s`` accepts: checked first, uuid only to explain a refusal."""


class JobLineError(ValueError):
    """One line of a jobs file is invalid; the message is the reason a person reads."""


def canonical_id(value: Any) -> str:
    """The id must be a lowercase hyphenated UUID exactly: it becomes ComfyUI's prompt id."""
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return value
    if not isinstance(value, str):
        raise JobLineError(f"id {value!r} is not a string; expected a lowercase hyphenated UUID like "
                           f"{uuid.UUID(int=0)}")
    try:
        parsed = str(uuid.UUID(value))
    except ValueError as exc:
        raise JobLineError(f"id {value!r} is not a UUID; expected a lowercase hyphenated UUID "
                           "(python -c 'import uuid; print(uuid.uuid4())')") from exc
    if parsed != value:
        raise JobLineError(f"id {value!r} is not in canonical form; write it as {parsed!r} (lowercase, "
                           "hyphenated): ComfyUI uses it as the prompt id")
    return value


def _reject_constant(name: str) -> Any:
    raise JobLineError(f"{name} is not valid JSON; use null or a number")


def _finite_float(text: str) -> float:
    """A number too large for a float (``1e999``) is infinity, which json would accept silently."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise JobLineError(f"{text[:40]} is too large for a number (it would be Infinity); use a smaller one")
    return value


_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
"""One decoder for every line: json.loads with an argument builds a new one per call."""


def loads_strict(text: str | bytes) -> Any:
    """JSON without NaN or Infinity, which ComfyUI's own JSON handling would not round-trip."""
    if isinstance(text, bytes | bytearray):
        try:
            text = text.decode("utf-8-sig")  # a BOM, as json.loads of bytes accepts (editors on Windows)
        except UnicodeDecodeError:
            return json.loads(text, parse_constant=_reject_constant)  # its error, for the message
    return _STRICT.decode(text)


def depth(value: Any) -> int:
    """How many arrays and objects are nested at the deepest point of ``value``, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def check_depth(value: Any, what: str, raw: bytes | None = None) -> None:
    """JobLineError when ``value`` nests deeper than MAX_DEPTH. With its ``raw`` text, a line that has
    fewer brackets than that in all is passed without a walk: most lines have a handful."""
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    if depth(value) > MAX_DEPTH:
        raise JobLineError(f"{what} is nested more than {MAX_DEPTH} levels deep (arrays or objects inside each "
                           "other); flatten it")


def check_text(value: str, what: str) -> str:
    """A path or URL that the file system or the network can take: no NUL byte, no lone surrogate."""
    if "\0" in value:
        raise JobLineError(f"{what} {value[:100]!r} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JobLineError(f"{what} {value[:100]!r} contains a lone surrogate (\\u{ord(value[exc.start]):04x}), "
                           "which is not text; write the character itself") from None
    return value


def check_callback_url(value: Any, *, allow_private: bool = False) -> str:
    """A job's webhook: an http(s) URL with a host, checked at submit rather than failing at its end; not to
    this machine or a private network unless ``allow_private`` (comfysup.destinations)."""
    if value in ("", None):
        return ""
    if not isinstance(value, str) or len(value) > MAX_URL_CHARS:
        raise JobLineError(f"callback_url must be an http:// or https:// URL of at most {MAX_URL_CHARS} characters")
    check_text(value, "callback_url")
    try:
        parsed = urlparse(value)
        ok = parsed.scheme in ("http", "https") and bool(parsed.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise JobLineError(f"callback_url {value[:100]!r} is not an http:// or https:// URL with a host")
    if not allow_private and (problem := url_problem(value)):
        raise JobLineError(f"callback_url {display_url(value)}: {problem}; set [webhooks] allow_private = true to "
                           "send webhooks inside this network")
    return value
