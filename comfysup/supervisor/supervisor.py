"""The arbiter: one ComfyUI server and one runner per slot, kept alive, stopped cleanly.

Like gunicorn's arbiter, signal handlers only record the signal (and wake the loop through a pipe); the
main loop reaps children with ``waitpid(WNOHANG)``, acts on the signals, and then manages the
processes. Decisions about restarting are made by :mod:`comfysup.supervisor.policy`; every OS call goes
through :class:`comfysup.supervisor.process.ProcessOps`.

What the supervisor promises (DESIGN.md, "The promise"):

- A runner's claims are released the moment its pid is reaped: the pid's death proves that nothing is
  acting on the job any more, so it does not wait for the lease. A runner that stops signalling that it
  is alive is SIGKILLed first, then released the same way; ``runner_timeout_seconds`` is checked to be
  shorter than the lease, so this always happens before the lease could hand the job to someone else.
- Every child dies with the supervisor (PR_SET_PDEATHSIG), so a new supervisor can release the claims
  of runners that no longer exist without fear that one still runs.
- SIGTERM: stop claiming, let the runners use their grace, then stop the servers. Claims of runners
  that had to be killed at the end are released without counting an attempt.
- The supervisor stays single-threaded, because it forks runners for as long as it lives: /metrics, the
  status page and webhook deliveries run in a monitor child (comfysup.observability.monitor), forked like a
  runner and restarted when it dies; it stops last, so webhooks of jobs that end during the grace go out.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import multiprocessing.sharedctypes
import os
import select
import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from comfysup.config import Config, check_supervisor, parse_gpus
from comfysup.errors import ComfysupError, ConfigError, QueueError
from comfysup.gpus import Slot, discover, slots_for
from comfysup.observability.monitor import BIND_FAILED
from comfysup.queue import Queue, open_queue
from comfysup.queue.base import Claim, host_name
from comfysup.runner.attempt import Outcome
from comfysup.runner.loop import make_owner, owner_pid
from comfysup.slotstate import STATE_FILE, state_path
from comfysup.supervisor import server as servers
from comfysup.supervisor.notify import Notifier
from comfysup.supervisor.policy import Action, Limits, Policy, State
from comfysup.supervisor.process import ProcessOps, SpawnError, describe_status, set_name

log = logging.getLogger("comfysup.supervisor")

TICK_SECONDS = 0.25
"""The loop wakes at least this often; signals and child exits wake it at once."""
HOUSEKEEPING_SECONDS = 5.0
"""How often log sizes and servers' memory are checked."""
RUNNER_STOP_MARGIN_SECONDS = 10.0
"""After the grace, how long a runner may take to interrupt its prompt and release its claim."""
KILL_WAIT_SECONDS = 5.0
"""How long a SIGTERMed server may take to exit, and how long a SIGKILLed child is waited for."""
MONITOR_STOP_SECONDS = 3.0
"""How long the monitor may take to finish a webhook try and close its endpoint at the end."""
MONITOR_MAX_DELAY_SECONDS = 30.0
LOCK_FILE = "supervisor.lock"


class AlreadyRunning(ComfysupError):
    """Another comfysup run uses this queue on this machine."""


class Shared(ctypes.Structure):
    """What a runner tells the supervisor through shared memory (no lock: single writers, and a lock
    held by a runner killed with SIGKILL would stall the supervisor)."""

    _fields_ = (
        ("alive", ctypes.c_double),  # time.monotonic() of the runner's last sign of life (one clock for all)
        ("may_claim", ctypes.c_int),  # by the supervisor: 0 while the server is not running, draining, stopping
        ("busy", ctypes.c_int),  # by the runner: 1 from a may_claim that said yes until its next may_claim call
        ("jobs", ctypes.c_long),  # attempts finished by this slot's runners (for recycle_after_jobs)
        ("recycle_at", ctypes.c_long),  # by the supervisor: claim nothing once jobs reaches this (0: never)
        ("job", ctypes.c_char * 40),  # the job id being run, or empty
    )


