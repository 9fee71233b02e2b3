"""``comfysup prune --done-before DATE [--files]``: forget old finished jobs, in batches runners do not feel.

A queue that runs for months holds millions of finished jobs. Claims do not slow down for them (every
claim is an index seek), but the file grows and ``results`` has more to read. Prune removes terminal jobs
(done, dead, cancelled) that finished before DATE, with their attempts, webhook deliveries, and the stored
workflows and input files (the asset store) no remaining job uses; with ``--files``, their folders in the
result store too. Assets uploaded through the API are kept until their ``expires_at`` (``[api]
upload_retention_hours`` after the upload), whatever DATE says, so a client can still submit the job that
references one; after it, prune removes the record, and the content unless a remaining job uses it.

With a bucket for outputs ([store] url), the objects of each removed job (everything under
``<prefix>/<job id>/``, leftovers of a repeated run included) are deleted with its rows, --files or not: no door
can hand them out once the job is forgotten. A bucket that does not answer leaves them, said at the end.

Each batch is its own short transaction (``--batch`` jobs, 500 by default), with a pause between batches,
so a runner waiting to record a done or claim the next job waits for one batch at most, never for the
whole prune. A job whose webhook is still being delivered is kept until its delivery ends. Files are
removed after their rows are committed: a prune killed in between leaves a batch's folders without rows
(harmless, though a later prune no longer knows them), never rows whose files are gone.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from comfysup.commands._common import config_from, queue_from
from comfysup.config import StoreConfig
from comfysup.errors import UsageError
from comfysup.queue.base import Queue, host_name
from comfysup.storage import s3

PAUSE_SECONDS = 0.02
"""Between two batches: a runner waiting for the write lock gets it before the next batch."""
_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*([dhm])")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("prune", parents=[common], help="remove old finished jobs (and, with --files, their files)",
                       description="Remove done, dead and cancelled jobs that finished before DATE, with their "
                                   "attempts and webhook deliveries, in short batches that running jobs do not "
                                   "wait for. Queued and running jobs are never touched.")
    p.add_argument("--done-before", required=True, metavar="DATE",
                   help="a date or time (2026-01-31, 2026-01-31T18:00, local time unless it says +00:00) or an "
                        "age (30d, 12h, 90m): jobs that finished before it are removed")
    p.add_argument("--files", action="store_true",
                   help="also delete each removed job's folder in the result store ([store] dir); with [store] url "
                        "the removed jobs' objects in the bucket are deleted in any case")
    p.add_argument("--batch", type=int, default=500, metavar="N", help="jobs per transaction (default 500)")
    p.add_argument("--dry-run", action="store_true", help="only say how many jobs would be removed")
    p.set_defaults(func=run)


def parse_before(text: str, now: float) -> float:
    """DATE as UTC epoch seconds: an ISO date or date-time (local time when it has no offset), or an age."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        amount, unit = float(relative.group(1)), relative.group(2)
        return now - amount * {"d": 86400, "h": 3600, "m": 60}[unit]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise UsageError(f"--done-before {text!r}: expected a date like 2026-01-31, a time like "
                         "2026-01-31T18:00 (local unless it has an offset such as +00:00), or an age like 30d, "
                         "12h or 90m") from exc
    return moment.timestamp()  # a naive datetime is local time, as a person typed it


