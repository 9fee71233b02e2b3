"""``comfysup retry`` and ``comfysup cancel``: a person's hand on the queue."""

from __future__ import annotations

import argparse

from comfysup.commands._common import config_from, queue_from
from comfysup.commands.ids import resolve_ids
from comfysup.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("retry", parents=[common], help="put dead jobs back in the queue",
                       description="Put dead jobs back in the queue with their attempts reset; their "
                                   "earlier attempts stay in their history. A storing job named by id is run "
                                   "again too: for one whose machine is gone for good with the staged files "
                                   "(`comfysup show` says which machine and folder); a storing job whose machine "
                                   "is alive is uploaded by it, no retry needed.")
    p.add_argument("ids", nargs="*", metavar="ID", help="job ids, or any unique prefix of one (as git takes it)")
    p.add_argument("--all-dead", action="store_true", help="every dead job")
    p.set_defaults(func=retry)
    p = sub.add_parser("cancel", parents=[common], help="cancel queued, running or storing jobs",
                       description="A queued job becomes cancelled at once; a running one is marked, and "
                                   "its runner interrupts it on the server and records it as cancelled. A storing "
                                   "job (its outputs waiting for the bucket) is cancelled at once: its staged files "
                                   "are dropped, objects already uploaded stay under its prefix until prune.")
    p.add_argument("ids", nargs="+", metavar="ID", help="job ids, or any unique prefix of one (as git takes it)")
    p.set_defaults(func=cancel)


def _report(results: dict[str, str], good: set[str]) -> int:
    for job_id, what in results.items():
        print(f"{job_id}: {what}")
    bad = [i for i, what in results.items() if what not in good]
    return 1 if bad else 0


def retry(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all_dead):
        raise UsageError("give job ids, or --all-dead (not both)")
    queue = queue_from(config_from(args))
    try:
        results = queue.intake.requeue_dead(None if args.all_dead else resolve_ids(queue, args.ids))
    finally:
        queue.close()
    if args.all_dead:
        print(f"requeued {len(results)} dead job(s)")
        return 0
    return _report(results, {"requeued"})


def cancel(args: argparse.Namespace) -> int:
    queue = queue_from(config_from(args))
    try:
        results = queue.intake.cancel(resolve_ids(queue, args.ids))
    finally:
        queue.close()
    return _report(results, {"cancelled", "cancelling"})
