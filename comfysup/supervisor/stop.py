"""The shutdown as a small pure state machine: runners first (their grace), then servers, the monitor last.

Like :class:`comfysup.supervisor.policy.Policy`, nothing here touches the OS. The caller says what is
still alive and what time it is; :meth:`StopPlan.step` returns what to signal, as (target, action) pairs
using the policy's :class:`~comfysup.supervisor.policy.Action` (TERM: ask, KILL: SIGKILL), and says when
the shutdown is over. So the whole table is tested by setting a phase and calling ``step(now)``.

Phases: ``runners`` (SIGTERM sent; they get ``grace_seconds`` plus a margin to interrupt their prompt and
release their claim) → ``killing runners`` (SIGKILLed after that; their claims are released by whoever
reaps them) → ``servers`` (SIGTERM, then SIGKILL after ``KILL_WAIT_SECONDS``) → ``monitor`` (last, so
webhooks of jobs that ended during the grace go out) → ``done``. A second signal is a cold stop: runners
and servers are SIGKILLed at once (``killed``), then the monitor is stopped as usual.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from comfysup.supervisor.policy import Action

RUNNER_STOP_MARGIN_SECONDS = 10.0
"""After the grace, how long a runner may take to interrupt its prompt and release its claim."""
KILL_WAIT_SECONDS = 5.0
"""How long a SIGTERMed server may take to exit, and how long a SIGKILLed child is waited for."""
MONITOR_STOP_SECONDS = 3.0
"""How long the monitor may take to finish a webhook try and close its endpoint at the end."""


class Phase(enum.StrEnum):
    RUNNING = "running"
    """Not stopping."""
    RUNNERS = "runners"
    KILLING_RUNNERS = "killing runners"
    SERVERS = "servers"
    KILLED = "killed"
    """A cold stop: everything but the monitor was SIGKILLed."""
    MONITOR = "monitor"
    DONE = "done"


class Target(enum.StrEnum):
    RUNNERS = "runners"
    SERVERS = "servers"
    MONITOR = "monitor"


Step = list[tuple[Target, Action]]


@dataclass
class StopPlan:
    """Where a shutdown is. Mutated only by its own methods; every method takes ``now``."""

    phase: Phase = Phase.RUNNING
    deadline: float = 0.0
    cold: bool = False
    killed: bool = False
    """The SIGKILL of the current phase (servers, monitor) was sent: now only its exit is waited for."""

    @property
    def stopping(self) -> bool:
        return self.phase is not Phase.RUNNING

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def keeps_monitor(self) -> bool:
        """The monitor is still restarted when it dies: webhooks of jobs that end in the grace go out."""
        return self.phase in (Phase.RUNNING, Phase.RUNNERS, Phase.KILLING_RUNNERS)

    def begin(self, now: float, grace_seconds: float) -> Step:
        """The first SIGTERM: runners stop claiming and get their grace."""
        if self.phase is not Phase.RUNNING:
            return []
        self._enter(Phase.RUNNERS, now + grace_seconds + RUNNER_STOP_MARGIN_SECONDS)
        return [(Target.RUNNERS, Action.TERM)]

    def cold_stop(self, now: float, grace_seconds: float) -> Step:
        """A second signal: kill runners and servers now (their claims go back without counting)."""
        if self.cold or self.phase in (Phase.MONITOR, Phase.DONE):
            return []
        actions = self.begin(now, grace_seconds)
        self.cold = True
        self._enter(Phase.KILLED, now + KILL_WAIT_SECONDS)
        return [*actions, (Target.RUNNERS, Action.KILL), (Target.SERVERS, Action.KILL)]

    def step(self, now: float, *, runners: bool, servers: bool, monitor: bool) -> Step:
        """Advance with what is still alive (un-reaped); returns what to signal. Several phases may pass
        in one call when what they wait for is already gone."""
        actions: Step = []
        while True:
            before = self.phase
            actions += getattr(self, f"_in_{before.name.lower()}")(now, runners, servers, monitor)
            if self.phase is before:
                return actions

    # -- the table ------------------------------------------------------------------------------------

    def _in_running(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        return []

    def _in_runners(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        if not runners:
            return self._stop_servers(now)
        if now >= self.deadline:
            self._enter(Phase.KILLING_RUNNERS, now + KILL_WAIT_SECONDS)
            return [(Target.RUNNERS, Action.KILL)]
        return []

    def _in_killing_runners(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        if not runners or now >= self.deadline:
            return self._stop_servers(now)
        return []

    def _in_servers(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        if not servers or (now >= self.deadline and self.killed):
            return self._stop_monitor(now, monitor)
        if now >= self.deadline:
            self.killed = True
            self.deadline = now + KILL_WAIT_SECONDS
            return [(Target.SERVERS, Action.KILL)]
        return []

    def _in_killed(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        if (not runners and not servers) or now >= self.deadline:
            return self._stop_monitor(now, monitor)
        return []

    def _in_monitor(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        if not monitor or (now >= self.deadline and self.killed):
            self._enter(Phase.DONE, now)
            return []
        if now >= self.deadline:
            self.killed = True
            self.deadline = now + KILL_WAIT_SECONDS
            return [(Target.MONITOR, Action.KILL)]
        return []

    def _in_done(self, now: float, runners: bool, servers: bool, monitor: bool) -> Step:
        return []

    def _stop_servers(self, now: float) -> Step:
        self._enter(Phase.SERVERS, now + KILL_WAIT_SECONDS)
        return [(Target.SERVERS, Action.TERM)]

    def _stop_monitor(self, now: float, monitor: bool) -> Step:
        self._enter(Phase.MONITOR, now + MONITOR_STOP_SECONDS)
        return [(Target.MONITOR, Action.TERM)] if monitor else []

    def _enter(self, phase: Phase, deadline: float) -> None:
        self.phase = phase
        self.deadline = deadline
        self.killed = False
