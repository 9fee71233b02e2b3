"""The arbiter: one ComfyUI server and one runner per slot, kept alive, stopped cleanly.

Like gunicorn's arbiter, signal handlers only record the signal (and wake the loop through a pipe); the
main loop reaps children with ``waitpid(WNOHANG)``, dispatches ``handle_<signal>``, and then manages the
processes. The supervisor decides; its parts carry out:

- :mod:`~comfysup.supervisor.children`: what the slots are and how servers and runners start;
  :mod:`~comfysup.supervisor.sidecars`: the monitor and the API, each a ``Sidecar`` like the broker consumer;
- :mod:`~comfysup.supervisor.manager`: signals, forks, reaping and the release of a dead runner's claims
  (the same process manager as ``comfysup work``); :mod:`~comfysup.supervisor.recycle`: recycling a server;
- :mod:`~comfysup.supervisor.policy` (restarts) and :mod:`~comfysup.supervisor.stop` (the shutdown): pure
  state machines that take ``now``, carried out by :mod:`~comfysup.supervisor.serving` (each slot's server)
  and :mod:`~comfysup.supervisor.shutdown` (the stop's signals); :mod:`~comfysup.supervisor.report`: the
  state file and systemd's notifications; :class:`~comfysup.supervisor.process.ProcessOps`: every OS call.

What the supervisor promises (docs/design.md, "The promise"):

- A runner's claims are released the moment its pid is reaped: the pid's death proves that nothing is
  acting on the job any more, so it does not wait for the lease. A runner that stops signalling that it
  is alive is SIGKILLed first, then released the same way; ``runner_timeout_seconds`` is checked to be
  shorter than the lease, so this always happens before the lease could hand the job to someone else.
- Every child dies with the supervisor (PR_SET_PDEATHSIG), so a new supervisor can release the claims
  of runners that no longer exist without fear that one still runs.
- SIGTERM: stop claiming, let the runners use their grace, then stop the servers. Claims of runners
  that had to be killed at the end are released without counting an attempt.
- The supervisor stays single-threaded, because it forks runners for as long as it lives: /metrics, the
  status page and webhooks run in a monitor child, restarted when it dies and stopped last (with the API).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from comfysup.config import Config, check_supervisor
from comfysup.queue import Queue, open_queue
from comfysup.queue.watch import QueueWatch
from comfysup.runner.objectstore import check_buckets
from comfysup.runner.staging import StagingBound
from comfysup.supervisor import orders, recycle, stuck, vram
from comfysup.supervisor import server as servers
from comfysup.supervisor.children import (
    Shared,
    Unit,
    build_units,
    check_comfyui,
    next_restart,
    output_dirs,
    prepare_runner,
    runner_main,
)
from comfysup.supervisor.lock import EXIT_DATABASE_REPLACED, AlreadyRunning, queue_lost, take_lock
from comfysup.supervisor.manager import ProcessManager, release_stale_claims
from comfysup.supervisor.policy import Action, State
from comfysup.supervisor.process import ProcessOps, describe_status
from comfysup.supervisor.report import EXIT_NO_SLOT_ALIVE, Reporter, heartbeat_machine, no_slot_alive
from comfysup.supervisor.serving import ServerDriver
from comfysup.supervisor.shutdown import Shutdown
from comfysup.supervisor.sidecar import Sidecar
from comfysup.supervisor.sidecars import Monitor, api_sidecar
from comfysup.supervisor.stop import (
    KILL_WAIT_SECONDS,
    MONITOR_STOP_SECONDS,
    RUNNER_STOP_MARGIN_SECONDS,
    StopPlan,
)

__all__ = ["KILL_WAIT_SECONDS", "MONITOR_STOP_SECONDS", "RUNNER_STOP_MARGIN_SECONDS", "AlreadyRunning", "Shared",
           "Supervisor", "Unit"]

log = logging.getLogger("comfysup.supervisor")

TICK_SECONDS = 0.25
"""The loop wakes at least this often; signals and child exits wake it at once."""
STARTING_LOOK_SECONDS = 0.02
"""While a launched server starts, how often the supervisor looks whether it answers (between two ticks)."""
HOUSEKEEPING_SECONDS = 5.0
"""How often log sizes and servers' memory are checked."""


