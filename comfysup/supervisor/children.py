"""Child start-up: what the supervisor's slots are, and how a ComfyUI server, a runner and the monitor start.

A slot (:class:`Unit`) is one ComfyUI server (launched, or a ``[[servers]]`` entry used as it is) and one
runner process, each with its restart :class:`~comfysup.supervisor.policy.Policy`; the policies' limits
are built from the config (:func:`limits_from`), the one place their values are declared. The runner
reports to the supervisor through a small shared-memory :class:`Shared` block.

Starting is all that is here: when to start, restart or stop is the supervisor's (through the policies
and the stop plan), and every OS call goes through :class:`~comfysup.supervisor.process.ProcessOps`.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.sharedctypes
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comfysup.config import Config, parse_gpus
from comfysup.errors import ConfigError
from comfysup.gpus import Slot, discover, slots_for
from comfysup.queue.base import Claim
from comfysup.runner import warmup
from comfysup.runner.attempt import Outcome
from comfysup.runner.loop import Runner
from comfysup.runner.memory import MemoryHooks
from comfysup.runner.options import RunnerHooks, RunnerOptions
from comfysup.runner.stuck import StuckChannel
from comfysup.runner.warmup import WarmUp
from comfysup.supervisor import server as servers
from comfysup.supervisor.policy import Limits, Policy, State
from comfysup.supervisor.process import ProcessOps, SpawnError
from comfysup.supervisor.stop import KILL_WAIT_SECONDS

log = logging.getLogger("comfysup.supervisor")


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
        ("stuck", ctypes.c_char * 40),  # by the runner: a prompt stuck after /interrupt; cleared once it is gone
        ("waiting", ctypes.c_int),  # by the runner: 1 while it holds no job and its server could take one
        ("problem", ctypes.c_char * 240),  # by the runner: why its server, though it answers, can take no job
        ("warm_wanted", ctypes.c_long),  # by the supervisor: the server start whose warm-up is asked (0: none)
        ("warm_done", ctypes.c_long),  # by the runner: the server start whose warm-up is over
        ("warm_ms", ctypes.c_long),  # by the runner: how long that warm-up took
        ("warm_error", ctypes.c_char * 240),  # by the runner: why it failed (empty: it succeeded)
        ("restart", ctypes.c_char * 160),  # by the runner: why its server must be restarted (a lost device)
        ("oom_frees", ctypes.c_long),  # by the runner: POST /free after an out-of-memory error
        ("oom_retries", ctypes.c_long),  # by the runner: jobs posted again on the server after one
        ("device_restarts", ctypes.c_long),  # by the runner: restarts asked for a lost device
    )


def problem_bytes(reason: str) -> bytes:
    """A runner's problem as ``Shared.problem`` holds it: UTF-8, cut at a character boundary to fit."""
    return reason.encode()[:239].decode(errors="ignore").encode()


def problem_of(shared: Any) -> str | None:
    """Why the slot's server takes no job although it answers (a malformed /queue), or None."""
    return bytes(shared.problem).decode(errors="replace") or None


