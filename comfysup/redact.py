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
    _collect(extra_data or {}, found, inside_secret=False)
    for node in (workflow or {}).values():
        if isinstance(node, dict) and isinstance(node.get("inputs"), dict):
            _collect(node["inputs"], found, inside_secret=False)
    return {s for s in found if len(s) >= MIN_SECRET_LEN}


def _collect(value: Any, found: set[str], inside_secret: bool) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _collect(item, found, inside_secret or is_secret_name(str(key)))
    elif isinstance(value, list):
        for item in value:
            _collect(item, found, inside_secret)
    elif inside_secret and isinstance(value, str | int) and not isinstance(value, bool):
        found.add(str(value))


def mask(value: Any, inside_secret: bool = False) -> Any:
    """A copy of ``value`` with every secret-named entry masked, for display."""
    if isinstance(value, dict):
        return {k: mask(v, inside_secret or is_secret_name(str(k))) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int):
            return value  # a link [node, slot] is not a secret
        return [mask(v, inside_secret) for v in value]
    if inside_secret and value is not None and not isinstance(value, bool):
        return MASK
    return value


class Redactor:
    """Scrubs a job's secret values out of free text, and bounds its length."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)

    @classmethod
    def for_job(cls, workflow: dict[str, Any] | None, extra_data: dict[str, Any] | None) -> Redactor:
        return cls(secret_values(workflow, extra_data))

    def __call__(self, text: str, limit: int = MAX_REASON_CHARS) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return bound(text, limit)


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
