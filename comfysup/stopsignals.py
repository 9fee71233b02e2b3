"""Stop signals (SIGTERM, SIGINT) that reach a forked child before it has installed its own handlers.

A child forked by ``run`` or ``work`` (a runner, the monitor, the broker's consumer) gives up its parent's
handlers at once (comfysup.supervisor.manager.ProcessManager.become_child) and installs its own only once it is set up:
a runner opens the queue and makes its clients first. A stop that came in between, under the default action,
killed it — ``comfysup work`` stopped right after its start then reported the runner "killed by SIGTERM" and
exited 1. Meanwhile the signals are held here instead, and :func:`install` hands them to the child's own
handler as it is installed, so the stop is honoured as if it had come a moment later.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_held: list[int] = []


def _hold(signum: int, frame: FrameType | None) -> None:
    _held.append(signum)


def hold() -> None:
    """In a just-forked child: keep the stop signals that come before :func:`install`, forget any that came
    to the parent's process before the fork."""
    _held.clear()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _hold)


def pending() -> bool:
    """A stop came before the handlers (a child still setting up, e.g. waiting for its database, must give up)."""
    return bool(_held)


def install(handler: Callable[[int, FrameType | None], Any] | int, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    """``handler`` for ``signals`` from now on, called at once for each of them held since :func:`hold`."""
    for sig in signals:
        signal.signal(sig, handler)
    held = [sig for sig in _held if sig in signals]
    _held[:] = [sig for sig in _held if sig not in signals]
    if callable(handler):
        for sig in held:
            handler(sig, None)
