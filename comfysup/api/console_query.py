"""What a person types in the console's search box, as a queue search (comfysup.queue.search ``JobSearch``).

``q`` is words separated by spaces, each one of:

- ``state:dead`` (or the ``state`` parameter): one state;
- ``workflow:NAME``: the workflow's name, exactly;
- ``tenant:NAME`` (or the ``tenant`` parameter): the tenant the jobs belong to, exactly;
- ``KEY=VALUE`` or ``label:KEY=VALUE``: a metadata label;
- ``since:WHEN`` / ``until:WHEN``: submitted in that range; WHEN is an ISO 8601 time (``2026-12-06``,
  ``2026-12-06T14:00``, UTC unless it names a zone) or an age back from now (``90m``, ``2h``, ``7d``);
- hex digits and hyphens: the start of a job's id;
- any other word: a workflow's name.

The cursor of a page travels in the URL as one opaque text (``after``), so a page of a search has a link.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from comfysup.queue.search import JobSearch, SearchError

AGE = re.compile(r"^(\d+)([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
HEX = frozenset("0123456789abcdef-")
MAX_QUERY_CHARS = 500


def when(text: str, now: float) -> float:
    """An instant the person wrote: an ISO 8601 time (UTC unless zoned) or an age (``2h``) before ``now``."""
    age = AGE.match(text)
    if age:
        return now - int(age.group(1)) * UNIT_SECONDS[age.group(2)]
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SearchError(f"{text!r} is no time: write 2026-12-06T14:00 (UTC), or an age such as 90m, 2h, 7d") \
            from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _word(word: str, found: dict[str, Any], now: float) -> None:
    """One word of ``q`` into ``found`` (JobSearch's fields)."""
    name, colon, value = word.partition(":")
    if colon and name in ("state", "workflow", "tenant", "since", "until", "label", "id"):
        if name in ("since", "until"):
            found[name] = when(value, now)
        elif name == "label":
            _label(value, found)
        elif name == "id":
            found["id_prefix"] = value.lower()
        else:
            found[name] = value
    elif "=" in word:
        _label(word, found)
    elif set(word.lower()) <= HEX and len(word) >= 4:
        found["id_prefix"] = word.lower()
    else:
        found["workflow"] = word


def _label(text: str, found: dict[str, Any]) -> None:
    key, eq, value = text.partition("=")
    if not eq:
        raise SearchError(f"label {text!r}: write KEY=VALUE")
    found.setdefault("labels", []).append((key, value))


def parse(params: Mapping[str, str], now: float | None = None, limit: int = 50) -> JobSearch:
    """The search that the URL's parameters ask (``q``, ``state``, ``tenant``, ``order``, ``after``); SearchError
    says what is wrong."""
    now = time.time() if now is None else now
    q = params.get("q", "")
    if len(q) > MAX_QUERY_CHARS:
        raise SearchError(f"the search is longer than {MAX_QUERY_CHARS} characters")
    found: dict[str, Any] = {}
    for word in q.split():
        _word(word, found, now)
    for name in ("state", "tenant"):
        if params.get(name):
            found[name] = params[name]
    order = params.get("order", "newest")
    if order not in ("newest", "oldest"):
        raise SearchError(f"order {order!r}: newest or oldest")
    search = JobSearch(id_prefix=found.get("id_prefix", ""), state=found.get("state", ""),
                       workflow=found.get("workflow", ""), tenant=found.get("tenant", ""),
                       labels=tuple(found.get("labels", ())), since=found.get("since"), until=found.get("until"),
                       oldest_first=order == "oldest", after=cursor_of(params.get("after", "")), limit=limit)
    search.check()
    return search


def cursor_text(cursor: tuple[Any, ...] | None) -> str | None:
    """A page's cursor as one URL-safe text."""
    if cursor is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(list(cursor)).encode()).decode().rstrip("=")


def cursor_of(text: str) -> tuple[Any, ...] | None:
    if not text:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error):
        raise SearchError("the page's cursor (after) is not one this console wrote") from None
    if not isinstance(value, list) or not 1 <= len(value) <= 2 or \
            not all(isinstance(v, str | int | float) for v in value):
        raise SearchError("the page's cursor (after) is not one this console wrote")
    return tuple(value)
