"""``comfysup submit jobs.jsonl``: validate the whole file, then insert all of it in one transaction."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from comfysup.commands._common import config_from, queue_from
from comfysup.config import Config
from comfysup.config.tenants import TENANT_NAME
from comfysup.errors import ComfysupError, QueueError, QueueUnavailable, UsageError
from comfysup.jobs import READ_AHEAD_LINES, JobsFile, Problem, format_problems
from comfysup.jobs.catalogue import Catalogue
from comfysup.queue.base import (
    CANCELLED,
    DEAD,
    DONE,
    POSTED,
    QUEUED,
    RUNNING,
    STORING,
    TERMINAL,
    Queue,
    SubmitConflict,
)
from comfysup.records import replace
from comfysup.redact import bound

WAIT_POLL_SECONDS = 0.5


class InvalidJobs(ComfysupError):
    """The jobs file has problems; nothing was submitted."""

    exit_code = 2


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "submit", parents=[common], help="validate a jobs.jsonl file and queue all of its jobs",
        description="Validate every line of a jobs file (ids, JSON, the workflow graph), report each "
                    "problem as FILE:LINE: reason, and only when all lines are good insert them all in one "
                    "transaction. Submitting the same file again queues nothing twice. Input files in set "
                    "({\"file\": PATH}, {\"url\": \"https://...\"}, {\"s3\": \"s3://bucket/key\"}) are read once, "
                    "here, into the asset store ([assets], [inputs]); a download shows a bar on a terminal.")
    p.add_argument("file", help="the jobs file, one JSON object a line; - reads standard input (workflow "
                   "paths are then relative to the current directory)")
    p.add_argument("--dry-run", action="store_true", help="validate only; insert nothing")
    p.add_argument("--tenant", metavar="NAME", help="the tenant of every line that names none (a line's own "
                   "\"tenant\" wins); without either, the jobs are the default tenant's. A tenant's [tenants.NAME] "
                   "max_queued refuses a submit that would pass it: nothing is queued and submit exits 4")
    p.add_argument("--queue", metavar="PATH", help="the SQLite queue file to submit to ([queue] path), made when "
                   "missing; without it and without a config file, submit says where it looked and stops rather "
                   "than make a queue that no supervisor reads")
    p.add_argument("--to", choices=("queue", "rabbitmq"), default="queue", help="queue (default): insert into "
                   "the queue; rabbitmq: publish every line to [rabbitmq] queue, confirmed (workflow paths are "
                   "then resolved below [rabbitmq] workflows_dir, as the consumer resolves them)")
    p.add_argument("--wait", action="store_true", help="then show a progress bar until every job of the file "
                   "is done, dead or cancelled, and print the summary; exit 0 when all are done, 1 otherwise. The "
                   "bar counts the jobs that ended (done + dead + cancelled of the file's jobs) and shows the rest "
                   "by state: running (executing), posted (waiting in a server's queue), queued")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "tenant", None) is not None and not TENANT_NAME.fullmatch(args.tenant):
        raise UsageError(f"--tenant {args.tenant!r}: a tenant's name is 1 to 64 letters, digits, '_', '.' or '-'")
    config = config_from(args)
    try:
        queue = _queue(config, args.dry_run)
        try:
            with _opened(args.file) as (path, label, base_dir), _without_cycle_collection():
                return _submit(args, config, queue, path, label, base_dir)
        finally:
            if queue is not None:
                queue.close()
    except QueueUnavailable as exc:
        raise unavailable(exc) from exc


def unavailable(exc: QueueUnavailable) -> QueueUnavailable:
    """What submit says when the queue's database does not answer (restarted, unreachable, locked by a backup):
    that nothing was submitted, unless the failure came as the commit was sent; either way, that submitting the
    same file again is safe (a job already stored is not queued twice)."""
    stored = ("it stopped answering as the jobs were committed, so they may or may not have been stored"
              if exc.maybe_stored else "nothing was submitted")
    return QueueUnavailable(f"the queue is unavailable ({exc}); {stored}. Submit the same file again once it "
                            "answers: a job already stored is not queued twice", maybe_stored=exc.maybe_stored)


def _queue(config: Config, dry_run: bool) -> Queue | None:
    """The queue, for its node catalogues and the insert; a dry run of a queue not made yet has none."""
    if not dry_run:
        return queue_from(config, create=True)
    try:
        return queue_from(config)
    except QueueError:
        return None


def _catalogues(queue: Queue | None) -> list[Catalogue]:
    """The node catalogues the servers have now; none yet: the checks that need one are skipped, said once."""
    found = [Catalogue(r.id, r.info, tuple(r.servers)) for r in queue.fleet.catalogues()] if queue is not None else []
    if not found:
        print("warning: no server has recorded its node catalogue (/object_info) in the queue yet, so node "
              "classes, inputs, values and model files are not checked; a runner records it when its server "
              "starts", file=sys.stderr)
    return found


def _submit(args: argparse.Namespace, config: Config, queue: Queue | None, path: Path, label: str,
            base_dir: Path) -> int:
    if getattr(args, "to", "queue") == "rabbitmq":
        return _publish(args, config, queue, path, label)
    jobs = JobsFile(path, label=label, base_dir=base_dir, catalogues=_catalogues(queue),
                    allow_private_callbacks=config.webhooks.allow_private,
                    max_input_bytes=config.assets.max_file_mb * 2**20,
                    max_job_input_bytes=config.assets.max_job_mb * 2**20,
                    input_roots=[base_dir, *(config.resolve(r) for r in config.assets.input_roots)],
                    inputs_where="the jobs file's folder" + (" or [assets] input_roots"
                                                            if config.assets.input_roots else ""),
                    remote=config.inputs, s3_buckets=config.inputs.s3_buckets or None, progress=DownloadBar())
    jobs.inputs.stored = queue.assets.asset_size if queue is not None else None  # a held blake3 is not fetched again
    try:
        return _insert(args, config, queue, jobs, label)
    finally:
        jobs.close()  # the inputs fetched by URL are in the asset store now, or refused


def _insert(args: argparse.Namespace, config: Config, queue: Queue | None, jobs: JobsFile, label: str) -> int:
    checked = jobs.validate()
    if _refused_or_dry(args, label, checked, "submitted"):
        return 0
    ids = list(checked.lines_by_id)
    assert queue is not None
    try:
        # A large file is read a second time by a child process while this one inserts (see jobs_read_ahead).
        two_cpus = checked.count >= READ_AHEAD_LINES and (os.cpu_count() or 1) > 1
        made = jobs.jobs_read_ahead() if two_cpus else jobs.jobs()
        tenant = getattr(args, "tenant", None)
        result = queue.intake.submit(made if not tenant else (j if j.tenant else replace(j, tenant=tenant)
                                                               for j in made))
    except SubmitConflict as exc:
        problems = [Problem(checked.lines_by_id[i], f"id {i} is already in the queue with different "
                            "content; give the changed job a new id") for i in exc.ids]
        for line in format_problems(label, sorted(problems, key=lambda p: p.line)):
            print(line, file=sys.stderr)
        raise InvalidJobs(f"{len(exc.ids)} problem(s) in {label}; nothing was submitted") from exc
    jobs.close()  # not kept through --wait
    print(f"submitted {result.inserted} job(s), {result.existing} already submitted")
    if args.wait:
        sys.stdout.flush()
        return wait(config, ids)
    return 0


class DownloadBar:
    """An input's download on standard error (comfysup.jobs.fetch.Progress): a tqdm bar on a terminal, shown
    only when the download lasts more than half a second; nothing on a pipe or in a log."""

    def __init__(self, file: Any = None, *, terminal_only: bool = True, delay: float = 0.5) -> None:
        self.bar: Any = None
        self.file, self.terminal_only, self.delay = file, terminal_only, delay

    def start(self, name: str, total: int | None) -> None:
        from tqdm import tqdm  # a bar is drawn by a download and by --wait only; tqdm costs more than a submit

        self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"fetching {name}",
                        file=self.file or sys.stderr, delay=self.delay, leave=False,
                        disable=None if self.terminal_only else False, dynamic_ncols=True)

    def advance(self, size: int) -> None:
        self.bar.update(size)

    def end(self) -> None:
        self.bar.close()


def _publish(args: argparse.Namespace, config: Config, queue: Queue | None, path: Path, label: str) -> int:
    """``--to rabbitmq``: the same validation, then every line published with confirms (comfysup.broker)."""
    if not config.rabbitmq.url:
        raise UsageError(f"{config.source}: --to rabbitmq needs [rabbitmq] url (or $COMFYSUP_RABBITMQ_URL)")
    # pika is an optional dependency (comfysup[rabbitmq]): loaded only by --to rabbitmq.
    from comfysup.broker import publish

    _catalogues(queue)  # the warning when there is none
    jobs, checked = publish.validate(config, queue, path, label)
    jobs.close()  # inputs by URL were fetched to check them; the consumer fetches them again
    if _refused_or_dry(args, label, checked, "published"):
        return 0
    try:
        sent = publish.publish_lines(config, publish.file_lines(path, checked))
    except publish.BrokerError as exc:
        raise ComfysupError(f"RabbitMQ at {publish.where(config.rabbitmq.url)}: {type(exc).__name__} {exc}; "
                            "lines confirmed before it are queued, publishing the file again is safe") from exc
    print(f"published {sent} job(s) to RabbitMQ queue {config.rabbitmq.queue!r}, each confirmed")
    if args.wait:
        sys.stdout.flush()
        return wait(config, list(checked.lines_by_id))
    return 0


def wait(config: Config, ids: list[str]) -> int:
    """A tqdm bar until every job of the file is terminal, then the summary: exit 0 when all are done.

    Only the jobs not yet terminal are asked about on each poll (``Queue.states``, no workflows read), so
    waiting on a file of 100,000 jobs costs the queue less with every job that ends.
    """
    from tqdm import tqdm  # see Progress.start: only --wait and a download draw a bar

    queue = queue_from(config)
    ended: dict[str, str] = {}
    left = list(ids)
    try:
        with tqdm(total=len(ids), unit="job", desc="ended", file=sys.stderr, dynamic_ncols=True) as bar:
            while left:
                states = queue.reads.states(left)
                now_ended = {i: s for i, s in states.items() if s in TERMINAL}
                ended.update(now_ended)
                left = [i for i in left if i not in now_ended]
                # The counts first, then the bar's move, which draws both: drawn the other way round, the last
                # frame showed 12/12 beside the counts of the poll before (done=10).
                bar.set_postfix(wait_counts(ended, states, left), refresh=False)
                bar.update(len(now_ended))
                if left:
                    time.sleep(WAIT_POLL_SECONDS)
        return _summary(queue, ended)
    finally:
        queue.close()


def wait_counts(ended: dict[str, str], states: dict[str, str], left: list[str]) -> dict[str, int]:
    """One set of counts for the bar, from one poll: the ended jobs by state (their sum is the bar's
    position), then the jobs still to end by state as ``status`` counts them, a posted job apart from the running
    ones, and the storing ones (their outputs waiting for the bucket) when there are any; ``queued`` holds every
    other one (waiting to retry, or not in the queue yet). They add up to the file's jobs, the bar's total."""
    ended_counts = Counter(ended.values())
    rest = Counter(states.get(i, QUEUED) for i in left)
    counts = {"done": ended_counts[DONE], "dead": ended_counts[DEAD], "cancelled": ended_counts[CANCELLED],
              "running": rest[RUNNING], "posted": rest[POSTED]}
    if rest[STORING]:
        counts["storing"] = rest[STORING]
    counts["queued"] = len(left) - counts["running"] - counts["posted"] - rest[STORING]
    return counts


def _summary(queue: Queue, ended: dict[str, str]) -> int:
    counts = Counter(ended.values())
    print(f"summary: {counts[DONE]} done, {counts[DEAD]} dead-lettered, {counts[CANCELLED]} cancelled")
    failed = [i for i, s in ended.items() if s != DONE]
    for job in queue.reads.get_many(failed[:10]):
        print(f"  {job.id} {job.state}: {bound(job.reason or '', 300)}")
    if len(failed) > 10:
        print(f"  … and {len(failed) - 10} more (comfysup status, comfysup show ID)")
    return 0 if not failed else 1


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off while a file is read and inserted: each line allocates a few dozen
    short-lived dicts and lists, freed by their reference counts, and the collector, started every 700
    allocations, found nothing to collect in 100,000 lines and took about a sixth of the submit's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _opened:
    """The file to read twice: a path as it is, or standard input spooled to a private temporary file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tmp: tempfile._TemporaryFileWrapper | None = None

    def __enter__(self) -> tuple[Path, str, Path]:
        if self.name == "-":
            if sys.stdin is None or sys.stdin.closed:
                raise UsageError("standard input is closed: pipe the jobs in (comfysup submit - < jobs.jsonl) "
                                 "or give the file's path")
            self.tmp = tempfile.NamedTemporaryFile(prefix="comfysup-submit-", suffix=".jsonl")
            try:
                shutil.copyfileobj(sys.stdin.buffer, self.tmp)
            except OSError as exc:
                self.tmp.close()
                raise UsageError(f"standard input cannot be read ({exc.strerror or exc}): pipe the jobs in "
                                 "or give the file's path") from None
            self.tmp.flush()
            return Path(self.tmp.name), "<stdin>", Path.cwd()
        path = Path(self.name)
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        return path, self.name, path.resolve().parent

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            self.tmp.close()


def _refused_or_dry(args: argparse.Namespace, label: str, checked: Any, done: str) -> bool:
    """Print the warnings; on problems print every one and raise InvalidJobs; True for a --dry-run (said)."""
    for line in format_problems(label, checked.warnings):
        print(line, file=sys.stderr)
    if not checked.ok:
        for line in format_problems(label, checked.problems):
            print(line, file=sys.stderr)
        raise InvalidJobs(f"{checked.problem_count} problem(s) in {label}; "
                          f"nothing was {done}")
    if args.dry_run:
        print(f"{label}: {checked.count} job(s) valid; nothing {done} (--dry-run)")
        return True
    return False
