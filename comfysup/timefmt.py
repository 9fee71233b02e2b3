"""Times as a person reads them, shared by the commands and the status page.

A base module: it imports nothing of comfysup, so any layer can use it.
"""

from __future__ import annotations

import time


def age(seconds: float | None) -> str:
    """A duration a person reads at a glance: 850 ms, 12.3 s, 4 min 05 s, 3 h 12 min, 2 d 4 h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def iso_utc(epoch: float) -> str:
    """An instant as ISO 8601 in UTC, to the second (``2026-12-04T15:20:25Z``): for files other programs read."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
