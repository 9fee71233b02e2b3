"""``comfysup results``: one row per job — parameters as columns, status, files, reasons, times."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from comfysup.commands._common import config_from, queue_from
from comfysup.errors import UsageError
from comfysup.queue.base import JobRecord
from comfysup.redact import Redactor, mask


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("results", parents=[common], help="one row per job: parameters, status, files, times",
                       description="Print one row per job: its id, its `set` parameters as columns, status, "
                                   "server, the machine that did it, attempts, files (name:sha256 prefix), "
                                   "reason, time waited in the queue, and run time per attempt and in all. With a "
                                   "jobs file, only its jobs, in its order. --csv adds where each file is, as "
                                   "host:path, for a store on each machine's own disk.")
    p.add_argument("file", nargs="?", help="a jobs.jsonl file: show only its jobs")
    p.add_argument("--csv", action="store_true", help="CSV on standard output (full hashes and file paths, and "
                   "a locations column of host:path)")
    p.set_defaults(func=run)


def _ids_of(path: Path) -> list[str]:
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    ids = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                ids.append(str(json.loads(raw)["id"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise UsageError(f"{path}:{number}: no readable id ({exc})") from exc
    return ids


RESULT_COLUMNS = ("status", "server", "machine", "attempts", "files", "reason", "queue_wait_s", "attempt_run_s",
                  "total_s")
CSV_COLUMNS = (*RESULT_COLUMNS, "locations")
"""``locations``: each file as host:path, since store.dir may be each machine's own disk."""


def row(job: JobRecord, params: list[str], full: bool) -> dict[str, Any]:
    clean = Redactor.for_job(job.workflow, job.extra_data)
    shown = mask(job.params)
    first_start = job.attempts[0].started_at if job.attempts else None
    runs = [a.ended_at - a.started_at for a in job.attempts if a.ended_at is not None]
    files = [f"{o.path if full else o.name}:{o.sha256 if full else o.sha256[:12]}" for o in job.outputs]
    out: dict[str, Any] = {"id": job.id}
    out.update({p: json.dumps(shown[p]) if p in shown else "" for p in params})
    out.update({
        "status": job.state,
        "server": job.server or (job.attempts[-1].server if job.attempts else ""),
        "machine": job.machine or "",
        "attempts": job.attempt,
        "files": " ".join(files),
        "reason": clean(job.reason, 2000 if full else 120) if job.reason else "",
        "queue_wait_s": f"{first_start - job.submitted_at:.3f}" if first_start else "",
        "attempt_run_s": ";".join(f"{r:.3f}" for r in runs),
        "total_s": f"{job.finished_at - job.submitted_at:.3f}" if job.finished_at else "",
    })
    if full:
        out["locations"] = " ".join(f"{job.machine or ''}:{o.path or o.name}" for o in job.outputs)
    return out


def _jobs(args: argparse.Namespace, queue: Any, warn: bool = False) -> Iterator[JobRecord]:
    if args.file:
        ids = _ids_of(Path(args.file))
        for start in range(0, len(ids), 500):
            found = {j.id: j for j in queue.get_many(ids[start:start + 500])}
            for job_id in ids[start:start + 500]:
                if job_id in found:
                    yield found[job_id]
                elif warn:
                    print(f"{job_id}: not in the queue (not submitted?)", file=sys.stderr)
    else:
        yield from queue.iter_jobs()


def _table(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    if not rows:
        return "no jobs"
    columns = list(rows[0])
    width = {c: min(60, max(len(c), *(len(str(r[c])) for r in rows))) for c in columns}
    lines = ["  ".join(c.ljust(width[c]) for c in columns)]
    lines += ["  ".join(str(r[c])[:60].ljust(width[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    queue = queue_from(config_from(args))
    try:
        # Two passes, so every parameter column is known before the first row, with memory kept flat.
        params = sorted({k for job in _jobs(args, queue, warn=True) for k in job.params})
        rows = (row(job, params, full=args.csv) for job in _jobs(args, queue))
        if args.csv:
            writer = csv.DictWriter(sys.stdout, fieldnames=["id", *params, *CSV_COLUMNS])
            writer.writeheader()
            writer.writerows(rows)
        else:
            print(_table(rows))
    finally:
        queue.close()
    return 0
