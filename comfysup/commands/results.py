"""``comfysup results``: one row per job — parameters as columns, status, files, reasons, times."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from comfysup import assets
from comfysup.commands._common import config_from, queue_from
from comfysup.errors import UsageError
from comfysup.queue.base import JobRecord
from comfysup.redact import Redactor, mask
from comfysup.runner.trace import figures
from comfysup.storage import s3
from comfysup.storage.links import Links, no_links
from comfysup.timefmt import iso_utc


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("results", parents=[common], help="one row per job: parameters, status, files, times",
                       description="Print one row per job: its id, its `set` parameters as columns, status, "
                                   "server, the machine that did it, attempts, files (name:sha256 prefix), "
                                   "reason, time waited in the queue, per attempt the time it waited in ComfyUI's "
                                   "queue behind the prompt ahead of it and the time it ran, and in all. With a "
                                   "jobs file, every line of it in its order, with status 'not submitted' for an "
                                   "id that is not in the queue. --csv adds where each file is, as "
                                   "host:path for a store on each machine's own disk, or s3://bucket/key with a "
                                   "presigned URL for a store in a bucket ([store] url).")
    p.add_argument("file", nargs="?", help="a jobs.jsonl file: show only its lines' jobs")
    p.add_argument("--csv", action="store_true", help="CSV on standard output: parameters as plain values "
                   "(strings unquoted, numbers as numbers, objects and lists as JSON), full hashes and file paths, "
                   "a locations column of host:path or s3://bucket/key, and for outputs in a bucket a urls column "
                   "of presigned URLs valid until url_expires_at (UTC, [store] url_ttl_seconds)")
    p.set_defaults(func=run)


def _lines_of(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each line's id and its ``set`` (shown for a line that was never submitted), in the file's order."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
                job_id = str(line["id"])
            except (ValueError, KeyError, TypeError) as exc:
                raise UsageError(f"{path}:{number}: no readable id ({exc})") from exc
            params = line.get("set")
            lines.append((job_id, params if isinstance(params, dict) else {}))
    return lines


def _ids_of(path: Path) -> list[str]:
    return [job_id for job_id, _ in _lines_of(path)]


NOT_SUBMITTED = "not submitted"
"""The status of a line of the jobs file whose id is not in the queue."""

TABLE_CELL_CHARS = 60

RESULT_COLUMNS = ("status", "server", "machine", "attempts", "files", "reason", "queue_wait_s", "comfyui_wait_s",
                  "attempt_run_s", "total_s")
CSV_COLUMNS = (*RESULT_COLUMNS, "tenant", "locations", "urls", "url_expires_at")
"""``tenant``: who the job belongs to (comfysup.queue.tenants); ``locations``: each file as host:path, since
store.dir may be each machine's own disk, or as the s3://bucket/key of its object ([store] url); ``urls``: each
object's presigned URL, valid until ``url_expires_at``."""


