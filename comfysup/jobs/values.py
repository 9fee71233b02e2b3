"""The values of a jobs.jsonl line, checked one by one: ids, strict JSON, nesting, paths, callback URLs."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from comfysup.destinations import is_http_url, url_problem
from comfysup.redact import display_url

MAX_URL_CHARS = 2048
MAX_DEPTH = 64
"""Arrays and objects inside each other, at most: every walk over a job's data (masking, rendering, hashing)
then stays far from Python's recursion limit, and no workflow needs more than a handful of levels."""


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""Exactly the strings ``str(uuid.UUID(s)) == s`` accepts."""
NIL_UUID = "00000000-0000-0000-0000-000000000000"


MAX_REASONS = 20
"""Problems of one line reported, at most; the rest are counted in one more reason."""


class JobLineError(ValueError):
    """One line of a jobs file is invalid; the message is the reason a person reads. A line with more than one
    problem carries each in ``reasons`` (the message joins them with "; ")."""

    def __init__(self, *reasons: str) -> None:
        self.reasons: list[str] = list(reasons)
        super().__init__("; ".join(shown_reasons(self.reasons)))


def shown_reasons(reasons: list[str], limit: int = MAX_REASONS) -> list[str]:
    """At most ``limit`` reasons (MAX_REASONS), the last saying how many more there were."""
    if len(reasons) <= limit:
        return reasons
    return [*reasons[:limit - 1], f"… and {len(reasons) - limit + 1} more problem(s) on this line not shown"]


def article(word: str) -> str:
    """``word`` with "a" or "an" before it, as it is read out: "an INT", "a FLOAT", "an IMAGE"."""
    return f"{'an' if word[:1].lower() in 'aeiou' and word[:1] else 'a'} {word}"


def did_you_mean(word: Any, candidates: Iterable[Any], limit: int = 3) -> str:
    """"did you mean 'x'?" for the closest of ``candidates`` to ``word``, or "" for none close."""
    names = [repr(n) for n in close_matches(word, candidates, limit)]
    if not names:
        return ""
    return "did you mean " + (names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}") + "?"


def close_matches(word: Any, candidates: Iterable[Any], limit: int = 3, cutoff: float = 0.7) -> list[str]:
    """The ``candidates`` closest to ``word`` (case aside), closest first: ``difflib``'s ratio at least
    ``cutoff`` and nearly the best one's, at most ``limit``.

    Two file names with the same extension are compared by their stems: otherwise every ``.safetensors`` file
    would look close to every other one."""
    if not isinstance(word, str) or not word:
        return []
    folded = word.casefold()
    stem, ext = _split_extension(folded)
    scored: list[tuple[float, str]] = []
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(folded)
    stem_matcher = difflib.SequenceMatcher()
    stem_matcher.set_seq2(stem)
    seen: set[str] = set()
    for candidate in candidates:
        text = str(candidate)
        other = text.casefold()
        if text == word or text in seen:
            continue
        seen.add(text)
        other_stem, other_ext = _split_extension(other)
        m = stem_matcher if ext and other_ext == ext else matcher
        m.set_seq1(other_stem if m is stem_matcher else other)
        if m.real_quick_ratio() >= cutoff and m.quick_ratio() >= cutoff and (score := m.ratio()) >= cutoff:
            scored.append((score, text))
    scored.sort(key=lambda x: (-x[0], x[1]))
    # Only those nearly as close as the closest: a clear match is not followed by far ones.
    return [t for score, t in scored[:limit] if score >= scored[0][0] - 0.12]


def _split_extension(name: str) -> tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    if dot and stem and 0 < len(ext) <= 12 and "/" not in ext:
        return stem, ext
    return name, ""


def canonical_id(value: Any) -> str:
    """The id must be a lowercase hyphenated UUID exactly: it becomes ComfyUI's prompt id."""
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return value
    if not isinstance(value, str):
        raise JobLineError(f"id {value!r} is not a string; expected a lowercase hyphenated UUID like {NIL_UUID}")
    parsed = uuid_form(value)
    if parsed is None:
        raise JobLineError(f"id {value!r} is not a UUID; expected a lowercase hyphenated UUID "
                           "(python -c 'import uuid; print(uuid.uuid4())')")
    raise JobLineError(f"id {value!r} is not in canonical form; write it as {parsed!r} (lowercase, "
                       "hyphenated): ComfyUI uses it as the prompt id")


def uuid_form(text: str) -> str | None:
    """``text`` read as uuid.UUID reads it (braces, ``urn:uuid:``, hyphens anywhere, either case) and written in
    canonical form, as ``str(uuid.UUID(text))``; None where uuid.UUID would refuse it. The uuid module is not
    imported for it: it loads platform, and every submit checks ids."""
    digits = text.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "")
    try:
        number = int(digits, 16) if len(digits) == 32 else -1
    except ValueError:
        return None
    return None if number < 0 else hyphenated(f"{number:032x}")


def hyphenated(hex32: str) -> str:
    """32 lowercase hex digits as a UUID's text: 8-4-4-4-12."""
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


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
    if not is_http_url(value):
        raise JobLineError(f"callback_url {value[:100]!r} is not an http:// or https:// URL with a host")
    if not allow_private and (problem := url_problem(value)):
        raise JobLineError(f"callback_url {display_url(value)}: {problem}; set [webhooks] allow_private = true to "
                           "send webhooks inside this network")
    return value
