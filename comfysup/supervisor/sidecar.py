"""A sidecar: a child the supervisor keeps alive beside the monitor, started by a function it is handed.

``comfysup run`` hands it the RabbitMQ consumer (comfysup.broker), so the supervisor owns the process
(forked, reaped, restarted by a ``Policy`` like the monitor, up as soon as it is forked, stopped last with
the monitor) without importing any broker client: a front door sits above the supervisor's layer.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from comfysup.supervisor.children import next_restart
from comfysup.supervisor.manager import ProcessManager
from comfysup.supervisor.policy import Action, Limits, Policy, State
from comfysup.supervisor.process import ProcessOps

log = logging.getLogger("comfysup.supervisor")


@dataclass
class Sidecar:
    name: str
    main: Callable[[], int]
    """Runs in the forked child; its return value is the exit code."""
    limits: Limits
    pid: int | None = None
    policy: Policy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = Policy(self.limits)

    def step(self, now: float, manager: ProcessManager, ops: ProcessOps) -> None:
        answered = self.policy.state is State.STARTING and self.pid is not None  # up once forked
        for action in self.policy.transition(now, answered=answered):
            if action is Action.SPAWN:
                self.pid = manager.fork(f"comfysup-{self.name}", self.main)
                self.policy.spawned(now)
                log.info("%s started, pid %d", self.name, self.pid)
            elif self.pid is not None:
                ops.kill(self.pid, signal.SIGKILL)

    def exited(self, now: float, how: str, *, restart: bool) -> None:
        self.pid = None
        if not restart:
            self.policy.stop()
            return
        self.policy.transition(now, exited=how)
        if self.policy.state is State.FAILED:
            log.error("%s exited (%s): not restarted until comfysup is restarted; %s", self.name, how,
                      self.policy.reason)
        else:
            log.warning("%s exited (%s)%s", self.name, how, next_restart(self.policy, now))

    def signal(self, ops: ProcessOps, sig: int) -> None:
        if self.pid is not None:
            ops.kill(self.pid, sig)

    def kill(self, ops: ProcessOps) -> None:
        if self.pid is not None:
            ops.kill(self.pid, signal.SIGKILL)
            ops.wait_pid(self.pid)
            self.pid = None
