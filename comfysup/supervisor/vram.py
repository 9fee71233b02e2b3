"""A server's device after a job (the memory recovery, the supervisor's side).

- A runner whose job met a lost device (comfysup.runner.memory) writes why into its slot's block
  (``Shared.restart``) and claims nothing more; :func:`restart_step` restarts that server as a recycle does
  (SIGTERM, SIGKILL after the stop bound, spawned again at once). The field is cleared at the next spawn.
- With NVML and ``[comfyui] idle_vram_free_mb``: a server that holds more VRAM than that while its runner
  waits for work is asked to POST /free; still above it at the next look, it is drained and restarted
  (:func:`idle_look`, at housekeeping). Without NVML nothing is watched, and the supervisor says so once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psutil

from comfysup.comfy import ComfyClient, ComfyError, deadline
from comfysup.gpus import GpuSampler
from comfysup.supervisor.children import Unit
from comfysup.supervisor.policy import Action, State
from comfysup.supervisor.recycle import drain

log = logging.getLogger("comfysup.supervisor")
FREE_TIMEOUT_SECONDS = 2.0
"""POST /free from the supervisor's loop: ComfyUI only sets two flags, so a short bound keeps the loop moving."""


def restart_step(unit: Unit, now: float) -> list[Action]:
    """The restart its runner asked for (a lost device), once, while the server runs."""
    reason = bytes(unit.shared.restart).decode(errors="replace")
    policy = unit.server
    if not reason or policy is None or policy.state is not State.RUNNING or unit.server_pid is None:
        return []
    log.error("%s: restarting ComfyUI (pid %d): %s", unit.name, unit.server_pid, reason,
              extra={"event": "device_restart"})
    return policy.transition(now, recycle=f"restarted: {reason}")


def idle_look(unit: Unit, now: float, bound_mb: int, held_mb: Callable[[Unit], float | None],
              free: Callable[[Unit], bool]) -> None:
    """At housekeeping: VRAM held by an idle, running server above ``bound_mb`` → /free; still above at the next
    look (and no job ran in between) → drained and restarted. ``held_mb``: what NVML says the server's processes
    hold (None: unknown); ``free``: POST /free to it, whether it took it."""
    policy = unit.server
    # Idle: its runner waits for work and holds no job. Not ``shared.busy``: an idle runner keeps it at 1 between
    # its looks for work (it says a claim may be under way, for recycling's drain), so a server was never seen idle
    # (an H200 run). Not ``shared.job`` alone: it is empty from an attempt's end on the server to the next
    # attempt's start, while the job its hand-off posted already runs there (the attempt before downloads).
    if (not bound_mb or policy is None or policy.state is not State.RUNNING or unit.draining is not None
            or unit.shared.job or not unit.shared.waiting):
        unit.idle_vram_mb = None
        return
    held = held_mb(unit)
    freed_before = unit.idle_vram_mb is not None and unit.idle_freed_after == unit.shared.jobs
    if held is None or held <= bound_mb:
        unit.idle_vram_mb = None
        return
    if unit.idle_restarted_after == unit.shared.jobs:
        # Restarted for it already and no job since: what holds it is not this server (another process on its GPU,
        # which NVML counts with the server's in a container: gpus.process_memory_mb's whole_device), and each
        # /free and restart would only bring the next. Said once; nothing more until a job runs.
        if unit.idle_vram_mb is None:
            log.warning("%s: still %.0f MiB of VRAM held while idle after a restart for it: left alone until a job "
                        "runs (another process on its GPU?)", unit.name, held, extra={"event": "idle_held"})
        unit.idle_vram_mb = held
        return
    if not freed_before:
        unit.idle_vram_mb, unit.idle_freed_after = held, unit.shared.jobs
        unit.idle_frees += int(free(unit))
        log.warning("%s: holds %.0f MiB of VRAM while idle (above idle_vram_free_mb = %d); POST /free",
                    unit.name, held, bound_mb, extra={"event": "idle_free"})
        return
    unit.idle_restarts += 1
    unit.idle_vram_mb = None
    unit.idle_restarted_after = unit.shared.jobs
    drain(unit, now, f"still {held:.0f} MiB of VRAM held while idle after POST /free (idle_vram_free_mb = "
          f"{bound_mb})")


class IdleWatch:
    """The idle-VRAM look of every launched slot at housekeeping: NVML opened once (only when
    ``idle_vram_free_mb`` is set), a short POST /free to the server that holds too much."""

    def __init__(self, bound_mb: int, sampler: Any = None) -> None:
        self.bound_mb = bound_mb
        self.sampler = sampler
        """NVML, opened at the first look (not in a supervisor that never ticks its housekeeping)."""
        self.units: list[Unit] = []
        """The units of the last look (which of them share a GPU)."""

    def look(self, units: list[Unit], now: float) -> None:
        if not self.bound_mb:
            return
        self.units = units
        if self.sampler is None:
            self.sampler = GpuSampler()
            if not self.sampler.ready:
                log.warning("[comfyui] idle_vram_free_mb = %d: %s, so no server's VRAM is watched", self.bound_mb,
                            self.sampler.note)
        for unit in units:
            idle_look(unit, now, self.bound_mb, self._held, _free)

    def _held(self, unit: Unit) -> float | None:
        slot = unit.plan.slot if unit.plan is not None else None
        if slot is None or slot.device is None or unit.server_pid is None:
            return None
        try:
            pids = {unit.server_pid, *(c.pid for c in psutil.Process(unit.server_pid).children(recursive=True))}
        except psutil.Error:
            return None
        alone = sum(1 for u in self.units if u.plan is not None and u.plan.slot.device == slot.device) == 1
        return self.sampler.process_memory_mb(slot.device, pids, whole_device=alone)


def _free(unit: Unit) -> bool:
    client = ComfyClient(unit.url, timeout_seconds=FREE_TIMEOUT_SECONDS)
    try:
        client.free()
    except (ComfyError, deadline.DeadlineExceeded) as exc:
        log.warning("%s: POST /free failed: %s", unit.name, getattr(exc, "reason", None) or exc)
        return False
    finally:
        client.close()
    return True
