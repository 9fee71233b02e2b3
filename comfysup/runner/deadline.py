"""Deadlines that hold inside a blocking read: a timer signal interrupts whatever the runner is waiting on.

A socket timeout bounds each ``recv``, not a call: a server that trickles one byte every two seconds never
trips a 30 s read timeout, and a download could outlive the job's ``timeout_seconds`` and its lease by
minutes. The runner is one blocking thread per process, so the classic answer fits: ``ITIMER_REAL`` is
armed for the earliest deadline in force, and its SIGALRM handler raises :class:`DeadlineExceeded` in the
middle of the read. Deadlines nest (a call's own bound inside the attempt's): the timer always holds the
earliest, and leaving a block re-arms the one around it.

After a DeadlineExceeded the connection it interrupted is in an unknown state: the client drops it.

A timer that was armed before (pytest-timeout's, in the tests) is kept: its handler and due time are
saved when the first deadline is armed, called if it falls first, and restored when the last one ends.

Only the main thread of a process can take signals; elsewhere (a test's thread) the deadlines are kept and
checked between reads by :func:`check`, but nothing interrupts a read.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator


class DeadlineExceeded(Exception):
    """The earliest deadline in force passed; ``what`` says whose (``the job's timeout of 600 s``)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


_stack: list[tuple[float, str]] = []
"""(monotonic time, what) of each deadline in force, innermost last."""
_ceiling: tuple[float, str] | None = None
"""A bound on every deadline, set by :func:`shorten` (a graceful stop's grace period)."""
_foreign: tuple[object, float | None] | None = None
"""The SIGALRM handler and the due time of a timer armed before ours took the signal over."""
_clock: Callable[[], float] = time.monotonic


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _earliest() -> tuple[float, str] | None:
    """The deadline that falls first among those in force, the ceiling included; None when none is."""
    if not _stack:
        return None
    first = min(_stack)
    return _ceiling if _ceiling is not None and _ceiling[0] < first[0] else first


def _on_alarm(signum: int, frame: object) -> None:
    now = _clock()
    global _foreign
    if _foreign is not None and _foreign[1] is not None and now >= _foreign[1] - 0.001:
        handler = _foreign[0]
        _foreign = (handler, None)  # a one-shot timer: it has fallen
        _arm()
        if callable(handler):
            handler(signum, frame)  # the earlier timer's own action (pytest-timeout fails the test)
        return
    due = _earliest()
    if due is not None and now >= due[0] - 0.001:
        raise DeadlineExceeded(due[1])
    _arm()  # woken early (another deadline was re-armed): sleep on


def _release() -> None:
    """Give SIGALRM back to whoever had it, with what is left of their timer."""
    global _foreign
    if _foreign is None:
        return
    handler, due = _foreign
    _foreign = None
    signal.signal(signal.SIGALRM, handler)  # type: ignore[arg-type]
    left = 0.0 if due is None else max(due - _clock(), 0.001)
    signal.setitimer(signal.ITIMER_REAL, left)


def _arm() -> None:
    global _foreign
    if not _main_thread():
        return
    due = _earliest()
    if due is None:
        _release()
        return
    if _foreign is None:
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        _foreign = (signal.getsignal(signal.SIGALRM), _clock() + left if left > 0 else None)
        signal.signal(signal.SIGALRM, _on_alarm)
    first = due[0] if _foreign[1] is None else min(due[0], _foreign[1])
    signal.setitimer(signal.ITIMER_REAL, max(first - _clock(), 0.001))


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Raise DeadlineExceeded(what) if the block is still running ``seconds`` from now (``inf``: no bound)."""
    if math.isinf(seconds):
        yield
        return
    entry = (_clock() + max(seconds, 0.0), what)
    _stack.append(entry)
    _arm()
    try:
        yield
    finally:
        _stack.remove(entry)
        _arm()


def until(at_monotonic: float, what: str) -> contextlib.AbstractContextManager[None]:
    """Like :func:`within`, for an absolute monotonic time."""
    return within(at_monotonic - _clock(), what)


def remaining() -> float:
    """Seconds until the earliest deadline in force (``inf`` when none)."""
    due = _earliest()
    return math.inf if due is None else due[0] - _clock()


def check() -> None:
    """Raise DeadlineExceeded when the earliest deadline has passed: for loops between reads, and for
    threads that the timer cannot interrupt."""
    due = _earliest()
    if due is not None and _clock() >= due[0]:
        raise DeadlineExceeded(due[1])


def shorten(seconds: float, what: str) -> None:
    """Bring every deadline in force to at most ``seconds`` from now: a stop asked for by SIGTERM gives the
    running job ``grace_seconds``, wherever it is blocked. Called from a signal handler too."""
    global _ceiling
    at = _clock() + max(seconds, 0.0)
    if _ceiling is None or at < _ceiling[0]:
        _ceiling = (at, what)
    _arm()


def reset() -> None:
    """Forget every deadline and disarm the timer (a forked child starts clean)."""
    global _ceiling
    _stack.clear()
    _ceiling = None
    if _main_thread():
        _release()