@dataclass
class Unit:
    """A slot: its server (None for a [[servers]] entry, which is used as it is) and its runner."""

    name: str
    device: str
    url: str
    plan: servers.ServerPlan | None
    server: Policy | None
    runner: Policy
    shared: Any
    server_pid: int | None = None
    runner_pid: int | None = None
    runner_owner: str | None = None
    runner_kill_reason: str | None = None
    jobs_at_server_start: int = 0
    draining: str | None = None
    draining_since: float = 0.0
    first_start_over: bool = False
    last_rss_mb: float = 0.0

    @property
    def state(self) -> str:
        return "external" if self.server is None else self.server.state.value

    @property
    def usable(self) -> bool:
        """The runner may claim: its server answers and is not being recycled."""
        return self.draining is None and (self.server is None or self.server.state is State.RUNNING)


@dataclass
class StopPlan:
    """Where a shutdown is: runners first (grace), then servers."""

    phase: str = "runners"
    deadline: float = 0.0
    cold: bool = False
    servers_killed: bool = False


@dataclass
class Supervisor:
    config: Config
    ops: ProcessOps = field(default_factory=ProcessOps)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    clock: Any = time.monotonic

    def __post_init__(self) -> None:
        self.units: list[Unit] = []
        self.signals: list[int] = []
        self.stop: StopPlan | None = None
        self.finished = False
        self.notifier = Notifier(self.env)
        self.queue: Queue | None = None
        self.started_at = time.time()
        self.state_path = state_path(self.config)
        self.state_dir = self.state_path.parent
        self._wake_r = self._wake_w = -1
        self._lock_file: Any = None
        self._next_housekeeping = 0.0
        self._previous_handlers: dict[int, Any] = {}
        self.queue_ok = True
        """False while the queue database does not answer: runners are told not to claim."""
        self.monitor_wanted = False
        """Set by run(): unit tests that tick a supervisor by hand fork no monitor."""
        self.monitor_pid: int | None = None
        self.monitor_port: Any = multiprocessing.sharedctypes.RawValue(ctypes.c_int, 0)
        self.monitor_endpoint = bool(self.config.metrics.listen)
        self.monitor_restart_at = 0.0
        self.monitor_delay = 0.5

    # -- setup ------------------------------------------------------------------------------------------

    def build_units(self) -> list[Unit]:
        """A unit per slot from ``gpus``, then one per [[servers]] entry."""
        config = self.config
        spec = parse_gpus(config.comfyui.gpus, config.source)
        if spec.mode == "cpu":
            slots = slots_for(spec)
        else:
            found = discover(self.env)
            log.info("GPUs: %s", found.note)
            slots = slots_for(spec, found)
        s = config.supervisor
        server_limits = Limits(startup_seconds=config.comfyui.startup_seconds,
                               quick_failure_seconds=s.quick_failure_seconds,
                               max_quick_failures=s.max_quick_failures,
                               max_delay_seconds=s.restart_max_delay_seconds, stop_seconds=KILL_WAIT_SECONDS)
        runner_limits = Limits(startup_seconds=s.runner_timeout_seconds + config.runner.http_timeout_seconds,
                               quick_failure_seconds=s.quick_failure_seconds,
                               max_quick_failures=s.max_quick_failures,
                               max_delay_seconds=s.restart_max_delay_seconds, stop_seconds=KILL_WAIT_SECONDS)
        units = []
        for slot in slots:
            plan = servers.plan(config, slot)
            units.append(Unit(name=slot.name, device=_device(slot), url=plan.url, plan=plan,
                              server=Policy(server_limits), runner=Policy(runner_limits), shared=_shared()))
        taken = {u.name for u in units}
        for remote in config.servers:
            if remote.name in taken:
                raise ConfigError(f"{config.source}: [[servers]] name = {remote.name!r} is also the name of a "
                                  "launched slot; choose another name")
            units.append(Unit(name=remote.name, device="external", url=remote.url, plan=None, server=None,
                              runner=Policy(runner_limits), shared=_shared()))
        if not units:
            raise ConfigError(f"{config.source}: nothing to supervise")
        return units

    def _check_comfyui(self) -> None:
        if not any(u.plan for u in self.units):
            return
        main = self.config.resolve(self.config.comfyui.main)
        if not main.is_file():
            raise ConfigError(f"{self.config.source}: [comfyui] main = {self.config.comfyui.main!r}: no such file "
                              f"({main.absolute()}); point it at ComfyUI's main.py")
        python = self.config.comfyui.python
        if python and shutil.which(python) is None:
            raise ConfigError(f"{self.config.source}: [comfyui] python = {python!r}: not an executable")

    def _take_lock(self) -> None:
        """One supervisor per queue folder: two would fight over ports and each other's claims."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle = open(self.state_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise AlreadyRunning(f"another comfysup run (pid {holder}) already supervises the queue in "
                                 f"{self.state_dir}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock_file = handle

    def release_stale_claims(self) -> list[str]:
        """Claims held by runners of an earlier supervisor on this host that no longer exist.

        A pid that exists again but was created after the claim started is another process that got the
        number, so the runner is gone all the same.
        """
        assert self.queue is not None
        host = host_name()
        released: list[str] = []
        for job in self.queue.status(dead_limit=0).running:
            if job.owner.split("/")[0] != host or _owner_alive(job.owner, job.started_at):
                continue
            ids = self.queue.release_owner(job.owner, "its runner (of an earlier supervisor) is gone",
                                           count_attempt=True)
            released += ids
        if released:
            log.info("released %d claim(s) of runners that no longer exist: %s", len(released),
                     ", ".join(i[:8] for i in released))
        return released

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def _restore_signals(self) -> None:
        signal.set_wakeup_fd(-1)
        for sig, handler in self._previous_handlers.items():
            with contextlib.suppress(Exception):
                signal.signal(sig, handler)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self) -> int:
        check_supervisor(self.config)
        self.units = self.build_units()
        self._check_comfyui()
        self._take_lock()
        self.queue = open_queue(self.config, create=True)
        self.release_stale_claims()
        self.heartbeat_machine(register=True)
        self._install_signals()
        log.info("comfysup supervisor %d: %s", os.getpid(),
                 ", ".join(f"{u.name} ({u.device}, {u.url})" for u in self.units))
        self.monitor_wanted = True
        try:
            while not self.finished:
                self.tick(self.clock())
                if not self.finished:
                    self._wait(TICK_SECONDS)
        finally:
            self._stop_monitor()
            self._restore_signals()
            self.write_state(final=True)
            self.queue.close()
        log.info("comfysup supervisor %d: stopped", os.getpid())
        return 0

    def _wait(self, seconds: float) -> None:
        with contextlib.suppress(InterruptedError):
            select.select([self._wake_r], [], [], seconds)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 512):
                pass

    def tick(self, now: float) -> None:
        """One pass: signals, exits, servers, runners, recycling, housekeeping, state for people."""
        self._handle_signals(now)
        self._reap(now)
        if self.finished:
            return
        if self.stop is None or self.stop.phase in ("runners", "killing runners"):
            self._monitor_step(now)  # webhooks of jobs that end during the grace still go out
        if self.stop is None:
            for unit in self.units:
                self._server_step(unit, now)
                self._runner_step(unit, now)
                self._recycle_step(unit, now)
            if now >= self._next_housekeeping:
                self._next_housekeeping = now + HOUSEKEEPING_SECONDS
                self._housekeeping(now)
        else:
            self._stop_step(now)
        for unit in self.units:
            unit.shared.may_claim = int(self.stop is None and unit.usable and self.queue_ok)
        self._notify(now)
        self.write_state()

    # -- signals ----------------------------------------------------------------------------------------

    def _handle_signals(self, now: float) -> None:
        while self.signals:
            sig = self.signals.pop(0)
            if sig in (signal.SIGTERM, signal.SIGINT):
                name = signal.Signals(sig).name
                if self.stop is None:
                    self.begin_stop(now, name)
                elif not self.stop.cold:
                    self.cold_stop(now, name)
            elif sig == signal.SIGHUP:
                log.info("SIGHUP ignored: restart the service to read a changed config")

    def begin_stop(self, now: float, why: str) -> None:
        grace = self.config.runner.grace_seconds
        log.info("%s: stopping; running jobs get %g s to finish, then are interrupted and released", why, grace)
        self.stop = StopPlan(deadline=now + grace + RUNNER_STOP_MARGIN_SECONDS)
        self.notifier.stopping(f"stopping: running jobs have {grace:g} s to finish")
        for unit in self.units:
            unit.shared.may_claim = 0
            if unit.runner_pid is not None:
                self.ops.kill(unit.runner_pid, signal.SIGTERM)

    def cold_stop(self, now: float, why: str) -> None:
        """A second signal: kill everything now; claims go back to the queue without counting."""
        log.info("%s again: cold stop, killing runners and servers now", why)
        if self.stop is None:
            self.begin_stop(now, why)
        assert self.stop is not None
        self.stop.cold = True
        for unit in self.units:
            if unit.runner_pid is not None:
                unit.runner_kill_reason = "cold stop of the supervisor"
                self.ops.kill(unit.runner_pid, signal.SIGKILL)
            if unit.server_pid is not None:
                self.ops.killpg(unit.server_pid, signal.SIGKILL)
        self.stop.phase = "killed"
        self.stop.deadline = now + KILL_WAIT_SECONDS

    def _stop_step(self, now: float) -> None:
        stop = self.stop
        assert stop is not None
        runners = [u for u in self.units if u.runner_pid is not None]
        launched = [u for u in self.units if u.server_pid is not None]
        if stop.phase == "runners":
            if not runners:
                self._stop_servers(now)
            elif now >= stop.deadline:
                for unit in runners:
                    log.warning("%s: runner %d still running %g s after the grace; killing it", unit.name,
                                unit.runner_pid, RUNNER_STOP_MARGIN_SECONDS)
                    unit.runner_kill_reason = "did not stop within the grace"
                    self.ops.kill(unit.runner_pid, signal.SIGKILL)  # type: ignore[arg-type]
                stop.phase = "killing runners"
                stop.deadline = now + KILL_WAIT_SECONDS
        elif stop.phase == "killing runners":
            if not runners or now >= stop.deadline:
                self._stop_servers(now)
        elif stop.phase == "servers":
            if not launched:
                self.finished = True
            elif now >= stop.deadline and not stop.servers_killed:
                for unit in launched:
                    log.warning("%s: ComfyUI pid %d did not stop within %g s; killing it", unit.name,
                                unit.server_pid, KILL_WAIT_SECONDS)
                    self.ops.killpg(unit.server_pid, signal.SIGKILL)  # type: ignore[arg-type]
                stop.servers_killed = True
                stop.deadline = now + KILL_WAIT_SECONDS
            elif now >= stop.deadline:
                self.finished = True
        elif stop.phase == "killed" and ((not runners and not launched) or now >= stop.deadline):
            self.finished = True

    def _stop_servers(self, now: float) -> None:
        assert self.stop is not None
        self.stop.phase = "servers"
        self.stop.deadline = now + KILL_WAIT_SECONDS
        for unit in self.units:
            if unit.server_pid is not None:
                log.info("%s: stopping ComfyUI (pid %d)", unit.name, unit.server_pid)
                self.ops.killpg(unit.server_pid, signal.SIGTERM)

    # -- children that ended ----------------------------------------------------------------------------

    def _reap(self, now: float) -> None:
        for pid, status in self.ops.reap():
            how = describe_status(status)
            if pid == self.monitor_pid:
                self._monitor_exited(now, status, how)
                continue
            for unit in self.units:
                if unit.runner_pid == pid:
                    self._runner_exited(unit, now, how)
                elif unit.server_pid == pid:
                    self._server_exited(unit, now, how)

    def _runner_exited(self, unit: Unit, now: float, how: str) -> None:
        owner, reason = unit.runner_owner, unit.runner_kill_reason
        unit.runner_pid = unit.runner_owner = unit.runner_kill_reason = None
        unit.shared.job = b""
        stopping = self.stop is not None
        if owner is not None and self.queue is not None:
            if stopping:
                why = f"supervisor stopping ({reason or how}); attempt not counted"
            else:
                why = f"runner process died ({reason + ', ' if reason else ''}{how})"
            try:
                released = self.queue.release_owner(owner, why, count_attempt=not stopping)
            except QueueError as exc:
                log.warning("%s: cannot release the claims of runner %s (%s); they come back when their "
                            "leases expire", unit.name, owner, exc)
                released = []
            if released:
                log.info("%s: runner %s; released %s", unit.name, why, ", ".join(i[:8] for i in released))
        if stopping:
            unit.runner.stop()
        else:
            for action in unit.runner.transition(now, exited=reason or how):
                self._runner_action(unit, now, action)
            level = logging.INFO if how == "exit code 0" else logging.WARNING
            log.log(level, "%s: runner exited (%s)%s", unit.name, reason or how, _next(unit.runner, now))

    def _server_exited(self, unit: Unit, now: float, how: str) -> None:
        pid = unit.server_pid
        unit.server_pid = None
        assert pid is not None and unit.server is not None and unit.plan is not None
        self.ops.killpg(pid, signal.SIGKILL)  # anything it started, in its process group
        if self.stop is not None:
            unit.server.stop()
            log.info("%s: ComfyUI stopped (%s)", unit.name, how)
            return
        expected = unit.server.state is State.STOPPING
        for action in unit.server.transition(now, exited=how):
            self._server_action(unit, now, action)
        if not expected:
            tail = servers.log_tail(unit.plan.log_path)
            log.warning("%s: ComfyUI pid %d exited (%s)%s%s", unit.name, pid, how, _next(unit.server, now),
                        f"; last log lines: {tail}" if tail else "")

    # -- servers ----------------------------------------------------------------------------------------

    def _server_step(self, unit: Unit, now: float) -> None:
        policy = unit.server
        if policy is None:
            return
        answered = False
        if policy.state is State.STARTING and unit.server_pid is not None:
            answered = servers.answers(unit.url, timeout_seconds=0.5)
        before = policy.state
        for action in policy.transition(now, answered=answered):
            self._server_action(unit, now, action)
        if before is State.STARTING and policy.state is not State.STARTING:
            unit.first_start_over = True
            if policy.state is State.RUNNING:
                log.info("%s: ComfyUI answers on %s (%.1f s after its start)", unit.name, unit.url,
                         now - (policy.started_at or now))
            else:
                log.warning("%s: ComfyUI %s", unit.name, policy.reason)
        if policy.state is State.FAILED and before is not State.FAILED:
            unit.first_start_over = True
            log.error("%s: slot failed: %s. The other slots keep working; fix the cause and restart comfysup",
                      unit.name, policy.reason)

    def _server_action(self, unit: Unit, now: float, action: Action) -> None:
        assert unit.server is not None
        if action is Action.SPAWN:
            self._spawn_server(unit, now)
        elif unit.server_pid is not None:
            self.ops.killpg(unit.server_pid, signal.SIGTERM if action is Action.TERM else signal.SIGKILL)

    def _spawn_server(self, unit: Unit, now: float) -> None:
        plan, policy = unit.plan, unit.server
        assert plan is not None and policy is not None
        try:
            servers.prepare(plan)
        except OSError as exc:
            policy.spawn_failed(now, f"cannot create {plan.directory}: {exc.strerror}")
            return
        holder = servers.port_holder(self.config.comfyui.listen, plan.port)
        if holder is not None:
            policy.spawn_failed(now, holder)
            log.warning("%s: cannot start ComfyUI: %s%s", unit.name, holder, _next(policy, now))
            return
        try:
            pid = self.ops.spawn(plan.argv, env=servers.environment(self.env), log_path=plan.log_path,
                                 cwd=str(Path(plan.argv[1]).parent))
        except (SpawnError, OSError) as exc:
            policy.spawn_failed(now, str(exc))
            log.warning("%s: %s%s", unit.name, exc, _next(policy, now))
            return
        unit.server_pid = pid
        unit.jobs_at_server_start = unit.shared.jobs
        every = self.config.supervisor.recycle_after_jobs
        unit.shared.recycle_at = unit.shared.jobs + every if every else 0
        unit.draining = None
        policy.spawned(now)
        log.info("%s: ComfyUI started, pid %d, port %d, log %s", unit.name, pid, plan.port, plan.log_path)

    # -- runners ----------------------------------------------------------------------------------------

    def _runner_step(self, unit: Unit, now: float) -> None:
        policy = unit.runner
        alive = unit.shared.alive
        answered = policy.state is State.STARTING and policy.started_at is not None and alive > policy.started_at
        for action in policy.transition(now, answered=answered):
            self._runner_action(unit, now, action)
        timeout = self.config.supervisor.runner_timeout_seconds
        if (policy.state is State.RUNNING and unit.runner_pid is not None and unit.runner_kill_reason is None
                and now - alive > timeout):
            unit.runner_kill_reason = f"silent for {now - alive:.0f} s (runner_timeout_seconds = {timeout:g})"
            log.warning("%s: runner %d %s; killing it", unit.name, unit.runner_pid, unit.runner_kill_reason)
            self.ops.kill(unit.runner_pid, signal.SIGKILL)

    def _runner_action(self, unit: Unit, now: float, action: Action) -> None:
        if action is Action.SPAWN:
            self._fork_runner(unit, now)
        elif unit.runner_pid is not None:
            unit.runner_kill_reason = unit.runner.reason.split(";")[0]
            self.ops.kill(unit.runner_pid, signal.SIGKILL)

    def _fork_runner(self, unit: Unit, now: float) -> None:
        token = uuid.uuid4().hex[:8]
        shared = unit.shared
        shared.alive = now
        shared.busy = 0
        shared.job = b""
        shared.may_claim = int(self.stop is None and unit.usable)
        pid = self.ops.fork(lambda: self._runner_main(unit, token))
        unit.runner_pid = pid
        unit.runner_owner = make_owner(unit.name, pid, token)
        unit.runner_kill_reason = None
        unit.runner.spawned(now)
        log.info("%s: runner started, pid %d", unit.name, pid)

    def _become_child(self, name: str) -> None:
        """In a forked child: own process group, default signals, none of the supervisor's descriptors."""
        set_name(name)
        os.setpgid(0, 0)  # Ctrl-C in a terminal reaches the supervisor alone, which then asks each child
        signal.set_wakeup_fd(-1)
        for sig in self._previous_handlers:
            signal.signal(sig, signal.SIG_DFL)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._lock_file is not None:
            self._lock_file.close()

    def _runner_main(self, unit: Unit, token: str) -> int:
        """In the forked child: become a plain runner process (own process group, default signals)."""
        from comfysup.runner.loop import Runner

        self._become_child(f"comfysup-{unit.name}")
        shared = unit.shared

        def on_alive() -> None:
            shared.alive = time.monotonic()

        def may_claim() -> bool:
            shared.busy = 1  # before reading the flag: a supervisor that cleared it then sees busy or a no
            # The runner itself stops at the recycling count, so no job slips in before the supervisor acts.
            if shared.may_claim and not (shared.recycle_at and shared.jobs >= shared.recycle_at):
                return True
            shared.busy = 0
            return False

        def on_job(claim: Claim, outcome: Outcome | None) -> None:
            if outcome is None:
                shared.job = claim.id.encode()[:39]
            else:
                shared.jobs += 1
                shared.job = b""

        peers = {u.name: u.url for u in self.units}
        runner = Runner(self.config, unit.name, unit.url, peers=peers, owner_token=token, on_alive=on_alive,
                        may_claim=may_claim, on_job=on_job)
        runner.install_signals()
        runner.run()
        return 0

    # -- the monitor (metrics, status page, webhooks) -------------------------------------------------

    def _monitor_step(self, now: float) -> None:
        if self.monitor_wanted and self.monitor_pid is None and now >= self.monitor_restart_at:
            self.monitor_port.value = 0
            self.monitor_pid = self.ops.fork(self._monitor_main)
            log.info("monitor started, pid %d", self.monitor_pid)

    def _monitor_main(self) -> int:
        from comfysup.observability.monitor import monitor_main

        self._become_child("comfysup-monitor")
        return monitor_main(self.config, self.monitor_port, serve_endpoint=self.monitor_endpoint)

    def _monitor_exited(self, now: float, status: int, how: str) -> None:
        """Restarted after a growing delay; after a bind failure, without its endpoint (webhooks still go)."""
        self.monitor_pid = None
        self.monitor_port.value = 0
        if self.stop is not None:
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == BIND_FAILED and self.monitor_endpoint:
            self.monitor_endpoint = False
            log.error("no /metrics and no status page: [metrics] listen = %r cannot be bound (see above); webhooks "
                      "are still delivered", self.config.metrics.listen)
            self.monitor_restart_at = now
            return
        self.monitor_restart_at = now + self.monitor_delay
        log.warning("monitor exited (%s); restarting it in %.1f s", how, self.monitor_delay)
        self.monitor_delay = min(MONITOR_MAX_DELAY_SECONDS, self.monitor_delay * 2)

    def _stop_monitor(self) -> None:
        """Last of all: SIGTERM, a few seconds to finish a webhook try, then SIGKILL."""
        pid, self.monitor_wanted = self.monitor_pid, False
        if pid is None:
            return
        self.ops.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + MONITOR_STOP_SECONDS
        while time.monotonic() < deadline:
            if any(ended == pid for ended, _ in self.ops.reap()):
                self.monitor_pid = None
                return
            time.sleep(0.05)
        self.ops.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self.monitor_pid = None

    # -- recycling --------------------------------------------------------------------------------------

    def _recycle_step(self, unit: Unit, now: float) -> None:
        """After N jobs (or above the memory bound, see housekeeping): drain the runner, then restart."""
        policy = unit.server
        if policy is None or policy.state is not State.RUNNING:
            return
        every = self.config.supervisor.recycle_after_jobs
        if unit.draining is None and every and unit.shared.jobs - unit.jobs_at_server_start >= every:
            self._drain(unit, now, f"recycled after {unit.shared.jobs - unit.jobs_at_server_start} job(s)")
        if unit.draining is None:
            return
        # The flag was cleared in an earlier tick; busy == 0 now means the runner has seen it and holds
        # no job (or it is not running at all).
        settled = now - unit.draining_since >= TICK_SECONDS / 2
        if settled and (unit.runner_pid is None or not unit.shared.busy):
            log.info("%s: %s; restarting ComfyUI", unit.name, unit.draining)
            for action in policy.transition(now, recycle=unit.draining):
                self._server_action(unit, now, action)

    def _drain(self, unit: Unit, now: float, why: str) -> None:
        unit.draining = why
        unit.draining_since = now
        unit.shared.may_claim = 0
        log.info("%s: %s: the runner finishes its job, then ComfyUI is restarted", unit.name, why)

    def heartbeat_machine(self, register: bool = False) -> None:
        """Tell the queue this machine is alive and what its slots do (``comfysup status`` on any machine
        shows it). A database that does not answer stops the runners claiming, said once in the log; the
        jobs they run stop by themselves before their leases could hand them on (their heartbeats fail)."""
        if self.queue is None:
            return
        try:
            slots = self.snapshot()["slots"]
            if register:
                self.queue.register_machine(host_name(), os.getpid(), slots)
            else:
                self.queue.machine_heartbeat(host_name(), os.getpid(), slots)
        except QueueError as exc:
            if self.queue_ok:
                log.error("the queue database does not answer: %s; runners stop claiming until it does", exc)
            self.queue_ok = False
            return
        if not self.queue_ok:
            log.info("the queue database answers again; runners claim again")
        self.queue_ok = True

    def _housekeeping(self, now: float) -> None:
        self.heartbeat_machine()
        s = self.config.supervisor
        for unit in self.units:
            if unit.plan is None:
                continue
            if servers.rotate_log(unit.plan.log_path, s.log_max_mb * 2**20):
                log.info("%s: rotated %s", unit.name, unit.plan.log_path)
            if unit.server_pid is not None:
                unit.last_rss_mb = servers.tree_rss_mb(unit.server_pid)
                if (s.recycle_rss_mb and unit.draining is None and unit.server is not None
                        and unit.server.state is State.RUNNING and unit.last_rss_mb > s.recycle_rss_mb):
                    self._drain(unit, now, f"memory {unit.last_rss_mb:.0f} MiB above recycle_rss_mb = "
                                           f"{s.recycle_rss_mb}")

    # -- what people and systemd see ---------------------------------------------------------------------

    def summary(self) -> str:
        launched = [u for u in self.units if u.server is not None]
        running = sum(1 for u in launched if u.state == "running")
        parts = [f"{running} of {len(launched)} ComfyUI server(s) running"] if launched else []
        failed = [u.name for u in launched if u.state == "failed"]
        if failed:
            parts.append(f"failed: {', '.join(failed)}")
        external = len(self.units) - len(launched)
        if external:
            parts.append(f"{external} external server(s)")
        busy = sum(1 for u in self.units if u.shared.job)
        parts.append(f"{busy} job(s) running, {sum(u.shared.jobs for u in self.units)} finished since start")
        return "; ".join(parts)

    def _notify(self, now: float) -> None:
        if self.stop is None and not self.notifier.ready_sent:
            started = all(u.first_start_over or u.server is None for u in self.units)
            if started and all(u.runner_pid is not None for u in self.units):
                self.notifier.ready(self.summary())
                log.info("ready: %s", self.summary())
        if self.notifier.ready_sent:
            self.notifier.watchdog(now)
            if self.stop is None:
                self.notifier.status(self.summary())

    def snapshot(self, *, final: bool = False) -> dict[str, Any]:
        now = time.time()
        slots = []
        for u in self.units:
            policy = u.server or u.runner
            slots.append({
                "name": u.name, "device": u.device, "state": "stopped" if final and u.server else u.state,
                "pid": u.server_pid, "port": u.plan.port if u.plan else None, "url": u.url,
                "restarts": u.server.restarts if u.server else 0, "reason": policy.reason or None,
                "log": str(u.plan.log_path) if u.plan else None, "draining": u.draining,
                "rss_mb": round(u.last_rss_mb, 1) if u.plan else None,
                "runner_pid": u.runner_pid, "runner_state": u.runner.state.value,
                "runner_restarts": u.runner.restarts, "runner_reason": u.runner.reason or None,
                "job": u.shared.job.decode() or None, "jobs": u.shared.jobs,
            })
        state = "stopped" if final else ("stopping" if self.stop else "running")
        port = self.monitor_port.value
        host = self.config.metrics.listen.rpartition(":")[0] if self.config.metrics.listen else ""
        return {"pid": os.getpid(), "host": host_name(), "state": state,
                "config": _absolute(self.config.source), "started_at": self.started_at, "updated_at": now,
                "summary": self.summary(), "slots": slots,
                "metrics_url": f"http://{host}:{port}/" if port and not final else None,
                "monitor_pid": None if final else self.monitor_pid}

    def write_state(self, *, final: bool = False) -> None:
        """Atomically, every tick: ``comfysup status`` and ``health`` read it."""
        tmp = self.state_path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.snapshot(final=final), indent=1))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_path, exc.strerror)


def _absolute(source: str) -> str:
    return str(Path(source).absolute()) if source != "<defaults>" else source


def _shared() -> Any:
    return multiprocessing.sharedctypes.RawValue(Shared)


def _device(slot: Slot) -> str:
    return "cpu" if slot.device is None else f"cuda:{slot.device}"


def _next(policy: Policy, now: float) -> str:
    if policy.state is State.BACKOFF and policy.retry_at is not None:
        return f"; restart {policy.restarts + 1} in {max(0.0, policy.retry_at - now):.1f} s"
    if policy.state is State.FAILED:
        return f"; {policy.reason}"
    return ""


def _owner_alive(owner: str, claimed_at: float) -> bool:
    """The pid in the owner exists and is older than the claim (so it can be the runner that made it)."""
    pid = owner_pid(owner)
    if pid is None or not psutil.pid_exists(pid):
        return False
    try:
        process = psutil.Process(pid)
        # A zombie has stopped running (its reaper has not come yet): it acts on nothing.
        return process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= claimed_at + 1.0
    except psutil.Error:
        return False
