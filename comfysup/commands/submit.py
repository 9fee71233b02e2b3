"""``comfysup submit jobs.jsonl``: validate the whole file, then insert all of it in one transaction."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from comfysup.commands._common import config_from, object_info_path, queue_from
from comfysup.errors import ComfysupError, UsageError
from comfysup.jobs import JobsFile, ObjectInfo, Problem, format_problems
from comfysup.queue.base import SubmitConflict


class InvalidJobs(ComfysupError):
    """The jobs file has problems; nothing was submitted."""

    exit_code = 2


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "submit", parents=[common], help="validate a jobs.jsonl file and queue all of its jobs",
        description="Validate every line of a jobs file (ids, JSON, the workflow graph), report each "
                    "problem as FILE:LINE: reason, and only when all lines are good insert them all in one "
                    "transaction. Submitting the same file again queues nothing twice.")
    p.add_argument("file", help="the jobs file, one JSON object a line; - reads standard input (workflow "
                   "paths are then relative to the current directory)")
    p.add_argument("--dry-run", action="store_true", help="validate only; insert nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    with _opened(args.file) as (path, label, base_dir):
        jobs = JobsFile(path, label=label, base_dir=base_dir,
                        object_info=ObjectInfo.load(object_info_path(config)))
        checked = jobs.validate()
        for line in format_problems(label, checked.warnings):
            print(line, file=sys.stderr)
        if not checked.ok:
            for line in format_problems(label, checked.problems):
                print(line, file=sys.stderr)
            raise InvalidJobs(f"{len(checked.problems)} problem(s) in {label}; nothing was submitted")
        if args.dry_run:
            print(f"{label}: {checked.count} job(s) valid; nothing submitted (--dry-run)")
            return 0
        queue = queue_from(config, create=True)
        try:
            result = queue.submit(jobs.jobs())
        except SubmitConflict as exc:
            problems = [Problem(checked.lines_by_id[i], f"id {i} is already in the queue with different "
                                "content; give the changed job a new id") for i in exc.ids]
            for line in format_problems(label, sorted(problems, key=lambda p: p.line)):
                print(line, file=sys.stderr)
            raise InvalidJobs(f"{len(exc.ids)} problem(s) in {label}; nothing was submitted") from exc
        finally:
            queue.close()
    print(f"submitted {result.inserted} job(s), {result.existing} already submitted")
    return 0


class _opened:
    """The file to read twice: a path as it is, or standard input spooled to a private temporary file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tmp: tempfile._TemporaryFileWrapper | None = None

    def __enter__(self) -> tuple[Path, str, Path]:
        if self.name == "-":
            self.tmp = tempfile.NamedTemporaryFile(prefix="comfysup-submit-", suffix=".jsonl")
            shutil.copyfileobj(sys.stdin.buffer, self.tmp)
            self.tmp.flush()
            return Path(self.tmp.name), "<stdin>", Path.cwd()
        path = Path(self.name)
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        return path, self.name, path.resolve().parent

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            self.tmp.close()