@dataclass
class Supervisor:
    config: Config
    ops: ProcessOps = field(default_factory=ProcessOps)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    clock: Any = time.monotonic
    sidecars: list[Sidecar] = field(default_factory=list)
    """Children handed in by the command (the RabbitMQ consumer), kept alive like the monitor."""

    def __post_init__(self) -> None:
        self.units: list[Unit] = []
        self.manager = ProcessManager(self.ops)
        self.plan = StopPlan()
        self.shutdown = Shutdown(self.plan, self.manager, self.ops)
        self.finished = False
        self.exit_code = 0
        self.reporter = Reporter(self.config, self.env)
        self.notifier = self.reporter.notifier
        self.queue: Queue | None = None
        self.watch: QueueWatch | None = None  # the queue's file, looked at every tick (the monitor's deep check)
        self.state_path = self.reporter.state_path
        self.state_dir = self.state_path.parent
        self._next_housekeeping = 0.0
        self.queue_ok = True
        """False while the queue database does not answer: runners are told not to claim."""
        self.staging = StagingBound(self.config)
        """Full while this machine's jobs waiting for the bucket hold [store] staging_max_gb: no claim either."""
        self.monitor_wanted = False
        """Set by run(): unit tests that tick a supervisor by hand fork no monitor, API or other sidecar."""
        self.monitor_hub = Monitor(self.config)
        self.monitor = self.monitor_hub.sidecar
        self.api = api_sidecar(self.config, self.env, self.state_dir)
        self.children = [self.monitor, self.api, *self.sidecars]
        """Every sidecar (comfysup.supervisor.sidecars), started, watched, restarted and stopped alike."""
        self.serving = ServerDriver(self.config, self.ops, self.env)
        self.idle = vram.IdleWatch(self.config.comfyui.idle_vram_free_mb)  # VRAM held by idle servers (NVML)

    @property
    def stopping(self) -> bool:
        return self.plan.stopping

    # -- setup ------------------------------------------------------------------------------------------

    def build_units(self) -> list[Unit]:
        """A unit per slot from ``gpus``, then one per [[servers]] entry."""
        return build_units(self.config, self.env)

    def release_stale_claims(self) -> list[str]:
        """Claims held by runners of an earlier supervisor on this host that no longer exist."""
        assert self.queue is not None
        return release_stale_claims(self.queue)

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self) -> int:
        check_supervisor(self.config)
        self.units = self.build_units()
        check_comfyui(self.config, self.units)
        for warning in check_buckets(self.config):  # wrong credentials or no bucket: refused here, not per job
            log.warning("%s", warning)
        self.manager.hold(take_lock(self.state_dir))  # one per queue folder: two would fight over ports and claims
        self.queue = open_queue(self.config, create=True)
        self.watch = QueueWatch(self.queue, every_seconds=0.0)
        self.release_stale_claims()
        self.heartbeat_machine(register=True)
        self.manager.install_signals()
        log.info("comfysup supervisor %d: %s", os.getpid(),
                 ", ".join(f"{u.name} ({u.device}, {u.url})" for u in self.units))
        dropped = servers.dropped_args(self.config)
        if dropped:
            log.warning("[comfyui] extra_args: ComfyUI %s no longer accepts %s; not passed",
                        servers.launched_version(self.config), " ".join(dropped))
        self.monitor_wanted = True
        try:
            while not self.finished:
                self.tick(self.clock())
                if not self.finished:
                    self.wait_for_tick()
        finally:
            for child in self.children:
                child.kill(self.ops)
            self.manager.restore_signals()
            self.write_state(final=True)
            if self.queue_ok and self.exit_code != EXIT_DATABASE_REPLACED:  # status: "stopped", not STALE
                heartbeat_machine(self.queue, self.units, register=False, was_ok=True, final=True)
            self.queue.close()
        log.info("comfysup supervisor %d: stopped%s", os.getpid(),
                 f" (exit code {self.exit_code})" if self.exit_code else "")
        return self.exit_code

    def wait_for_tick(self) -> None:
        """Until the next tick: TICK_SECONDS, a signal or a child's exit, or, while a launched server starts, the
        moment it answers (looked at every STARTING_LOOK_SECONDS): its runner may then claim without waiting out
        the rest of a tick."""
        starting = self.serving.awaited(self.units)
        if not starting:
            self.manager.wait(TICK_SECONDS)
            return
        end = time.monotonic() + TICK_SECONDS  # real time: these waits are real, whatever clock ticks are given
        while True:
            left = end - time.monotonic()
            if left <= 0 or self.manager.wait(min(STARTING_LOOK_SECONDS, left)) or self.serving.any_answers(starting):
                return

    def tick(self, now: float) -> None:
        """One pass: signals, exits, servers, runners, recycling, housekeeping, state for people."""
        for sig in self.manager.pop_signals():
            self.handle_signal(sig, now)
        self._reap(now)
        if self.finished:
            return
        self._check_database(now)
        if self.plan.keeps_monitor and self.monitor_wanted:
            for child in self.children:  # webhooks and API answers of jobs that end in the grace still go out
                child.step(now, self.manager, self.ops)
        if not self.stopping:
            for unit in self.units:
                for action in (*stuck.step(unit, now), *vram.restart_step(unit, now)):
                    self.serving.act(unit, now, action)
                self.serving.step(unit, now)
                self._runner_step(unit, now)
                for action in recycle.step(unit, self.config.supervisor.recycle_after_jobs, now, TICK_SECONDS / 2):
                    self.serving.act(unit, now, action)  # after N jobs, once the runner is drained
            self._give_up_if_no_slot(now)
            if now >= self._next_housekeeping:
                self._next_housekeeping = now + HOUSEKEEPING_SECONDS
                self._housekeeping(now)
        else:
            self._stop_step(now)
        staging_full = self.staging.look(self.queue, now)
        for unit in self.units:
            unit.shared.may_claim = int(not self.stopping and unit.usable and self.queue_ok and not staging_full)
        self.reporter.notify(self.units, now, stopping=self.stopping)
        self.write_state()

    # -- signals ----------------------------------------------------------------------------------------

    def handle_signal(self, sig: int, now: float) -> None:
        """gunicorn's dispatch: ``handle_<name>`` for each queued signal."""
        handler = getattr(self, f"handle_{signal.Signals(sig).name.lower()}", None)
        if handler is not None:
            handler(now)

    def handle_sigterm(self, now: float) -> None:
        self._stop_signal(now, "SIGTERM")

    def handle_sigint(self, now: float) -> None:
        self._stop_signal(now, "SIGINT")

    def handle_sighup(self, now: float) -> None:
        log.info("SIGHUP ignored: restart the service to read a changed config")

    def _stop_signal(self, now: float, name: str) -> None:
        if not self.stopping:
            self.begin_stop(now, name)
        elif not self.plan.cold:
            self.cold_stop(now, name)

    def begin_stop(self, now: float, why: str) -> None:
        grace = self.config.runner.grace_seconds
        log.info("%s: stopping; running jobs get %g s to finish, then are interrupted and released", why, grace)
        actions = self.plan.begin(now, grace)
        self.reporter.stopping(f"stopping: running jobs have {grace:g} s to finish")
        for unit in self.units:
            unit.shared.may_claim = 0
        self.shutdown.carry_out(actions, self.units, self.children)

    def cold_stop(self, now: float, why: str) -> None:
        """A second signal: kill everything now; claims go back to the queue without counting."""
        log.info("%s again: cold stop, killing runners and servers now", why)
        if not self.stopping:
            self.begin_stop(now, why)
        self.shutdown.carry_out(self.plan.cold_stop(now, self.config.runner.grace_seconds), self.units,
                                self.children)

    def _stop_step(self, now: float) -> None:
        actions = self.plan.step(now, runners=any(u.runner_pid is not None for u in self.units),
                                 servers=any(u.server_pid is not None for u in self.units),
                                 monitor=any(c.pid is not None for c in self.children))
        self.shutdown.carry_out(actions, self.units, self.children)
        if self.plan.done:
            self.finished = True

    # -- children that ended ----------------------------------------------------------------------------

    def _reap(self, now: float) -> None:
        for pid, status in self.manager.reap():
            how = describe_status(status)
            self._check_database(now, status, pid)  # before its restart is weighed
            for child in self.children:
                if child.pid == pid:
                    child.exited(now, status, how, restart=self.plan.keeps_monitor)
                    if child is self.monitor:
                        self.monitor_hub.port.value = 0  # no status page until the next one has bound
            for unit in self.units:
                if unit.runner_pid == pid:
                    self._runner_exited(unit, now, how)
                elif unit.server_pid == pid:
                    self.serving.exited(unit, now, how, stopping=self.stopping)

    def _runner_exited(self, unit: Unit, now: float, how: str) -> None:
        """Its claims are released at once (by the manager); then its policy says when it starts again."""
        kept = None if self.exit_code == EXIT_DATABASE_REPLACED else self.queue  # nothing to release in a lost file
        runner = self.manager.runner_exited(unit.runner_pid, how, kept, stopping=self.stopping)
        reason = runner.kill_reason if runner is not None else None
        unit.runner_pid = None
        unit.shared.job = b""
        unit.shared.waiting = 0  # a runner killed mid-wait does not say so itself; its successor will
        if self.stopping:
            unit.runner.stop()
            return
        for action in unit.runner.transition(now, exited=reason or how):
            self._runner_action(unit, now, action)
        level = logging.INFO if how == "exit code 0" else logging.WARNING
        log.log(level, "%s: runner exited (%s)%s", unit.name, reason or how, next_restart(unit.runner, now))

    # -- runners ----------------------------------------------------------------------------------------

    def _runner_step(self, unit: Unit, now: float) -> None:
        policy = unit.runner
        alive = unit.shared.alive
        answered = policy.state is State.STARTING and policy.started_at is not None and alive > policy.started_at
        for action in policy.transition(now, answered=answered):
            self._runner_action(unit, now, action)
        timeout = self.config.supervisor.runner_timeout_seconds
        runner = self.manager.runners.get(unit.runner_pid) if unit.runner_pid is not None else None
        if policy.state is State.RUNNING and runner is not None and runner.kill_reason is None \
                and now - alive > timeout:
            reason = f"silent for {now - alive:.0f} s (runner_timeout_seconds = {timeout:g})"
            log.warning("%s: runner %d %s; killing it", unit.name, runner.pid, reason)
            self.manager.kill_runner(runner.pid, reason)

    def _runner_action(self, unit: Unit, now: float, action: Action) -> None:
        if action is Action.SPAWN:
            self._fork_runner(unit, now)
        elif unit.runner_pid is not None:
            self.manager.kill_runner(unit.runner_pid, unit.runner.reason.split(";")[0])

    def _fork_runner(self, unit: Unit, now: float) -> None:
        prepare_runner(unit, now, may_claim=not self.stopping and unit.usable)
        peers = {u.name: u.url for u in self.units}
        outputs = self.config.server_output_dirs() | output_dirs(self.units)
        runner = self.manager.fork_runner(unit.name,
                                          lambda token: runner_main(self.config, unit, peers, token, outputs,
                                                                    [u.shared for u in self.units if u is not unit]))
        unit.runner_pid = runner.pid
        unit.runner.spawned(now)
        log.info("%s: runner started, pid %d", unit.name, runner.pid)

    def _check_database(self, now: float, status: int | None = None, pid: int = 0) -> None:
        """Every tick and at a child's exit: a queue file lost (comfysup.queue.watch, here or in a child that exited
        with EXIT_DATABASE_REPLACED) stops everyone now, and the supervisor exits with that code, restarting no one."""
        child = next((c.name for c in self.children if c.pid == pid), f"runner (pid {pid})")
        why = None if self.exit_code else queue_lost(self.watch, status, child)
        if why is None:
            return
        log.error("%s so that comfysup starts again on the file at the path", why)
        self.exit_code = EXIT_DATABASE_REPLACED
        if not self.stopping:
            self.begin_stop(now, "queue database lost")
        self.shutdown.carry_out(self.plan.cold_stop(now, self.config.runner.grace_seconds), self.units,
                                self.children)

    def heartbeat_machine(self, register: bool = False) -> None:
        """Tell the queue this machine is alive and what its slots do (report.heartbeat_machine)."""
        if self.queue is not None:
            self.queue_ok = heartbeat_machine(self.queue, self.units, register=register, was_ok=self.queue_ok)

    def _give_up_if_no_slot(self, now: float) -> None:
        """Every slot failed: stop and exit non-zero for systemd's Restart=on-failure (no READY if none ran)."""
        why = no_slot_alive(self.units)
        if why is None or self.exit_code:
            return
        log.error("%s; no slot is alive, stopping (exit code %d)", why, EXIT_NO_SLOT_ALIVE)
        self.exit_code = EXIT_NO_SLOT_ALIVE
        self.begin_stop(now, "no slot alive")

    def _housekeeping(self, now: float) -> None:
        self.heartbeat_machine()
        if self.queue is not None and self.queue_ok:
            orders.carry_out(self.queue, self.units, now)
        for unit in self.units:
            recycle.housekeeping(unit, self.config.supervisor, now)
        self.idle.look(self.units, now)

    # -- what people and systemd see ---------------------------------------------------------------------

    def snapshot(self, *, final: bool = False) -> dict[str, Any]:
        return {**self.reporter.snapshot(self.units, stopping=self.stopping, monitor_pid=self.monitor.pid,
                                         monitor_port=self.monitor_hub.port.value, final=final),
                "staging": self.staging.snapshot()}

    def write_state(self, *, final: bool = False) -> None:
        """Looked at every tick, written when it changed (comfysup.slotstate.StateFile): ``comfysup status`` and
        ``health`` read it."""
        self.reporter.write_state(self.snapshot(final=final), final=final)

