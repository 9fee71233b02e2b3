"""Secrets never leave the job's own stored workflow: not in reasons, logs, status or metrics.

Two mechanisms, because a secret can reach a message two ways:
- by key: ``extra_data`` keys of partner nodes and inputs whose names look like keys, tokens or
  passwords are masked wherever a job's data is shown;
- by value: every such value of a job is collected, and any text about that job (a ComfyUI error, an
  exception message) has those values replaced before it is stored, logged or printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

MASK = "***"
MAX_REASON_CHARS = 2000
SECRET_KEYS = frozenset({"api_key_comfy_org", "auth_token_comfy_org"})
_SECRET_NAME = re.compile(r"(api[_-]?key|apikey|token|secret|passw(or)?d|passwd|credential|auth|bearer)", re.I)
MIN_SECRET_LEN = 4


def is_secret_name(name: str) -> bool:
    return name in SECRET_KEYS or bool(_SECRET_NAME.search(name))


def secret_values(workflow: dict[str, Any] | None, extra_data: dict[str, Any] | None) -> set[str]:
    """Every string that must never be shown for this job."""
    found: set[str] = set()
    roots: list[tuple[Any, bool]] = [(extra_data or {}, False)]
    for node in (workflow or {}).values():
        if isinstance(node, dict) and isinstance(node.get("inputs"), dict):
            roots.append((node["inputs"], False))
    _collect(roots, found)
    return {s for s in found if len(s) >= MIN_SECRET_LEN}


def _collect(stack: list[tuple[Any, bool]], found: set[str]) -> None:
    """Without recursion: a value can be nested as deep as the JSON parser allowed."""
    while stack:
        value, inside_secret = stack.pop()
        if isinstance(value, dict):
            stack.extend((item, inside_secret or is_secret_name(str(key))) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, inside_secret) for item in value)
        elif inside_secret and isinstance(value, str | int) and not isinstance(value, bool):
            found.add(str(value))


def _masked_leaf(value: Any, inside_secret: bool) -> Any:
    if inside_secret and value is not None and not isinstance(value, bool):
        return MASK
    return value


def mask(value: Any, inside_secret: bool = False) -> Any:
    """A copy of ``value`` with every secret-named entry masked, for display; without recursion, so a value
    nested as deep as the JSON parser allowed is masked, not a RecursionError."""
    if not isinstance(value, dict | list):
        return _masked_leaf(value, inside_secret)
    root: list[Any] = [None]
    # (source, inside_secret, the container to fill, the key or index in it)
    stack: list[tuple[Any, bool, Any, Any]] = [(value, inside_secret, root, 0)]
    while stack:
        item, secret, parent, slot = stack.pop()
        if isinstance(item, dict):
            copy: Any = {}
            parent[slot] = copy
            for key, child in item.items():
                copy[key] = None
                stack.append((child, secret or is_secret_name(str(key)), copy, key))
        elif isinstance(item, list):
            if len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int):
                parent[slot] = item  # a link [node, slot] is not a secret
                continue
            copy = [None] * len(item)
            parent[slot] = copy
            stack.extend((child, secret, copy, i) for i, child in enumerate(item))
        else:
            parent[slot] = _masked_leaf(item, secret)
    return root[0]


FRAGMENT_CHARS = 8
"""A run of this many characters of a secret is a fragment of it: masked wherever it appears, so a text cut
before it reached the Redactor (a 5xx body cut at 300 characters, say) cannot show a secret's start."""


class Redactor:
    """Scrubs a job's secret values out of free text, and bounds its length: redact first, cut second."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
        self._grams = frozenset(s[i:i + FRAGMENT_CHARS] for s in self.secrets
                                for i in range(len(s) - FRAGMENT_CHARS + 1))

    @classmethod
    def for_job(cls, workflow: dict[str, Any] | None, extra_data: dict[str, Any] | None) -> Redactor:
        return cls(secret_values(workflow, extra_data))

    def __call__(self, text: str, limit: int = MAX_REASON_CHARS) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        if self._grams:
            text = self._without_fragments(text)
        return bound(text, limit)

    def scrub(self, value: Any) -> Any:
        """A copy of a JSON-like ``value`` with every string in it, keys included, passed through the redactor
        (not cut): a secret can stand anywhere a job's data goes, a node id, an output's file name, a trace. Without
        recursion, as ``mask``; a redactor with no secret returns ``value`` itself."""
        if not self.secrets:
            return value
        root: list[Any] = [None]
        stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
        while stack:
            item, parent, slot = stack.pop()
            if isinstance(item, str):
                parent[slot] = self(item, limit=len(item) + len(MASK) * len(item))
            elif isinstance(item, dict):
                copy: Any = {}
                parent[slot] = copy
                for key, child in item.items():
                    clean_key = self(key, limit=len(key) * 4) if isinstance(key, str) else key
                    copy[clean_key] = None
                    stack.append((child, copy, clean_key))
            elif isinstance(item, list | tuple):
                copy = [None] * len(item)
                parent[slot] = copy
                stack.extend((child, copy, i) for i, child in enumerate(item))
            else:
                parent[slot] = item
        return root[0]

    def _without_fragments(self, text: str) -> str:
        """Every run of FRAGMENT_CHARS or more characters that some secret contains, masked."""
        n, grams = FRAGMENT_CHARS, self._grams
        covered_to, spans = -1, []
        for i in range(len(text) - n + 1):
            if text[i:i + n] in grams:
                if spans and i <= covered_to:
                    spans[-1][1] = i + n
                else:
                    spans.append([i, i + n])
                covered_to = i + n
        if not spans:
            return text
        out, last = [], 0
        for start, end in spans:
            out += [text[last:start], MASK]
            last = end
        out.append(text[last:])
        return "".join(out)


def bound(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """At most ``limit`` characters, with the cut said in the text."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return text[:limit] + f" … ({cut} more characters)"


def display_url(url: str) -> str:
    """scheme://host[:port]/… — the path and query of a webhook URL often are its secret (Slack, Discord),
    so they are never shown, logged or put in an error."""
    try:
        parsed = urlparse(url)
        host = parsed.hostname or "?"
        port = f":{parsed.port}" if parsed.port else ""
    except ValueError:
        return "(unreadable url)"
    return f"{parsed.scheme}://{host}{port}/…"
