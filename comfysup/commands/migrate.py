"""``comfysup migrate --to postgresql://…``: a user who outgrows one machine keeps their queue.

The jobs of the configured SQLite queue that are not yet terminal are copied into PostgreSQL (with
``--history`` also the terminal ones and every attempt row), with the input files they need, in
chunks of one transaction each. Files uploaded through the API that no job uses yet stay behind: a client
uploads them again (comfy-sdk does, when ``HEAD /api/v2/assets/by-hash`` says the content is not there). It is
idempotent: an id already in PostgreSQL with the same content is left alone, so a migration that was
interrupted is finished by running it again; the same id with different content is reported and left
as it is on both sides. The SQLite file is only read, never changed.

A job running in SQLite under a live lease is refused: its runner would go on working on a job that
PostgreSQL's runners can claim too. Stop ``comfysup run`` first (a running job's lease then expires, or
its supervisor releases it); a running job whose lease has expired is copied as queued, as a claim on it
would have requeued it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from comfysup.commands._common import config_from
from comfysup.errors import ConfigError, UsageError
from comfysup.queue.base import CANCELLED, DEAD, DONE, QUEUED, RUNNING, STORING, Attempt, JobRecord
from comfysup.queue.sqlite import SQLiteQueue

if TYPE_CHECKING:  # psycopg is an extra: imported at run time only by run, which says when it is missing
    from comfysup.queue.postgres import ImportResult, PostgresQueue

CHUNK = 500
"""Jobs per transaction: a crash loses at most one chunk's work, and memory stays flat."""
SHOWN_CONFLICTS = 20


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("migrate", parents=[common], help="copy the SQLite queue's jobs into PostgreSQL",
                       description="Copy the jobs of the configured SQLite queue ([queue] path) that are not "
                                   "yet done, dead or cancelled (storing ones too: this machine's uploader sends "
                                   "them from the new queue) into a PostgreSQL queue, so several machines can "
                                   "share it; with --history also the finished jobs and every attempt. Running "
                                   "it again copies nothing twice. Then set [queue] url to the same URL.")
    p.add_argument("--to", required=True, metavar="URL", help="the PostgreSQL queue: postgresql://user@host/db")
    p.add_argument("--history", action="store_true",
                   help="also copy done, dead and cancelled jobs, and the attempt rows of every copied job")
    p.set_defaults(func=run)


def _ready(job: JobRecord, now: float) -> JobRecord:
    """A running job whose lease expired goes over as queued, its open attempt ended as expired."""
    if job.state != RUNNING:
        return job
    attempts = [a if a.ended_at is not None else a._replace(ended_at=now, outcome="lease_expired",
                                                                      reason="lease expired")
                for a in job.attempts]
    return job._replace(state=QUEUED, owner=None, lease_until=None, attempts=attempts,
                               reason="lease expired: the runner stopped renewing it (before the migration)")


def _chunks(source: SQLiteQueue, states: Sequence[str], now: float) -> Iterator[list[JobRecord]]:
    chunk: list[JobRecord] = []
    for job in source.reads.iter_jobs(states):
        chunk.append(_ready(job, now))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _without_attempts(jobs: list[JobRecord]) -> list[JobRecord]:
    empty: list[Attempt] = []
    return [j._replace(attempts=empty) for j in jobs]


def _file_of(source: SQLiteQueue) -> Callable[[str], str | None]:
    """Where the SQLite queue keeps an input file's bytes (its asset folder), for the import to store."""
    def file_of(digest: str) -> str | None:
        path = source.assets.asset_file(digest)
        return str(path) if path is not None and path.is_file() else None
    return file_of


def run(args: argparse.Namespace) -> int:
    if not args.to.startswith(("postgresql://", "postgres://")):
        raise UsageError("--to: expected a postgresql://user@host/dbname URL")
    try:  # psycopg is an extra: every other command works without it
        from comfysup.queue.postgres import ImportResult, PostgresQueue, describe_url
    except ImportError as exc:
        raise ConfigError(f"migrate needs psycopg 3: pip install 'comfysup[postgres]' ({exc})") from exc
    config = config_from(args)
    source = SQLiteQueue(config.resolve(config.queue.path), create=False,
                         busy_timeout_seconds=config.queue.busy_timeout_seconds)
    where = describe_url(args.to)
    try:
        now = time.time()
        _refuse_live_leases(source, now)
        states = [QUEUED, RUNNING, STORING, *([DONE, DEAD, CANCELLED] if args.history else [])]
        counts = source.reads.status(now=now, dead_limit=0).counts
        total = sum(counts[s] for s in states) + (counts["waiting"] if QUEUED in states else 0)
        target = PostgresQueue(args.to, busy_timeout_seconds=config.queue.busy_timeout_seconds)
        done = ImportResult()
        print(f"migrating {total} job(s) from {source.path} to {where}"
              f"{' with their history' if args.history else ''}", file=sys.stderr)
        try:
            _copy(source, target, states, now, total, args.history, done)
        finally:
            target.close()
    finally:
        source.close()
    _report(done, where, source.path, args.history)
    return 1 if done.conflicts else 0


def _refuse_live_leases(source: SQLiteQueue, now: float) -> None:
    """A job running under a live lease would go on writing to the SQLite queue after its copy was made."""
    live = [j.id for j in source.reads.iter_jobs([RUNNING]) if (j.lease_until or 0) >= now]
    if live:
        raise UsageError(f"{len(live)} job(s) are running in {source.path} under a live lease (first: "
                         f"{live[0]}); stop comfysup run on this queue first, then migrate")


def _copy(source: SQLiteQueue, target: PostgresQueue, states: list[str], now: float, total: int, history: bool,
          done: ImportResult) -> None:
    """The jobs in ``states`` (``total`` of them), chunk by chunk, into ``target``, adding each chunk's result to
    ``done`` and saying the progress on stderr."""
    seen = 0
    for chunk in _chunks(source, states, now):
        got = target.import_records(chunk if history else _without_attempts(chunk),
                                    with_attempts=history, source_file=_file_of(source))
        done.inserted += got.inserted
        done.existing += got.existing
        done.conflicts += got.conflicts
        done.attempts += got.attempts
        done.assets += got.assets
        seen += len(chunk)
        print(f"  {seen}/{total}: {len(done.inserted)} copied, {len(done.existing)} already there, "
              f"{len(done.conflicts)} conflict(s)", file=sys.stderr)


def _report(done: ImportResult, where: str, path: Path, history: bool) -> None:
    """What was copied and what conflicted; with nothing in conflict, the setting that moves to PostgreSQL."""
    attempts = f" with {done.attempts} attempt row(s)" if history else ""
    inputs = f" and {done.assets} input file(s)" if done.assets else ""
    print(f"copied {len(done.inserted)} job(s){attempts}{inputs}, {len(done.existing)} already in {where}, "
          f"{len(done.conflicts)} conflict(s)")
    for job_id in done.conflicts[:SHOWN_CONFLICTS]:
        print(f"{job_id}: already in {where} with different content; left as it is on both sides")
    if len(done.conflicts) > SHOWN_CONFLICTS:
        print(f"… and {len(done.conflicts) - SHOWN_CONFLICTS} more conflict(s)")
    if not done.conflicts and done.inserted:
        print(f"now set [queue] url = \"{where}\" (with its password, if any) on every machine; {path} "
              "was not changed")
