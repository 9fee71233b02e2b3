"""Deadlines that hold inside a blocking read: a timer signal interrupts whatever the runner is waiting on.

A socket timeout bounds each ``recv``, not a call: a server that trickles one byte every two seconds never
trips a 30 s read timeout, and a download could outlive the job's ``timeout_seconds`` and its lease by
minutes. The runner is one blocking thread per process, so the classic answer fits: ``ITIMER_REAL`` is
armed for the earliest deadline in force, and its SIGALRM handler raises :class:`DeadlineExceeded` in the
middle of the read. Deadlines nest (a call's own bound inside the attempt's): the timer always holds the
earliest, and leaving a block re-arms the one around it. :func:`shorten` brings every deadline in force to
a graceful stop's grace, from the SIGTERM handler itself.

Queue transactions must never be cut in the middle (a PostgreSQL connection interrupted mid-query is
left unusable): inside :func:`deferred` the alarm only notes that it fell, and the exception is raised as
the block ends. After a DeadlineExceeded the ComfyUI connection it interrupted is in an unknown state: the
client drops it.

A timer that was armed before (pytest-timeout's, in the tests) is kept: its handler and due time are
saved when the first deadline is armed, called if it falls first, and restored when the last one ends. A runner's
process keeps the handler between deadlines (``keep_between``) and gives it back at exit.
Only the main thread of a process can take signals; each thread keeps its own deadlines, and in any other
thread they are checked between reads by :func:`check` but interrupt nothing.
"""

from __future__ import annotations

import _signal
import atexit
import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(eq=False)
class Due:
    """One deadline: when (monotonic), whose (``the job's timeout of 600 s``) and what kind of bound."""

    at: float
    what: str
    kind: str = "call"
    """call (one HTTP call's own bound), attempt (the job's timeout), stop (a stop signal's grace)."""


class DeadlineExceeded(Exception):
    """The earliest deadline in force passed; ``due`` says which."""

    def __init__(self, due: Due) -> None:
        super().__init__(due.what)
        self.due = due
        self.what = due.what
        self.kind = due.kind


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[Due] = []
        self.ceiling: Due | None = None
        self.deferring = 0
        self.fell: Due | None = None


_state = _State()
_main: _State | None = None
"""The main thread's state, which the SIGALRM handler reads (it runs in the main thread)."""
_foreign: tuple[object, float | None] | None = None
"""The SIGALRM handler and the due time of a timer armed before ours took the signal over."""
_clock: Callable[[], float] = time.monotonic
_keep = False
"""Whether SIGALRM's handler and timer stay between deadlines (``keep_between``: a runner's process)."""
_armed_at: float | None = None
"""When the timer is set to fall (monotonic), while it is ours; None when it is not set or has fallen. A
deadline that ends leaves the timer as it is (it may fall early, and then sleeps on), and one that begins
later than it needs no system call: a runner arms one around every HTTP call, and the setitimer calls
were a twelfth of its Python time a job."""


def _after_fork_in_child() -> None:
    """A forked child has no interval timer (fork does not pass it on): what the parent had set is not set here."""
    global _armed_at
    _armed_at = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _handler_now() -> object:
    """SIGALRM's handler as the interpreter holds it: ``_signal.getsignal`` (CPython's own module under ``signal``)
    without ``signal.getsignal``'s conversion to an enum, which failed with an exception for our handler on every
    deadline of a runner's (2 us; this check needs only whether the handler is ours)."""
    return _signal.getsignal(signal.SIGALRM)


def _is_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def _earliest(state: _State) -> Due | None:
    """The deadline that falls first among those in force, a stop's ceiling included; None when none is."""
    if not state.stack:
        return None
    first = min(state.stack, key=lambda d: d.at)
    return state.ceiling if state.ceiling is not None and state.ceiling.at < first.at else first


def _on_alarm(signum: int, frame: object) -> None:
    global _foreign, _armed_at
    _armed_at = None
    now = _clock()
    if _foreign is not None and _foreign[1] is not None and now >= _foreign[1] - 0.001:
        handler = _foreign[0]
        _foreign = (handler, None)  # a one-shot timer: it has fallen
        _arm()
        if callable(handler):
            handler(signum, frame)  # the earlier timer's own action (pytest-timeout fails the test)
        return
    state = _main if _main is not None else _state
    due = _earliest(state)
    if due is not None and now >= due.at - 0.001:
        if state.deferring:
            state.fell = due  # raised when the deferred block ends
            return
        raise DeadlineExceeded(due)
    _arm()  # woken early (another deadline was re-armed): sleep on


def keep_between() -> None:
    """This process arms deadlines one after another all its life (a runner: several a job): where nobody else had
    SIGALRM (its default action, no timer), our handler and the timer stay between two deadlines (the timer, falling,
    finds nothing due), so the next job arms its deadline without the two signal and two timer calls that a release
    and a take-over cost (an eighth of a runner's Python time a job). Both are given back at exit, before the
    interpreter restores the signal's default action: a timer that fell after that would kill the process."""
    global _keep
    if not _keep:
        _keep = True
        atexit.register(_give_back_at_exit)


def _give_back_at_exit() -> None:
    global _keep
    _keep = False
    if _is_main():
        _release()


