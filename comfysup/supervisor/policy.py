"""The restart policy of one supervised process, as a small pure state machine (supervisord's style).

States: ``stopped`` → ``starting`` (spawned, not yet answering) → ``running`` (it answered). An exit, a
failed spawn or no answer within ``startup_seconds`` sends it to ``backoff``, from which it is spawned
again after ``min(max_delay_seconds, 1 s × 2^(n-1))``, n being the quick failures in a row; after
``max_quick_failures`` of them it is ``failed`` and left alone, so a server that cannot start does not
loop and the other slots keep working. A quick failure is an exit within ``quick_failure_seconds`` of
the start, an exit before it ever answered (a boot failure, however long it took), a spawn that failed,
or no answer within ``startup_seconds``. ``stopping`` is a deliberate stop (recycling): its exit is not
a failure, and the process is spawned again at once.

Nothing here touches the OS: the supervisor feeds observations (``exited``, ``answered``) and ``now``
into :meth:`Policy.transition` and carries out the returned actions, so the whole table is tested by
setting a state and calling ``transition(now)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    FAILED = "failed"


class Action(enum.StrEnum):
    SPAWN = "spawn"
    """Start the process now."""
    TERM = "term"
    """Ask it to stop (SIGTERM to its process group)."""
    KILL = "kill"
    """Kill it now (SIGKILL to its process group)."""


@dataclass(frozen=True)
class Limits:
    """No defaults here: they are declared once, in comfysup.config, and the supervisor builds its Limits
    from the config (comfysup.supervisor.children.limits_from)."""

    startup_seconds: float
    quick_failure_seconds: float
    max_quick_failures: int
    max_delay_seconds: float
    stop_seconds: float
    """How long a deliberate stop (SIGTERM) may take before SIGKILL."""


def backoff_delay(failures: int, max_delay_seconds: float) -> float:
    """1 s, 2 s, 4 s … capped: the n-th restart in a row of a failing process (n ≥ 1)."""
    return min(max_delay_seconds, 2.0 ** (max(failures, 1) - 1))


@dataclass
class Policy:
    """One process's restart state. Mutated only by its own methods; every method takes ``now``."""

    limits: Limits
    state: State = State.STOPPED
    started_at: float | None = None
    answered_at: float | None = None
    quick_failures: int = 0
    restarts: int = 0
    """Spawns after the first one, whatever the reason (shown to people)."""
    retry_at: float | None = None
    stop_deadline: float | None = None
    awaiting_exit: bool = False
    """A kill was sent from a state that does not wait for the exit itself (startup timeout)."""
    reason: str = ""
    """Why the last restart, backoff or failure happened, for status."""
    spawned_once: bool = False

    # -- inputs ---------------------------------------------------------------------------------------

    def transition(self, now: float, *, exited: str | None = None, answered: bool = False,
                   recycle: str | None = None) -> list[Action]:
        """Advance by one observation. ``exited``: how the process ended, if it did since the last call;
        ``answered``: it answered its readiness check; ``recycle``: why it should be restarted on purpose."""
        if exited is not None and self.awaiting_exit:
            self.awaiting_exit = False
            exited = None  # its failure was already counted when the kill was sent
        handler = getattr(self, f"_in_{self.state.value}")
        return handler(now, exited, answered, recycle)

    def spawned(self, now: float) -> None:
        """The supervisor started the process (after a SPAWN action)."""
        self.state = State.STARTING
        self.started_at = now
        self.answered_at = None
        if self.spawned_once:
            self.restarts += 1
        self.spawned_once = True

    def spawn_failed(self, now: float, reason: str) -> None:
        """The spawn itself failed (port taken, executable missing): a quick failure."""
        if self.spawned_once:
            self.restarts += 1
        self.spawned_once = True
        self.started_at = now
        self._failure(now, reason, quick=True)

    def start_failed(self, now: float, reason: str) -> list[Action]:
        """The process answers but its start did not succeed (a failed warm-up): a quick failure, as no answer
        within ``startup_seconds`` is; the process is killed and its exit is not counted again."""
        if self.state is not State.STARTING:
            return []
        self._failure(now, reason, quick=True)
        self.awaiting_exit = True
        return [Action.KILL]

    def stop(self) -> None:
        """The supervisor is shutting down: no more restarts whatever happens."""
        self.state = State.STOPPED
        self.retry_at = None

    # -- the table ------------------------------------------------------------------------------------

    def _in_stopped(self, now: float, exited: str | None, answered: bool, recycle: str | None) -> list[Action]:
        if not self.spawned_once:
            return [Action.SPAWN]
        return []

    def _in_starting(self, now: float, exited: str | None, answered: bool, recycle: str | None) -> list[Action]:
        assert self.started_at is not None
        if exited is not None:
            return self._failure(now, f"exited before it answered: {exited}", quick=True)
        if answered:
            self.state = State.RUNNING
            self.answered_at = now
            return self._in_running(now, None, False, recycle)
        if now - self.started_at >= self.limits.startup_seconds:
            self._failure(now, f"no answer within {self.limits.startup_seconds:g} s of its start", quick=True)
            self.awaiting_exit = True
            return [Action.KILL]
        return []

    def _in_running(self, now: float, exited: str | None, answered: bool, recycle: str | None) -> list[Action]:
        assert self.started_at is not None
        up = now - self.started_at
        if exited is not None:
            quick = up < self.limits.quick_failure_seconds
            return self._failure(now, f"{exited} after {up:.1f} s", quick=quick)
        if up >= self.limits.quick_failure_seconds:
            self.quick_failures = 0  # it stayed up: a later crash starts the delays from 1 s again
        if recycle is not None:
            self.state = State.STOPPING
            self.reason = recycle
            self.stop_deadline = now + self.limits.stop_seconds
            return [Action.TERM]
        return []

    def _in_stopping(self, now: float, exited: str | None, answered: bool, recycle: str | None) -> list[Action]:
        if exited is not None:
            self.stop_deadline = None
            self.quick_failures = 0
            return [Action.SPAWN]
        if self.stop_deadline is not None and now >= self.stop_deadline:
            self.stop_deadline = None  # once: then wait for the exit the kill brings
            return [Action.KILL]
        return []

    def _in_backoff(self, now: float, exited: str | None, answered: bool, recycle: str | None) -> list[Action]:
        if self.awaiting_exit or self.retry_at is None or now < self.retry_at:
            return []
        return [Action.SPAWN]

    def _in_failed(self, now: float, exited: str | None, answered: bool, recycle: str | None) -> list[Action]:
        return []

    def _failure(self, now: float, reason: str, *, quick: bool) -> list[Action]:
        self.quick_failures = self.quick_failures + 1 if quick else 0
        self.answered_at = None
        if self.quick_failures >= self.limits.max_quick_failures:
            self.state = State.FAILED
            self.retry_at = None
            self.reason = f"failed after {self.quick_failures} quick failures in a row, last: {reason}"
            return []
        delay = backoff_delay(self.quick_failures, self.limits.max_delay_seconds)
        self.state = State.BACKOFF
        self.retry_at = now + delay
        self.reason = f"{reason}; restart in {delay:g} s"
        return []
