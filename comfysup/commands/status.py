"""``comfysup status``: where every job is, at a glance; ``--json`` for scripts."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from comfysup.commands._common import age, config_from, queue_from
from comfysup.queue.base import Status
from comfysup.redact import bound


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("status", parents=[common], help="counts by state, running jobs, last dead letters",
                       description="Show how many jobs are queued, waiting to retry, running, done, dead "
                                   "and cancelled; the oldest queued job's age; each running job; and the "
                                   "last dead letters with their reasons.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--dead", type=int, default=5, metavar="N", help="how many dead letters to list (default 5)")
    p.set_defaults(func=run)


def snapshot(status: Status, now: float) -> dict[str, Any]:
    return {
        "counts": status.counts,
        "oldest_queued_age_seconds": None if status.oldest_queued_at is None else now - status.oldest_queued_at,
        "running": [{"id": r.id, "server": r.server, "owner": r.owner, "attempt": r.attempt,
                     "elapsed_seconds": now - r.started_at, "lease_left_seconds": r.lease_until - now}
                    for r in status.running],
        "recent_dead": [{"id": i, "finished_at": t, "reason": reason} for i, t, reason in status.recent_dead],
    }


def render(status: Status, now: float) -> str:
    c = status.counts
    lines = [f"queued {c['queued']} · waiting to retry {c['waiting']} · running {c['running']} · "
             f"done {c['done']} · dead {c['dead']} · cancelled {c['cancelled']}"]
    if status.oldest_queued_at is not None:
        lines.append(f"oldest queued job: {age(now - status.oldest_queued_at)} old")
    if status.running:
        lines.append("")
        lines.append(f"{'running job':36}  {'server':10} {'attempt':>7}  elapsed")
        lines += [f"{r.id:36}  {r.server:10} {r.attempt:>7}  {age(now - r.started_at)}" for r in status.running]
    if status.recent_dead:
        lines.append("")
        lines.append("last dead letters:")
        lines += [f"  {i}  {age(now - t)} ago: {bound(reason or '', 300)}" for i, t, reason in status.recent_dead]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    queue = queue_from(config_from(args))
    try:
        now = time.time()
        status = queue.status(now, dead_limit=args.dead)
    finally:
        queue.close()
    print(json.dumps(snapshot(status, now), indent=2) if args.json else render(status, now))
    return 0
