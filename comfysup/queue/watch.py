"""Each process that holds the queue open watches its file: deleted, replaced by another file, or
failing its integrity check, the file this process writes to is no longer the queue anyone reads, so the
process stops taking and accepting work, says why in one line and exits with EXIT_DATABASE_REPLACED.

A look is cheap: ``Queue.replaced`` (one ``stat``) and ``Queue.integrity`` (SQLite: the file's size, and its page
1 read afresh by a connection of its own, not from a cache; and whether a query of this process met a corrupt
page), so every process looks about once a heartbeat. The deep look, SQLite's ``PRAGMA quick_check`` on a
connection of its own, reads the whole file; it runs in a thread, as often as its cost allows (DEEP_CHECK_SECONDS),
and only in processes that may have threads (never in the supervisor, which forks; its monitor does it).
A PostgreSQL queue answers None to both: a server's database cannot be swapped under an open connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from comfysup.errors import DatabaseCorrupt, QueueError

log = logging.getLogger("comfysup.queue")

EXIT_DATABASE_REPLACED = DatabaseCorrupt.exit_code  # 75
"""The exit status of a process whose queue file was deleted, replaced or failed its integrity check under it
(EX_TEMPFAIL): ``comfysup run`` stops with it instead of restarting the child in a loop, and systemd's
Restart=on-failure starts comfysup again on the file now at the path."""
CHECK_SECONDS = 1.0
"""How often a process that has no heartbeat of its own (the API, the monitor, the consumer) looks."""
DEEP_CHECK_SECONDS = 600.0
"""The longest time between two deep looks (``PRAGMA quick_check``, in the processes that may run a thread for
it). They come as often as DEEP_COST_SHARE of one thread allows, every DEEP_MIN_SECONDS at most: a queue of a few
MiB is read every few seconds, one of gigabytes every ten minutes."""
DEEP_MIN_SECONDS = 5.0
DEEP_COST_SHARE = 0.002


def lost_line(reason: str) -> str:
    """The one line that says why: what happened to the file, and what it means."""
    if "integrity check" in reason:
        return (f"the queue database {reason}; restore it from a backup, or move it away so that comfysup starts "
                "on a new queue")
    return f"the queue database {reason}; every write since went to the old file"


class QueueWatch:
    """``check()`` is None while the queue's file is the one open and sound; then why it is not, for good (a
    file lost once is never trusted again by this process). ``on_lost`` is called once, with the reason."""

    def __init__(self, queue: Any, *, every_seconds: float = CHECK_SECONDS, deep_seconds: float | None = None,
                 on_lost: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.queue = queue
        self.every_seconds = every_seconds
        self.deep_seconds = deep_seconds
        self.on_lost = on_lost
        self.clock = clock
        self.lost: str | None = None
        self._next = float("-inf")
        self._next_deep = float("inf")
        self._deep: threading.Thread | None = None
        self._lock = threading.Lock()
        self.deep_every(deep_seconds)

    def deep_every(self, seconds: float | None) -> None:
        """Read the whole file every ``seconds`` in a thread of its own (None: never, in this process)."""
        self.deep_seconds = seconds
        self._next_deep = self.clock() + min(DEEP_MIN_SECONDS, seconds) if seconds else float("inf")

    def check(self, *, force: bool = False) -> str | None:
        """A cheap look, at most every ``every_seconds`` unless ``force`` (a request about to write)."""
        if self.lost is not None:
            return self.lost
        now = self.clock()
        if not force and now < self._next:
            return None
        self._next = now + self.every_seconds
        reason = self._look(deep=False)
        if reason is None and now >= self._next_deep and (self._deep is None or not self._deep.is_alive()):
            self._next_deep = float("inf")  # set again once this one has ended, from what it cost
            self._deep = threading.Thread(target=self._deep_look, daemon=True, name="comfysup-queue-check")
            self._deep.start()
        return self.lost if reason is None else reason

    def look_deep(self) -> str | None:
        """At once, in this thread: the deep look (a child said the file is lost; here is SQLite's word on it)."""
        return self.lost or self._look(deep=True)

    def _deep_look(self) -> None:
        started = self.clock()
        self._look(deep=True)
        took = self.clock() - started
        self._next_deep = self.clock() + min(max(took / DEEP_COST_SHARE, DEEP_MIN_SECONDS), self.deep_seconds or 0.0)

    def _look(self, *, deep: bool) -> str | None:
        try:
            reason = self.queue.replaced() or self.queue.integrity(deep=deep)
            if reason is not None and "integrity check" in reason:
                # A file deleted or replaced between the two looks fails the second one ("unable to open"): the
                # first, asked again, says what really happened.
                reason = self.queue.replaced() or reason
        except QueueError:
            return None  # the database does not answer: the process's own calls say so
        if reason is None:
            return None
        with self._lock:
            if self.lost is not None:
                return self.lost
            self.lost = reason
        if self.on_lost is not None:
            self.on_lost(reason)
        return reason
