"""The supervisor's stop, carried out: each action of the stop plan (:mod:`comfysup.supervisor.stop`, which
decides) as signals to the runners, the servers or the sidecars.

A runner is asked with SIGTERM (it finishes or releases its job) and killed by the process manager, which
releases its claims at once; a server is signalled as a process group, so whatever ComfyUI started goes too.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from comfysup.supervisor.children import Unit
from comfysup.supervisor.manager import ProcessManager
from comfysup.supervisor.policy import Action
from comfysup.supervisor.process import ProcessOps
from comfysup.supervisor.sidecar import Sidecar
from comfysup.supervisor.stop import KILL_WAIT_SECONDS, RUNNER_STOP_MARGIN_SECONDS, Step, StopPlan, Target

log = logging.getLogger("comfysup.supervisor")


@dataclass
class Shutdown:
    plan: StopPlan
    manager: ProcessManager
    ops: ProcessOps

    def carry_out(self, actions: Step, units: Sequence[Unit], sidecars: Sequence[Sidecar]) -> None:
        """The stop plan's actions, as signals."""
        for target, action in actions:
            if target is Target.RUNNERS:
                self.signal_runners(action, units)
            elif target is Target.SERVERS:
                self.signal_servers(action, units)
            else:
                sig = signal.SIGTERM if action is Action.TERM else signal.SIGKILL
                for child in sidecars:
                    child.signal(self.ops, sig)

    def signal_runners(self, action: Action, units: Sequence[Unit]) -> None:
        for unit in units:
            if unit.runner_pid is None:
                continue
            if action is Action.TERM:
                self.ops.kill(unit.runner_pid, signal.SIGTERM)
            elif self.plan.cold:
                self.manager.kill_runner(unit.runner_pid, "cold stop of the supervisor")
            else:
                log.warning("%s: runner %d still running %g s after the grace; killing it", unit.name,
                            unit.runner_pid, RUNNER_STOP_MARGIN_SECONDS)
                self.manager.kill_runner(unit.runner_pid, "did not stop within the grace")

    def signal_servers(self, action: Action, units: Sequence[Unit]) -> None:
        for unit in units:
            if unit.server_pid is None:
                continue
            if action is Action.TERM:
                log.info("%s: stopping ComfyUI (pid %d)", unit.name, unit.server_pid)
                self.ops.killpg(unit.server_pid, signal.SIGTERM)
                continue
            if not self.plan.cold:
                log.warning("%s: ComfyUI pid %d did not stop within %g s; killing it", unit.name,
                            unit.server_pid, KILL_WAIT_SECONDS)
            self.ops.killpg(unit.server_pid, signal.SIGKILL)