def _release(lazy: bool = False) -> None:
    """Give SIGALRM back to whoever had it, with what is left of their timer; ``lazy`` (no deadline left in force):
    not in a process that keeps it between deadlines (``keep_between``) where nobody else had it."""
    global _foreign, _armed_at
    if _foreign is None:
        return
    handler, due = _foreign
    if lazy and _keep and due is None and handler is signal.SIG_DFL:
        return
    _armed_at = None
    _foreign = None
    # Ours is disarmed before the handler is theirs: one falling between the two would be theirs to take (a
    # test harness's timeout, or the default action, which kills the process). One that fell already is ours:
    # signal.signal runs the handlers of signals that arrived before it changes one.
    signal.setitimer(signal.ITIMER_REAL, 0.0)
    signal.signal(signal.SIGALRM, handler)  # type: ignore[arg-type]
    if due is not None:
        signal.setitimer(signal.ITIMER_REAL, max(due - _clock(), 0.001))


def _arm() -> None:
    global _foreign, _main, _armed_at
    if not _is_main():
        return
    _main = _state
    due = _earliest(_state)
    if due is None:
        _release(lazy=True)
        return
    if _foreign is not None and _handler_now() is not _on_alarm:
        _foreign = None  # someone took the signal back since (a test harness between tests): theirs is current
        _armed_at = None
    if _foreign is None:
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        _foreign = (signal.getsignal(signal.SIGALRM), _clock() + left if left > 0 else None)
        signal.signal(signal.SIGALRM, _on_alarm)
    first = due.at if _foreign[1] is None else min(due.at, _foreign[1])
    if _armed_at is not None and _armed_at <= first:
        return  # it falls first, or with it: then it finds what is due, and sets the timer again
    signal.setitimer(signal.ITIMER_REAL, max(first - _clock(), 0.001))
    _armed_at = first  # after: a stop's shorten() in between set an earlier one, which the next _arm restores


@contextlib.contextmanager
def within(seconds: float, what: str, kind: str = "call") -> Iterator[Due]:
    """Raise DeadlineExceeded if the block is still running ``seconds`` from now (``inf``: no bound). Yields
    the deadline, so a caller can tell its own (``exc.due is due``) from one around it."""
    due = Due(_clock() + max(seconds, 0.0) if not math.isinf(seconds) else math.inf, what, kind)
    if math.isinf(due.at):
        yield due
        return
    _state.stack.append(due)
    _arm()
    try:
        yield due
    finally:
        if due in _state.stack:  # not settled
            _state.stack.remove(due)
        _arm()  # a timer set for an earlier end is left to fall early (no system call); none set is set now


def until(at_monotonic: float, what: str, kind: str = "call") -> contextlib.AbstractContextManager[Due]:
    """Like :func:`within`, for an absolute monotonic time."""
    return within(at_monotonic - _clock(), what, kind)


def settle(due: Due) -> None:
    """``due`` has been acted on by its own caller, who saw it pass between reads: its alarm falls no more,
    so what the caller does about it (interrupt the prompt, record the outcome) is not cut by it."""
    if due in _state.stack:
        _state.stack.remove(due)
        _arm()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """No DeadlineExceeded inside the block (a queue transaction); one that fell is raised as it ends."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    if not _state.deferring:
        fell, _state.fell = _state.fell, None
        if fell is not None and (fell in _state.stack or fell is _state.ceiling):
            raise DeadlineExceeded(fell)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No deadline in force inside the block, a stop's included (an interrupt that must finish after the
    deadline that caused it; its own calls keep their own bounds); those around it come back as it ends."""
    saved, _state.stack = _state.stack, []
    ceiling, _state.ceiling = _state.ceiling, None
    _arm()
    try:
        yield
    finally:
        _state.stack = saved
        if ceiling is not None and (_state.ceiling is None or ceiling.at < _state.ceiling.at):
            _state.ceiling = ceiling  # a stop asked for inside the block stays too
        _arm()


def remaining() -> float:
    """Seconds until the earliest deadline in force (``inf`` when none)."""
    due = _earliest(_state)
    return math.inf if due is None else due.at - _clock()


def check() -> None:
    """Raise DeadlineExceeded when the earliest deadline has passed: for loops between reads, and for
    threads that the timer cannot interrupt."""
    due = _earliest(_state)
    if due is not None and _clock() >= due.at:
        raise DeadlineExceeded(due)


def shorten(seconds: float, what: str) -> None:
    """Bring every deadline in force, now and later, to at most ``seconds`` from now (kind ``stop``): a stop
    asked for by SIGTERM gives the running job ``grace_seconds``, wherever it is blocked. Safe to call from
    a signal handler."""
    at = _clock() + max(seconds, 0.0)
    if _state.ceiling is None or at < _state.ceiling.at:
        _state.ceiling = Due(at, what, "stop")
    _arm()


def reset() -> None:
    """Forget every deadline and disarm the timer (a forked child starts clean); ``keep_between`` is forgotten too."""
    global _keep
    _keep = False
    _state.stack.clear()
    _state.ceiling = None
    _state.deferring = 0
    _state.fell = None
    if _is_main():
        _release()