def run(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise UsageError("--batch needs 1 or more")
    now = time.time()
    before = parse_before(args.done_before, now)
    if before > now:
        raise UsageError(f"--done-before {args.done_before!r} is in the future; nothing finished after now")
    config = config_from(args)
    queue = queue_from(config)
    label = datetime.fromtimestamp(before).strftime("%Y-%m-%d %H:%M:%S")
    try:
        total = queue.intake.prunable(before)
        if args.dry_run:
            print(f"{total:,} finished job(s) before {label}" + (" would be removed" if total else ""))
            return 0
        pruned = Pruned(store=config.resolve(config.store.dir), objects=BucketPrune(config.store))
        _prune_batches(queue, before, args, total, pruned)
        inputs, input_bytes = queue.assets.prune_assets()
    finally:
        queue.close()
    print(f"removed {pruned.removed:,} finished job(s) before {label}"
          + (f", and {pruned.folders:,} result folder(s) from {pruned.store}" if args.files else ""))
    if inputs:
        print(f"removed {inputs:,} input file(s) ({input_bytes:,} bytes) that no remaining job needs")
    pruned.objects.report()
    for machine, count in sorted(pruned.elsewhere.items()):
        print(f"note: {count:,} of them ran on {machine}, whose result store is not here; their folders stay on "
              f"that machine (under its [store] dir, named by job id)")
    return 1 if pruned.objects.failed else 0


@dataclass
class Pruned:
    """What a prune removed so far: jobs, result folders, and per machine the jobs whose folders stay there."""

    store: Path
    objects: BucketPrune
    removed: int = 0
    folders: int = 0
    elsewhere: dict[str, int] = field(default_factory=dict)

    def remove_folders(self, removed: list[tuple[str, str | None]], here: str) -> None:
        """The result folders of the removed jobs in this machine's store; one that ran on another machine is
        counted for it instead."""
        for job_id, machine in removed:
            if _remove(self.store / job_id):
                self.folders += 1
            elif machine and machine != here:
                self.elsewhere[machine] = self.elsewhere.get(machine, 0) + 1


def _prune_batches(queue: Queue, before: float, args: argparse.Namespace, total: int, pruned: Pruned) -> None:
    """Batch after batch, each its own transaction, a pause between them, until none is left; progress on stderr
    at most once a second."""
    here = host_name()
    started = last_report = time.monotonic()
    while True:
        batch = queue.intake.prune(before, limit=args.batch)
        if not batch.removed:
            return
        pruned.removed += len(batch.removed)
        if args.files:
            pruned.remove_folders(batch.removed, here)
        if time.monotonic() - last_report >= 1.0:
            last_report = time.monotonic()
            _progress(pruned.removed, total, last_report - started)
        time.sleep(PAUSE_SECONDS)
        pruned.objects.remove([job_id for job_id, _ in batch.removed])


class BucketPrune:
    """Deletes the removed jobs' objects from [store] url's bucket (nothing without one), after their rows are
    committed; a service that does not answer is said once and the rest of the prune goes on without it."""

    def __init__(self, store: StoreConfig) -> None:
        self.settings = store
        self.location = s3.parse(store.url) if store.url else None
        self.deleted = 0
        self.failed: list[str] = []
        self.error = ""

    def remove(self, job_ids: list[str]) -> None:
        if self.location is None:
            return
        if self.error:  # the service did not answer: no request per batch for the rest of the prune
            self.failed += job_ids
            return
        location = self.location
        try:
            self.deleted += s3.delete_prefixes(s3.client(self.settings),
                                               [(location.bucket, location.key(job_id) + "/") for job_id in job_ids])
        except Exception as exc:
            self.error = str(s3.sort_error(exc, f"deleting from {location}", self.settings))
            self.failed += job_ids

    def report(self) -> None:
        """What was deleted from the bucket, and on stderr what could not be."""
        if self.location is not None:
            print(f"deleted {self.deleted:,} object(s) of the removed jobs from {self.location}")
        if self.failed:
            print(f"error: the objects of {len(self.failed):,} removed job(s) could not be deleted ({self.error}); "
                  f"they stay under {self.location}/<job id>/, e.g. {self.failed[0]}", file=sys.stderr)


def _remove(folder: Path) -> bool:
    if not folder.is_dir() or folder.is_symlink():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _progress(removed: int, total: int, seconds: float) -> None:
    rate = removed / seconds if seconds > 0 else 0.0
    print(f"pruning: {removed:,} of {max(total, removed):,} job(s), {rate:,.0f}/s", file=sys.stderr, flush=True)
