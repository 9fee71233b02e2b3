"""Each slot's ComfyUI server, driven: its restart policy (:mod:`comfysup.supervisor.policy`, which decides)
stepped with what the server answers, and the policy's actions carried out as a spawn or a signal.

A server is ready when ``/system_stats`` answers and its warm-up has run; a server that exits is killed as a
process group (whatever it started goes too) and restarted when its policy says, or its slot is marked failed
after several quick failures. A server that comfysup does not launch is only asked its version.
"""

from __future__ import annotations

import logging
import signal
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from comfysup.comfy import probe
from comfysup.config import Config
from comfysup.supervisor import server as servers
from comfysup.supervisor import stuck, warming
from comfysup.supervisor.children import Unit, next_restart, spawn_server
from comfysup.supervisor.policy import Action, State
from comfysup.supervisor.process import ProcessOps
from comfysup.supervisor.versions import VersionWatch

log = logging.getLogger("comfysup.supervisor")


@dataclass
class ServerDriver:
    config: Config
    ops: ProcessOps
    env: dict[str, str]
    versions: VersionWatch = field(default_factory=VersionWatch)
    """Each server's ComfyUI version, learnt when it answers; warns once about an untested one."""

    def step(self, unit: Unit, now: float) -> None:
        """One tick of the unit's server: readiness while it starts, then its policy's transition."""
        policy = unit.server
        if policy is None:
            if self.versions.due(unit, now):
                self.versions.learn(unit)
            return
        answered = False
        if policy.state is State.STARTING and unit.server_pid is not None:
            unit.last_check = probe.readiness(unit.url, timeout_seconds=0.5)
            answered = not unit.last_check and warming.warmed(unit, now, self.config.comfyui, self.act)
        before = policy.state
        for action in policy.transition(now, answered=answered):
            self.act(unit, now, action)
        if before is State.STARTING and policy.state is not State.STARTING:
            unit.first_start_over = True
            if policy.state is State.RUNNING:
                self.versions.learn(unit)
                log.info("%s: ComfyUI answers on %s (%.1f s after its start)", unit.name, unit.url,
                         now - (policy.started_at or now))
            else:
                log.warning("%s: ComfyUI %s (last check: %s)", unit.name, policy.reason, unit.last_check or "-")
        if policy.state is State.FAILED and before is not State.FAILED:
            unit.first_start_over = True
            log.error("%s: slot failed: %s. The other slots keep working; fix the cause and restart comfysup",
                      unit.name, policy.reason)

    def awaited(self, units: list[Unit]) -> list[Unit]:
        """The launched servers that are starting and have not answered yet (a warm-up's wait is not theirs)."""
        return [u for u in units if u.server is not None and u.server.state is State.STARTING
                and u.server_pid is not None and u.warm_since is None]

    def any_answers(self, units: list[Unit]) -> bool:
        """Whether one of these servers answers now: its port accepts a connection (cheap while it refuses),
        then GET /system_stats answers."""
        for unit in units:
            where = urlsplit(unit.url)
            try:
                socket.create_connection((where.hostname, where.port or 80), timeout=0.2).close()
            except OSError:
                continue
            if not probe.readiness(unit.url, timeout_seconds=0.5):
                return True
        return False

    def act(self, unit: Unit, now: float, action: Action) -> None:
        """A policy's action on the unit's server: spawn it, or signal its process group."""
        assert unit.server is not None
        if action is Action.SPAWN:
            spawn_server(unit, self.config, self.ops, self.env, now)
        elif unit.server_pid is not None:
            self.ops.killpg(unit.server_pid, signal.SIGTERM if action is Action.TERM else signal.SIGKILL)

    def exited(self, unit: Unit, now: float, how: str, *, stopping: bool) -> None:
        """The unit's server was reaped: its process group killed, then restarted as its policy says."""
        pid = unit.server_pid
        unit.server_pid = None
        unit.comfyui_version, unit.features = None, {}  # a restart may run another ComfyUI
        assert pid is not None and unit.server is not None and unit.plan is not None
        self.ops.killpg(pid, signal.SIGKILL)  # anything it started, in its process group
        stuck.server_gone(unit)
        if stopping:
            unit.server.stop()
            log.info("%s: ComfyUI stopped (%s)", unit.name, how)
            return
        expected = unit.server.state is State.STOPPING
        for action in unit.server.transition(now, exited=how):
            self.act(unit, now, action)
        if not expected:
            tail = servers.log_tail(unit.plan.log_path)
            log.warning("%s: ComfyUI pid %d exited (%s)%s%s", unit.name, pid, how, next_restart(unit.server, now),
                        f"; last log lines: {tail}" if tail else "")