def waiting_peer(peers: Sequence[Any]) -> bool:
    """Whether another runner of this machine waits for work its server could start at once (its Shared
    block says so): then no job is queued behind a running prompt, where it would wait a whole prompt's
    time while a server idles (two jobs on two GPUs run side by side, not one after the other)."""
    return any(peer.waiting and peer.may_claim for peer in peers)


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
    jobs_at_server_start: int = 0
    draining: str | None = None
    draining_since: float = 0.0
    held_by: str | None = None
    """Who holds the slot from the console (comfysup.supervisor.orders): its runner claims nothing meanwhile."""
    first_start_over: bool = False
    last_rss_mb: float = 0.0
    stuck_restarts: int = 0
    """Restarts of the server because a prompt stayed in its queue after /interrupt."""
    last_check: str = ""
    """What the last readiness check of a starting server got (empty: it answered), for the log."""
    comfyui_version: str | None = None
    """The ComfyUI version its server reported (None: not learnt yet; "unknown": it did not say)."""
    features: dict[str, Any] = field(default_factory=dict)
    """What GET /features of its server said."""
    next_version_check: float = 0.0
    starts: int = 0
    """Spawns of its server so far: the number a warm-up is asked for (``Shared.warm_wanted``)."""
    warm_since: float | None = None
    """When the warm-up of the current start was asked (None: not asked)."""
    warmup_seconds: float | None = None
    """How long the last warm-up that succeeded took."""
    warmup_failures: int = 0
    idle_frees: int = 0
    """POST /free sent because the server held VRAM above [comfyui] idle_vram_free_mb while idle (NVML)."""
    idle_restarts: int = 0
    """Restarts because that VRAM stayed held after the /free."""
    idle_vram_mb: float | None = None
    """The VRAM its server held when it was last sent /free for it (None: not since its last job)."""
    idle_freed_after: int = -1
    """``Shared.jobs`` when that /free was sent: a job since makes the next look a first one again."""
    idle_restarted_after: int = -1
    """``Shared.jobs`` at the last idle restart: no job since, a restart does not give that VRAM back."""

    @property
    def state(self) -> str:
        return "external" if self.server is None else self.server.state.value

    @property
    def usable(self) -> bool:
        """The runner may claim: its server answers, is not being recycled, and is not held."""
        return self.draining is None and self.held_by is None and (self.server is None or
                                                                    self.server.state is State.RUNNING)


# -- limits -------------------------------------------------------------------------------------------


def limits_from(config: Config, startup_seconds: float) -> Limits:
    """A restart policy's limits from ``[supervisor]``: the defaults live in comfysup.config alone."""
    s = config.supervisor
    return Limits(startup_seconds=startup_seconds, quick_failure_seconds=s.quick_failure_seconds,
                  max_quick_failures=s.max_quick_failures, max_delay_seconds=s.restart_max_delay_seconds,
                  stop_seconds=KILL_WAIT_SECONDS)


def server_limits(config: Config) -> Limits:
    """A server is "starting" until it answers and, with ``[comfyui] warmup``, its warm-up is over."""
    c = config.comfyui
    return limits_from(config, c.startup_seconds + (c.warmup_timeout_seconds if c.warmup else 0.0))


def runner_limits(config: Config) -> Limits:
    """A runner "answers" when it signals that it is alive; one HTTP call may delay its first sign."""
    return limits_from(config, config.supervisor.runner_timeout_seconds + config.runner.http_timeout_seconds)


# -- slots --------------------------------------------------------------------------------------------


def build_units(config: Config, env: Mapping[str, str]) -> list[Unit]:
    """A unit per slot from ``gpus`` (none for ``"none"``), then one per [[servers]] entry."""
    spec = parse_gpus(config.comfyui.gpus, config.source)
    if spec.mode == "none":
        slots = []
        if not config.servers:
            raise ConfigError(f"{config.source}: [comfyui] gpus = \"none\" launches no ComfyUI server; list the "
                              "servers to supervise as [[servers]] name = ..., url = ...")
    elif spec.mode == "cpu":
        slots = slots_for(spec)
    else:
        found = discover(env)
        log.info("GPUs: %s", found.note)
        slots = slots_for(spec, found)
    for_servers, for_runners = server_limits(config), runner_limits(config)
    units = []
    for slot in slots:
        plan = servers.plan(config, slot)
        units.append(Unit(name=slot.name, device=_device(slot), url=plan.url, plan=plan,
                          server=Policy(for_servers), runner=Policy(for_runners), shared=new_shared()))
    taken = {u.name for u in units}
    for remote in config.servers:
        if remote.name in taken:
            raise ConfigError(f"{config.source}: [[servers]] name = {remote.name!r} is also the name of a "
                              "launched slot; choose another name")
        units.append(Unit(name=remote.name, device="external", url=remote.url, plan=None, server=None,
                          runner=Policy(for_runners), shared=new_shared()))
    if not units:
        raise ConfigError(f"{config.source}: nothing to supervise")
    return units


