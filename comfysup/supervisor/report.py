"""Reporting: what people (the state file behind ``comfysup status`` and ``health``) and systemd (READY,
WATCHDOG, STATUS, STOPPING through :mod:`comfysup.supervisor.notify`) are told about the slots.

It only reads the supervisor's slots; it decides nothing about them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comfysup.config import Config
from comfysup.errors import DatabaseLocked, QueueError
from comfysup.queue import Queue
from comfysup.queue.base import host_name
from comfysup.runner.memory import COUNTS
from comfysup.slotstate import StateFile, state_path
from comfysup.supervisor.children import Unit, problem_of
from comfysup.supervisor.notify import Notifier
from comfysup.supervisor.policy import State
from comfysup.supervisor.stuck import reason as stuck_reason

log = logging.getLogger("comfysup.supervisor")


def summary(units: Sequence[Unit]) -> str:
    """One line, for ``systemctl status`` and the state file."""
    launched = [u for u in units if u.server is not None]
    running = sum(1 for u in launched if u.state == "running")
    parts = [f"{running} of {len(launched)} ComfyUI server(s) running"] if launched else []
    failed = [u.name for u in launched if u.state == "failed"]
    if failed:
        parts.append(f"failed: {', '.join(failed)}")
    external = len(units) - len(launched)
    if external:
        parts.append(f"{external} external server(s)")
    busy = sum(1 for u in units if u.shared.job)
    parts.append(f"{busy} job(s) running, {sum(u.shared.jobs for u in units)} finished since start")
    return "; ".join(parts)


EXIT_NO_SLOT_ALIVE = 3
"""``comfysup run``'s exit code when every slot failed: nothing here can run a job until someone acts, and a
non-zero exit lets systemd's Restart=on-failure try again (after a driver or a disk came back)."""


def no_slot_alive(units: Sequence[Unit]) -> str | None:
    """Why no slot can run a job (every launched server failed, and no [[servers]] entry), or None."""
    if not units or any(u.server is None or u.server.state is not State.FAILED for u in units):
        return None
    return "every slot failed: " + "; ".join(f"{u.name}: {u.server.reason}" for u in units if u.server)


MACHINE_HEARTBEAT_WAIT_SECONDS = 0.5
"""The longest the supervisor's loop waits for the queue's write lock to refresh its machine row (SQLite)."""

def heartbeat_machine(queue: Queue, units: Sequence[Unit], *, register: bool, was_ok: bool,
                      final: bool = False) -> bool:
    """Tell the queue this machine is alive and what its slots do (``comfysup status`` on any machine shows
    it); whether the queue answered. A database that does not answer stops the runners claiming, said once in
    the log; the jobs they run stop by themselves before their leases could hand them on."""
    try:
        slots = slot_rows(units, final=final)  # final: the last beat of a clean stop, every slot stopped
        if register:
            queue.fleet.register_machine(host_name(), os.getpid(), slots)
        else:
            queue.fleet.machine_heartbeat(host_name(), os.getpid(), slots, wait_seconds=MACHINE_HEARTBEAT_WAIT_SECONDS)
    except DatabaseLocked:
        # Another process holds the write lock (a long submit; a runner stopped mid-transaction): this beat is
        # skipped, not waited for, so the supervisor's loop goes on watching, and kills, its silent runners.
        return was_ok
    except QueueError as exc:
        if was_ok:
            log.error("the queue database does not answer: %s; runners stop claiming until it does", exc)
        return False
    if not was_ok:
        log.info("the queue database answers again; runners claim again")
    return True


