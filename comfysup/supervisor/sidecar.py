"""A sidecar: a child the supervisor keeps alive beside the servers and runners, and stops last.

Three live in ``comfysup run``: the monitor (/metrics, the status page and webhook deliveries; forked), the
Comfy API v2 (``comfysup api``, spawned as its own command in its own process group) and the RabbitMQ
consumer (forked, handed in by the command: a front door sits above the supervisor's layer, so the supervisor
runs it without importing any broker client). Each is restarted by a ``Policy`` like a runner's, is up as
soon as it is started, and is stopped last, so webhooks and API answers about jobs that end during the grace
still go out.

A child that exits with ``BIND_FAILED`` could not bind its address: restarting cannot help. The sidecar's
``bind_failed`` hook says what then happens (the monitor starts again at once without its endpoint; the API
is not started again); without a hook the exit is an ordinary failure.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from comfysup.observability.monitor import BIND_FAILED
from comfysup.supervisor.children import next_restart
from comfysup.supervisor.manager import ProcessManager
from comfysup.supervisor.policy import Action, Limits, Policy, State
from comfysup.supervisor.process import ProcessOps

log = logging.getLogger("comfysup.supervisor")

__all__ = ["BIND_FAILED", "Sidecar"]


@dataclass
class Sidecar:
    name: str
    start: Callable[[ProcessManager, ProcessOps], int]
    """Starts the child (forked or spawned) and returns its pid; OSError: it could not be started."""
    limits: Limits
    group: bool = False
    """The child leads its own process group (a spawned command): signals go to the whole group."""
    bind_failed: Callable[[], bool] | None = None
    """Called when the child exited with BIND_FAILED: True starts it again at once, False never again."""
    about: str = ""
    """Said after the pid when it starts (where it listens, where it logs)."""
    pid: int | None = None
    wanted: bool = True
    """False once the child must not be started again (its address cannot be bound, or the end)."""
    policy: Policy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = Policy(self.limits)

    @classmethod
    def forked(cls, name: str, main: Callable[[], int], limits: Limits, **kwargs: object) -> Sidecar:
        """A child forked from the supervisor that runs ``main`` and exits with its return value."""
        return cls(name, lambda manager, _ops: manager.fork(f"comfysup-{name}", main), limits, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def spawned(cls, name: str, argv: Callable[[], list[str]], *, env: Mapping[str, str], log_path: Path, cwd: str,
                limits: Limits, **kwargs: object) -> Sidecar:
        """A child exec'd as a command of its own (``argv()``, asked at each start), leading its own process group
        (signals go to the whole group), dying with the supervisor, logging to ``log_path``."""
        return cls(name, lambda _manager, ops: ops.spawn(argv(), env=env, log_path=log_path, cwd=cwd), limits,  # type: ignore[arg-type]
                   group=True, **kwargs)

    def step(self, now: float, manager: ProcessManager, ops: ProcessOps) -> None:
        if not self.wanted:
            return
        answered = self.policy.state is State.STARTING and self.pid is not None  # up once started
        for action in self.policy.transition(now, answered=answered):
            if action is Action.SPAWN:
                try:
                    self.pid = self.start(manager, ops)
                except OSError as exc:
                    self.policy.spawn_failed(now, str(exc))
                    log.warning("cannot start the %s: %s%s", self.name, exc, next_restart(self.policy, now))
                    continue
                self.policy.spawned(now)
                log.info("%s started, pid %d%s", self.name, self.pid, f", {self.about}" if self.about else "")
            elif self.pid is not None:
                self._send(ops, signal.SIGKILL)

    def exited(self, now: float, status: int, how: str, *, restart: bool) -> None:
        self.pid = None
        if not restart:
            self.policy.stop()
            return
        if self.bind_failed is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == BIND_FAILED:
            if self.bind_failed():
                self.policy = Policy(self.limits)  # not a failure of the child: start it again now
            else:
                self.wanted = False
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
            self._send(ops, sig)

    def kill(self, ops: ProcessOps) -> None:
        """At the very end, whatever happened: the stop plan normally stopped it already."""
        self.wanted = False
        if self.pid is not None:
            self._send(ops, signal.SIGKILL)
            ops.wait_pid(self.pid)
            self.pid = None

    def _send(self, ops: ProcessOps, sig: int) -> None:
        assert self.pid is not None
        if self.group:
            ops.killpg(self.pid, sig)
        else:
            ops.kill(self.pid, sig)
