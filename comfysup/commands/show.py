"""``comfysup show ID``: one job, its parameters, attempts and reasons — secrets masked."""

from __future__ import annotations

import argparse
import json

from comfysup.commands._common import age, config_from, queue_from, when
from comfysup.errors import UsageError
from comfysup.jobs import JobLineError, canonical_id
from comfysup.queue.base import JobRecord
from comfysup.redact import Redactor, mask


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("show", parents=[common], help="one job: parameters, attempts, reasons, files",
                       description="Show one job: its state, parameters, every attempt with its server, "
                                   "prompt number, outcome and reason, and its files. Secrets are masked.")
    p.add_argument("id", help="the job id")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--workflow", action="store_true", help="also print the workflow (secrets masked)")
    p.set_defaults(func=run)


def as_dict(job: JobRecord, with_workflow: bool) -> dict:
    clean = Redactor.for_job(job.workflow, job.extra_data)
    out = {
        "id": job.id, "state": job.state, "priority": job.priority, "attempt": job.attempt,
        "workflow_name": job.workflow_name, "params": mask(job.params), "meta": job.meta,
        "extra_data": mask(job.extra_data), "submitted_at": job.submitted_at, "finished_at": job.finished_at,
        "server": job.server, "reason": clean(job.reason) if job.reason else None,
        "cancel_requested": job.cancel_requested,
        "outputs": [o.__dict__ for o in job.outputs],
        "attempts": [{**a.__dict__, "reason": clean(a.reason) if a.reason else None} for a in job.attempts],
    }
    if with_workflow:
        out["workflow"] = mask(job.workflow)
    return out


def render(job: JobRecord, with_workflow: bool) -> str:
    d = as_dict(job, with_workflow)
    lines = [f"job {job.id}: {job.state}" + (" (cancel requested)" if job.cancel_requested else ""),
             f"  workflow   {job.workflow_name}   priority {job.priority}   attempts {job.attempt}",
             f"  submitted  {when(job.submitted_at)}"]
    if job.finished_at:
        lines.append(f"  finished   {when(job.finished_at)} ({age(job.finished_at - job.submitted_at)} after submit)")
    if d["params"]:
        lines.append("  set        " + ", ".join(f"{k}={json.dumps(v)}" for k, v in d["params"].items()))
    if d["extra_data"]:
        lines.append("  extra_data " + json.dumps(d["extra_data"]))
    if job.meta:
        lines.append("  meta       " + json.dumps(job.meta))
    if d["reason"]:
        lines.append(f"  reason     {d['reason']}")
    for a in d["attempts"]:
        took = age(a["ended_at"] - a["started_at"]) if a["ended_at"] else "running"
        prompt = f" prompt #{a['prompt_number']}" if a["prompt_number"] is not None else ""
        lines.append(f"  attempt {a['attempt']}  {when(a['started_at'])} on {a['server']}{prompt}: "
                     f"{a['outcome'] or 'running'} ({took})" + (f": {a['reason']}" if a["reason"] else ""))
    for o in job.outputs:
        lines.append(f"  file       {o.path or o.name}  {o.size} bytes  sha256 {o.sha256}")
    if with_workflow:
        lines.append(json.dumps(d["workflow"], indent=2))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        canonical_id(args.id)
    except JobLineError as exc:
        raise UsageError(str(exc)) from exc
    queue = queue_from(config_from(args))
    try:
        job = queue.get(args.id)
    finally:
        queue.close()
    print(json.dumps(as_dict(job, args.workflow), indent=2) if args.json else render(job, args.workflow))
    return 0