def cell(value: Any) -> str:
    """A parameter as a spreadsheet reads it: a string as it is, a number as a number, true/false/null as
    JSON writes them, and only an object or a list as JSON, so a join on a column needs no unquoting."""
    if isinstance(value, str):
        return value
    if assets.is_reference(value):  # an input file: its name and hash, not the reference's JSON
        return assets.short(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(value)


def cut(text: str, limit: int = TABLE_CELL_CHARS) -> str:
    """``text`` in at most ``limit`` characters, cut at a word boundary with an ellipsis (a word longer than
    the cell is cut inside)."""
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    space = head.rfind(" ")
    if space >= limit // 2:
        head = head[:space]
    return head.rstrip(" ,;:") + "…"


def not_submitted_row(job_id: str, params: dict[str, Any], columns: list[str], full: bool) -> dict[str, Any]:
    """The row of a line of the file that is not in the queue: its id and ``set``, status ``not submitted``."""
    shown = mask(params)
    out: dict[str, Any] = {"id": job_id}
    out.update({p: cell(shown[p]) if p in shown else "" for p in columns})
    out.update(dict.fromkeys(CSV_COLUMNS if full else RESULT_COLUMNS, ""))
    out["status"] = NOT_SUBMITTED
    return out


def row(job: JobRecord, params: list[str], full: bool,
        links: Callable[[str], dict[str, Any]] = no_links) -> dict[str, Any]:
    clean = Redactor.for_job(job.workflow, job.extra_data)
    shown = mask(job.params)
    out: dict[str, Any] = {"id": job.id}
    out.update({p: cell(shown[p]) if p in shown else "" for p in params})
    out.update({
        "status": job.shown_state,
        "server": job.server or (job.attempts[-1].server if job.attempts else ""),
        "machine": job.machine or "",
        "attempts": job.attempt,
        "files": " ".join(_file_cells(job, full)),
        "reason": clean(job.reason, 2000 if full else 120) if job.reason else "",
    })
    out.update(_timing_cells(job))
    if full:
        out["tenant"] = job.tenant
        out.update(_location_cells(job, links))
    return clean.scrub(out)  # by value too: a secret in a file name or a set value's key


def _file_cells(job: JobRecord, full: bool) -> list[str]:
    """Each output as name:hash (short), or with ``full`` as path:hash (whole)."""
    if full:
        return [f"{o.path}:{o.sha256}" for o in job.outputs]
    return [f"{o.name}:{o.sha256[:12]}" for o in job.outputs]


def _timing_cells(job: JobRecord) -> dict[str, str]:
    """The columns of how long the job waited and ran, in seconds; empty where it has not got that far."""
    first_start = job.attempts[0].started_at if job.attempts else None
    ended = [(a, figures(a.trace)) for a in job.attempts if a.ended_at is not None]
    # Per ended attempt: its wait in ComfyUI's queue (behind the prompt ahead of it), and the rest of it, its run;
    # an attempt without a trace (its runner died) ran from its claim to its end, as far as anyone knows.
    waits = [wait for _, (wait, _run) in ended]
    runs = [run if run is not None else a.ended_at - a.started_at for a, (_wait, run) in ended]
    return {
        "queue_wait_s": f"{first_start - job.submitted_at:.3f}" if first_start else "",
        "comfyui_wait_s": ";".join(f"{w:.3f}" for w in waits),
        "attempt_run_s": ";".join(f"{r:.3f}" for r in runs),
        "total_s": f"{job.finished_at - job.submitted_at:.3f}" if job.finished_at else "",
    }


def _location_cells(job: JobRecord, links: Callable[[str], dict[str, Any]]) -> dict[str, str]:
    """The CSV's columns of where each output lies: host:path or s3:// location, and presigned URLs."""
    locations = " ".join(o.path if s3.split_uri(o.path) else f"{job.machine or ''}:{o.path or o.name}"
                         for o in job.outputs)
    shown = [link for link in (links(o.path) for o in job.outputs) if "url" in link]
    return {"locations": locations, "urls": " ".join(link["url"] for link in shown),
            "url_expires_at": min((iso_utc(link["url_expires_at"]) for link in shown), default="")}


Line = tuple[str, dict[str, Any]]


def _jobs(queue: Any, lines: list[Line] | None) -> Iterator[JobRecord | Line]:
    """Every job of the queue; with a file's lines, each line's job in the file's order, or the line itself
    when its id is not in the queue."""
    if lines is None:
        yield from queue.reads.iter_jobs()
        return
    for start in range(0, len(lines), 500):
        chunk = lines[start:start + 500]
        found = {j.id: j for j in queue.reads.get_many([job_id for job_id, _ in chunk])}
        for line in chunk:
            yield found.get(line[0], line)


def _params_of(item: JobRecord | Line) -> dict[str, Any]:
    return item.params if isinstance(item, JobRecord) else item[1]


def _row(item: JobRecord | Line, params: list[str], full: bool,
         links: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    if not isinstance(item, JobRecord):
        return not_submitted_row(item[0], item[1], params, full)
    return row(item, params, full, links)


def _table(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    if not rows:
        return "no jobs"
    columns = list(rows[0])
    width = {c: min(TABLE_CELL_CHARS, max(len(c), *(len(str(r[c])) for r in rows))) for c in columns}
    lines = ["  ".join(c.ljust(width[c]) for c in columns)]
    lines += ["  ".join(cut(str(r[c])).ljust(width[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    queue = queue_from(config)
    links = Links(config.store)
    try:
        lines = _lines_of(Path(args.file)) if args.file else None
        # Two passes, so every parameter column is known before the first row, with memory kept flat.
        missing = 0
        keys: set[str] = set()
        for item in _jobs(queue, lines):
            keys.update(_params_of(item))
            missing += not isinstance(item, JobRecord)
        if missing:
            print(f"{args.file}: {missing} line(s) not in the queue, listed as {NOT_SUBMITTED!r} "
                  f"(comfysup submit {args.file})", file=sys.stderr)
        params = sorted(keys)
        rows = (_row(item, params, args.csv, links) for item in _jobs(queue, lines))
        if args.csv:
            writer = csv.DictWriter(sys.stdout, fieldnames=["id", *params, *CSV_COLUMNS])
            writer.writeheader()
            writer.writerows(rows)
        else:
            print(_table(rows))
    finally:
        queue.close()
    return 0
