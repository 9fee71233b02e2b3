"""Job ids as a person types them on the command line: whole, or any unique prefix (as git takes a commit's).
Its own module, apart from _common: ``comfysup status`` needs none of it, nor comfysup.jobs."""

from __future__ import annotations

from collections.abc import Sequence

from comfysup.errors import UsageError
from comfysup.jobs.values import JobLineError, canonical_id
from comfysup.queue import Queue

MIN_PREFIX = 4
"""The shortest id prefix taken (as git's): fewer characters name too many jobs to be meant."""


def resolve_ids(queue: Queue, given: Sequence[str]) -> list[str]:
    """Each id as typed, or the one job id it begins (any unique prefix of at least MIN_PREFIX characters, as git
    takes a commit's); UsageError names one that matches nothing or several."""
    out = []
    for typed in given:
        text = typed.strip().lower()
        try:
            out.append(canonical_id(text))
            continue
        except JobLineError:
            pass
        if len(text) < MIN_PREFIX or text.strip("0123456789abcdef-"):
            raise UsageError(f"{typed!r} is not a job id: give the whole id, or at least its first {MIN_PREFIX} "
                             "characters (hex digits and hyphens)")
        found = queue.reads.ids_starting(text, limit=4)
        if not found:
            raise UsageError(f"no job id begins with {typed!r}")
        if len(found) > 1:
            more = "" if len(found) < 4 else ", …"
            raise UsageError(f"{typed!r} begins several job ids ({', '.join(found[:3])}{more}); give more characters")
        out.append(found[0])
    return out