def slot_rows(units: Sequence[Unit], *, final: bool = False) -> list[dict[str, Any]]:
    """Each slot as the state file and the machines table show it."""
    rows = []
    for u in units:
        policy = u.server or u.runner
        rows.append({
            "name": u.name, "device": u.device, "state": "stopped" if final else u.state,
            "pid": u.server_pid, "port": u.plan.port if u.plan else None, "url": u.url,
            "restarts": u.server.restarts if u.server else 0, "reason": policy.reason or None,
            "log": str(u.plan.log_path) if u.plan else None, "draining": u.draining, "held_by": u.held_by,
            "rss_mb": round(u.last_rss_mb, 1) if u.plan else None,
            "runner_pid": u.runner_pid, "runner_state": u.runner.state.value,
            "runner_restarts": u.runner.restarts, "runner_reason": u.runner.reason or None,
            "job": u.shared.job.decode() or None, "jobs": u.shared.jobs,
            "out_of_service": stuck_reason(u) or problem_of(u.shared), "problem": problem_of(u.shared),
            "stuck_restarts": u.stuck_restarts,
            "comfyui_version": u.comfyui_version, "features": u.features,
            "ready": not final and is_ready(u), "warmup_seconds": u.warmup_seconds,
            "warmup_failures": u.warmup_failures, "warming": u.warm_since is not None and u.state == "starting",
            **{what: getattr(u.shared, what) for what in COUNTS},
            "idle_frees": u.idle_frees, "idle_restarts": u.idle_restarts,
        })
    return rows


def is_ready(u: Unit) -> bool:
    """The slot takes jobs now: its server answers (and is warm, with a warm-up), its runner runs, and nothing
    holds it back (a drain, a stuck prompt, a restart asked for, an unreadable queue)."""
    return (u.usable and u.runner_pid is not None and u.runner.state is State.RUNNING and not stuck_reason(u)
            and not problem_of(u.shared) and not u.shared.restart)


class Reporter:
    """The state file and systemd's notifications of one supervisor."""

    def __init__(self, config: Config, env: Mapping[str, str]) -> None:
        self.config = config
        self.notifier = Notifier(env)
        self.started_at = time.time()
        self.state_path: Path = state_path(config)
        self.state_file = StateFile(self.state_path)

    def snapshot(self, units: Sequence[Unit], *, stopping: bool, monitor_pid: int | None, monitor_port: int,
                 final: bool = False) -> dict[str, Any]:
        state = "stopped" if final else ("stopping" if stopping else "running")
        listen = self.config.metrics.listen
        host = listen.rpartition(":")[0] if listen else ""
        return {"pid": os.getpid(), "host": host_name(), "state": state,
                "config": _absolute(self.config.source), "started_at": self.started_at, "updated_at": time.time(),
                "summary": summary(units), "slots": slot_rows(units, final=final),
                "metrics_url": f"http://{host}:{monitor_port}/" if monitor_port and not final else None,
                "monitor_pid": None if final else monitor_pid}

    def write_state(self, snapshot: dict[str, Any], *, final: bool = False) -> None:
        """When it changed, or every REFRESH_SECONDS (comfysup.slotstate.StateFile): ``comfysup status`` and
        ``health`` read it."""
        try:
            self.state_file.write(snapshot, force=final)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_path, exc.strerror)

    def notify(self, units: Sequence[Unit], now: float, *, stopping: bool) -> None:
        """READY once every slot's first start is over, at least one slot can run jobs (a server that
        answers, or a [[servers]] entry) and every runner runs; then WATCHDOG every tick and STATUS when the
        summary changes. With no slot alive there is no READY: systemd sees a start that failed."""
        notifier = self.notifier
        if not stopping and not notifier.ready_sent:
            started = all(u.first_start_over or u.server is None for u in units)
            alive = any(u.server is None or u.server.state is State.RUNNING for u in units)
            if started and alive and all(u.runner_pid is not None for u in units):
                notifier.ready(summary(units))
                log.info("ready: %s", summary(units))
        if notifier.ready_sent:
            notifier.watchdog(now)
            if not stopping:
                notifier.status(summary(units))

    def stopping(self, status: str) -> None:
        self.notifier.stopping(status)


def _absolute(source: str) -> str:
    return str(Path(source).absolute()) if source != "<defaults>" else source
