"""A launched server's warm-up (``[comfyui] warmup``, comfysup.runner.warmup): the supervisor's side.

A server that answers GET /system_stats stays ``starting`` (its runner may not claim) until its runner has run
the warm-up of this start: the supervisor asks for it in the slot's shared block (``warm_wanted`` = the start's
number) and reads the end there (``warm_done``, ``warm_ms``, ``warm_error``). A warm-up that failed is a failed
start (:meth:`Policy.start_failed`: killed, counted as a quick failure, restarted with backoff, the slot
failed after too many); one that takes longer than ``warmup_timeout_seconds`` fails the same way. Its
duration is kept for ``status``, the page and /metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from comfysup.config import ComfyUIConfig
from comfysup.supervisor.children import Unit
from comfysup.supervisor.policy import Action

log = logging.getLogger("comfysup.supervisor")


def warmed(unit: Unit, now: float, c: ComfyUIConfig, act: Callable[[Unit, float, Action], None]) -> bool:
    """Whether the slot's answering server has finished its warm-up (True at once without ``[comfyui] warmup``).
    Asks for it on the first call of a start; a failure or a timeout fails the start (``act`` kills)."""
    if not c.warmup:
        return True
    timeout_seconds = c.warmup_timeout_seconds
    shared, policy = unit.shared, unit.server
    assert policy is not None
    if unit.warm_since is None:
        unit.warm_since = now
        shared.warm_wanted = unit.starts
        log.info("%s: ComfyUI answers; running its warm-up before it takes a job", unit.name,
                 extra={"event": "warmup"})
    if shared.warm_done != unit.starts:
        unit.last_check = f"warming up for {now - unit.warm_since:.0f} s"
        if now - unit.warm_since < timeout_seconds:
            return False
        reason = f"warm-up did not end within [comfyui] warmup_timeout_seconds = {timeout_seconds:g}"
    else:
        error = bytes(shared.warm_error).decode(errors="replace")
        if not error:
            unit.warmup_seconds = shared.warm_ms / 1000
            log.info("%s: warm-up done in %.2f s", unit.name, unit.warmup_seconds, extra={"event": "warmup"})
            return True
        reason = f"warm-up failed: {error}"
    unit.warmup_failures += 1
    unit.last_check = reason
    log.warning("%s: %s: a failed start, ComfyUI is killed", unit.name, reason, extra={"event": "warmup"})
    for action in policy.start_failed(now, reason):
        act(unit, now, action)
    return False