def check_comfyui(config: Config, units: list[Unit]) -> None:
    """Before anything starts: ComfyUI's main.py and python exist (only when a server is launched)."""
    if not any(u.plan for u in units):
        return
    warmup.load(config)  # [comfyui] warmup: a workflow that cannot be read stops the start, not each server
    main = config.resolve(config.comfyui.main)
    if not main.is_file():
        raise ConfigError(f"{config.source}: [comfyui] main = {config.comfyui.main!r}: no such file "
                          f"({main.absolute()}); point it at ComfyUI's main.py")
    python = config.comfyui.python
    if python and shutil.which(python) is None:
        raise ConfigError(f"{config.source}: [comfyui] python = {python!r}: not an executable")


def new_shared() -> Any:
    return multiprocessing.sharedctypes.RawValue(Shared)


def _device(slot: Slot) -> str:
    return "cpu" if slot.device is None else f"cuda:{slot.device}"


def next_restart(policy: Policy, now: float) -> str:
    """For a log line: when the next restart comes, or why there is none."""
    if policy.state is State.BACKOFF and policy.retry_at is not None:
        return f"; restart {policy.restarts + 1} in {max(0.0, policy.retry_at - now):.1f} s"
    if policy.state is State.FAILED:
        return f"; {policy.reason}"
    return ""


# -- starting -----------------------------------------------------------------------------------------


def spawn_server(unit: Unit, config: Config, ops: ProcessOps, env: Mapping[str, str], now: float) -> None:
    """Start the slot's ComfyUI server; a folder that cannot be made, a port taken or a spawn that fails
    is a quick failure of its policy."""
    plan, policy = unit.plan, unit.server
    assert plan is not None and policy is not None
    try:
        servers.prepare(plan)
    except OSError as exc:
        policy.spawn_failed(now, f"cannot create {plan.directory}: {exc.strerror}")
        return
    holder = servers.port_holder(config.comfyui.listen, plan.port)
    if holder is not None:
        policy.spawn_failed(now, holder)
        log.warning("%s: cannot start ComfyUI: %s%s", unit.name, holder, next_restart(policy, now))
        return
    try:
        pid = ops.spawn(plan.argv, env=servers.environment(env), log_path=plan.log_path,
                        cwd=str(Path(plan.argv[1]).parent))
    except (SpawnError, OSError) as exc:
        policy.spawn_failed(now, str(exc))
        log.warning("%s: %s%s", unit.name, exc, next_restart(policy, now))
        return
    unit.server_pid = pid
    unit.starts += 1
    unit.warm_since, unit.shared.restart = None, b""  # a new process: a new warm-up, no restart asked of it
    unit.jobs_at_server_start = unit.shared.jobs
    every = config.supervisor.recycle_after_jobs
    unit.shared.recycle_at = unit.shared.jobs + every if every else 0
    unit.draining = None
    policy.spawned(now)
    log.info("%s: ComfyUI started, pid %d, port %d, log %s", unit.name, pid, plan.port, plan.log_path)


def output_dirs(units: list[Unit]) -> dict[str, Path]:
    """The output folder of each server this supervisor launches (``<base directory>/output``, as ComfyUI
    puts it); a [[servers]] entry's is its ``output_dir``, when it names one (``Config.server_output_dirs``)."""
    return {u.name: u.plan.directory / "output" for u in units if u.plan is not None}


def prepare_runner(unit: Unit, now: float, may_claim: bool) -> None:
    """Before a runner is forked: a fresh sign of life, no job, and whether it may claim."""
    shared = unit.shared
    shared.alive = now
    shared.busy = 0
    shared.job = b""
    shared.may_claim = int(may_claim)
    shared.waiting = 1  # about to ask for a job (once it may): no peer queues one ahead meanwhile
    # A stuck prompt reported by the runner that died stays reported: the server still holds it.


