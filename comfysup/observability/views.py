"""What ``comfysup status --watch`` and the status page show: one snapshot, two renderings.

Both answer the same questions at a glance (which slots are up, which jobs run and how far along they
are, how many wait, how fast jobs finish, what died lately), so both are built from one
:class:`Overview`, read from the queue and the supervisor's state file in one go.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from comfysup.queue.base import OutboxLevel, Queue, Status
from comfysup.queue.values import TenantCount
from comfysup.records import Record, new
from comfysup.slotstate import staleness
from comfysup.timefmt import age

if TYPE_CHECKING:
    from comfysup.queue.run_values import JobRecord

POSTED_TEXT = "in the server's queue, behind the prompt that runs there"
"""What a posted job does: claimed ahead, it waits in its server's queue, not yet executing."""
WINDOW_SECONDS = 300.0
"""Jobs per minute are counted over the last five minutes."""


class Overview(Record):
    now: float
    status: Status
    finished: dict[str, int]
    """Jobs that reached each terminal state in the last WINDOW_SECONDS."""
    recent_done: list[JobRecord]
    supervisor: dict[str, Any] | None
    stale: str | None
    """Why the supervisor's state should not be believed (None while it runs, or when there is none)."""
    announcements: int = 0
    """The broker outbox's backlog: ended jobs not yet announced to RabbitMQ."""
    outboxes: dict[str, OutboxLevel] = new(dict)
    """What each outbox holds (comfysup.queue.roles ``Deliveries.outboxes``)."""
    tenants: tuple[TenantCount, ...] = ()
    """Each tenant's jobs and seconds used (comfysup.queue.tenants)."""

    @property
    def per_minute(self) -> float:
        """Jobs done per minute over the window."""
        return self.finished.get("done", 0) / (WINDOW_SECONDS / 60)


def overview(queue: Queue, state: dict[str, Any] | None, now: float | None = None, *, dead: int = 5,
             done: int = 0) -> Overview:
    now = time.time() if now is None else now
    status = queue.reads.status(now, dead_limit=dead, done_limit=done)
    finished = queue.reads.finished_counts(now - WINDOW_SECONDS)
    recent = queue.reads.get_many([i for i, _ in status.recent_done]) if status.recent_done else []
    return Overview(now=now, status=status, finished=finished, recent_done=recent, supervisor=state,
                    stale=None if state is None else staleness(state, now),
                    announcements=queue.deliveries.announcement_backlog(), outboxes=queue.deliveries.outboxes(now),
                    tenants=tuple(queue.reads.tenant_counts()))


OUTBOX_NAMES = (("uploads", "uploads"), ("webhooks", "webhooks"), ("broker", "broker results"))


def outboxes_text(levels: dict[str, OutboxLevel]) -> str:
    """``outboxes: uploads 3 (12.5 MiB, oldest 2m 3s) · webhooks 0 · broker results 0``: what each holds."""
    parts = []
    for key, name in OUTBOX_NAMES:
        level = levels.get(key)
        if level is None:
            continue
        more = [f"{level.bytes / 2**20:.1f} MiB"] if level.bytes else []
        if level.items and level.oldest_age_seconds is not None:
            more.append(f"oldest {age(max(0.0, level.oldest_age_seconds))}")
        parts.append(f"{name} {level.items}" + (f" ({', '.join(more)})" if more else ""))
    return "outboxes: " + " · ".join(parts)


def staging_text(state: dict[str, Any] | None) -> str | None:
    """Why runners claim nothing while the staging folder is full (supervisor.json's or work.json's ``staging``)."""
    staging = (state or {}).get("staging")
    if isinstance(staging, dict) and staging.get("full"):
        return f"{staging.get('reason')}; no new job is claimed until uploads free room"
    return None


def several_tenants(tenants: Sequence[TenantCount]) -> bool:
    """Whether the queue serves tenants at all: some tenant other than ``default`` is known."""
    return any(t.tenant != "default" for t in tenants)


def tenant_lines(tenants: Sequence[TenantCount]) -> list[str]:
    """Each tenant's jobs queued, running and done, its slot seconds and its share of them, as a table."""
    used = sum(t.gpu_seconds for t in tenants) or 1.0
    width = max([len("tenant"), *(len(t.tenant) for t in tenants)])
    lines = [f"{'tenant':<{width}}  {'weight':>6}  {'cap':>4}  {'queued':>7}  {'running':>7}  {'done':>8}  "
             f"{'GPU s':>10}  {'share':>6}"]
    for t in tenants:
        cap = "-" if t.max_running is None else str(t.max_running)
        lines.append(f"{t.tenant:<{width}}  {t.weight:>6g}  {cap:>4}  {t.queued:>7}  {t.running:>7}  {t.done:>8}  "
                     f"{t.gpu_seconds:>10.1f}  {t.gpu_seconds / used:>6.1%}")
    return lines


def progress_text(progress: dict[str, Any] | None) -> str:
    """``node 2/3 KSampler, step 12/20`` — or ``waiting in ComfyUI's queue`` before anything ran."""
    if not progress:
        return "waiting in ComfyUI's queue"
    if progress.get("phase") == "downloading":
        return "downloading outputs"
    parts = [f"node {progress.get('node', '?')}/{progress.get('nodes', '?')}"
             + (f" {progress['class_type']}" if progress.get("class_type") else "")]
    if progress.get("steps"):
        parts.append(f"step {progress.get('step', 0)}/{progress['steps']}")
    if progress.get("cached"):
        parts.append(f"{progress['cached']} cached")
    return ", ".join(parts)


def progress_fraction(progress: dict[str, Any] | None) -> float:
    """How far along, 0..1, for a bar: whole nodes done plus the running node's steps."""
    if not progress:
        return 0.0
    if progress.get("phase") == "downloading":
        return 1.0
    nodes = max(1, int(progress.get("nodes") or 1))
    node = max(0, int(progress.get("node") or 0))
    within = (progress.get("step") or 0) / progress["steps"] if progress.get("steps") else 0.0
    return max(0.0, min(1.0, (max(node - 1, 0) + within) / nodes))
