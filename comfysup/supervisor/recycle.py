"""Recycling a slot's ComfyUI server: after N jobs ([supervisor] recycle_after_jobs) or above a memory bound
(recycle_rss_mb, checked at housekeeping), the runner is drained (it finishes its job and claims no more), then
the server is restarted. Plain functions of the slot's ``Unit``; the supervisor carries out the actions.
"""

from __future__ import annotations

import logging

from comfysup.config import SupervisorConfig
from comfysup.supervisor import server as servers
from comfysup.supervisor.children import Unit
from comfysup.supervisor.policy import Action, State

log = logging.getLogger("comfysup.supervisor")


def step(unit: Unit, every: int, now: float, settle_seconds: float) -> list[Action]:
    """The server's restart actions once a drained runner holds no job (none while it still does): the drain
    begins after ``every`` jobs since the server started (0: never)."""
    policy = unit.server
    if policy is None or policy.state is not State.RUNNING:
        return []
    if unit.draining is None and every and unit.shared.jobs - unit.jobs_at_server_start >= every:
        drain(unit, now, f"recycled after {unit.shared.jobs - unit.jobs_at_server_start} job(s)")
    if unit.draining is None:
        return []
    # The flag was cleared in an earlier tick; busy == 0 now means the runner has seen it and holds
    # no job (or it is not running at all).
    settled = now - unit.draining_since >= settle_seconds
    if settled and (unit.runner_pid is None or not unit.shared.busy):
        log.info("%s: %s; restarting ComfyUI", unit.name, unit.draining)
        return list(policy.transition(now, recycle=unit.draining))
    return []


def drain(unit: Unit, now: float, why: str) -> None:
    """The runner finishes its job and claims no more; the server is restarted once it holds none."""
    unit.draining = why
    unit.draining_since = now
    unit.shared.may_claim = 0
    log.info("%s: %s: the runner finishes its job, then ComfyUI is restarted", unit.name, why)


def housekeeping(unit: Unit, s: SupervisorConfig, now: float) -> None:
    """The server's log rotated past log_max_mb, its memory measured, and a drain begun above recycle_rss_mb."""
    if unit.plan is None:
        return
    if servers.rotate_log(unit.plan.log_path, s.log_max_mb * 2**20):
        log.info("%s: rotated %s", unit.name, unit.plan.log_path)
    if unit.server_pid is not None:
        unit.last_rss_mb = servers.tree_rss_mb(unit.server_pid)
        if (s.recycle_rss_mb and unit.draining is None and unit.server is not None
                and unit.server.state is State.RUNNING and unit.last_rss_mb > s.recycle_rss_mb):
            drain(unit, now, f"memory {unit.last_rss_mb:.0f} MiB above recycle_rss_mb = {s.recycle_rss_mb}")