def memory_hooks(unit: Unit) -> MemoryHooks:
    """The runner's memory recovery reports through the slot's block: counts, and a restart asked for."""
    shared = unit.shared

    def count(what: str) -> None:
        setattr(shared, what, getattr(shared, what) + 1)

    def restart(reason: str) -> None:
        shared.restart = reason.encode()[:159].decode(errors="ignore").encode()

    return MemoryHooks(restarts=unit.server is not None, restart=restart, count=count)


def warm_up(config: Config, unit: Unit) -> WarmUp | None:
    """The runner's side of its server's warm-up (comfysup.runner.warmup), through the slot's block. The workflow
    was checked before anything started (check_comfyui); one broken since is said here, and the warm-up its
    supervisor waits for then times out (a failed start, with the reason in this runner's log)."""
    if not config.comfyui.warmup or unit.server is None:
        return None
    try:
        workflow = warmup.load(config)
    except ConfigError as exc:
        log.error("%s: no warm-up: %s", unit.name, exc)
        return None
    assert workflow is not None
    shared = unit.shared

    def over(start: int, milliseconds: int, error: str) -> None:
        shared.warm_ms, shared.warm_error = milliseconds, problem_bytes(error)
        shared.warm_done = start  # last: the supervisor reads the others once it sees this

    return WarmUp(workflow, config.comfyui.warmup_timeout_seconds, lambda: shared.warm_wanted, over,
                  done=shared.warm_done)


def runner_main(config: Config, unit: Unit, peers: dict[str, str], token: str,
                output_dirs: dict[str, Path] | None = None, others: Sequence[Any] = ()) -> int:
    """In the forked child (already its own process group, default signals): be a plain runner that
    reports through the unit's shared block. ``output_dirs``: the output folders of the servers this
    supervisor launched (by name), where a job's files can be adopted from disk. ``others``: the other slots'
    Shared blocks (a job is queued ahead only while none of their runners waits for work)."""
    shared = unit.shared

    def on_alive() -> None:
        shared.alive = time.monotonic()

    def may_claim() -> bool:
        shared.busy = 1  # before reading the flag: a supervisor that cleared it then sees busy or a no
        # The runner itself stops at the recycling count, and once it asked for a restart, so no job slips in
        # before the supervisor acts.
        if shared.may_claim and not (shared.recycle_at and shared.jobs >= shared.recycle_at) and not shared.restart:
            return True
        shared.busy = 0
        return False

    def on_job(claim: Claim, outcome: Outcome | None) -> None:
        if outcome is None:
            shared.job = claim.id.encode()[:39]
        else:
            shared.jobs += 1
            shared.job = b""

    def report_stuck(prompt_id: str) -> None:
        shared.stuck = prompt_id.encode()[:39]

    def on_problem(reason: str) -> None:
        shared.problem = problem_bytes(reason)

    stuck = StuckChannel(restarts=unit.server is not None, report=report_stuck, pending=lambda: bool(shared.stuck))
    def may_queue_ahead(uncounted: int) -> bool:
        # The jobs on the server are not counted yet: one more behind them would slip in past the recycling count.
        return not (shared.recycle_at and shared.jobs + uncounted >= shared.recycle_at)

    def on_waiting(waiting: bool) -> None:
        shared.waiting = int(waiting)

    options = RunnerOptions(peers=peers, owner_token=token, output_dirs=output_dirs)
    hooks = RunnerHooks(on_alive=on_alive, on_problem=on_problem, may_claim=may_claim, on_job=on_job, stuck=stuck,
                        may_queue_ahead=may_queue_ahead, on_waiting=on_waiting,
                        peer_waiting=lambda: waiting_peer(others), memory=memory_hooks(unit),
                        warmup=warm_up(config, unit))
    runner = Runner(config, unit.name, unit.url, options, hooks)
    runner.install_signals()
    runner.run()
    return 0
