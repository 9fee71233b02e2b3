"""``comfysup show ID``: one job, its parameters, attempts with their timelines, reasons, files and
webhook deliveries — secrets masked."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from comfysup import assets
from comfysup.commands._common import config_from, queue_from
from comfysup.commands.ids import resolve_ids
from comfysup.observability.views import progress_text
from comfysup.queue.base import Delivery, JobRecord
from comfysup.redact import Redactor, bound, display_url, mask
from comfysup.runner.trace import figures, phase_durations
from comfysup.storage.links import Links, no_links
from comfysup.timefmt import age, when

PHASE_NOTES = {"posted": "waiting in ComfyUI's queue", "followed": "following a prompt an earlier attempt left",
               "adopted": "a finished run adopted from /history"}


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("show", parents=[common], help="one job: parameters, attempts, reasons, files",
                       description="Show one job: its state, parameters, every attempt with its server, "
                                   "prompt number, outcome and reason, and its files (for a storing job: the "
                                   "machine and folder where they wait for the bucket). Secrets are masked.")
    p.add_argument("id", help="the job id, or any unique prefix of it (as git takes a commit's)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--workflow", action="store_true", help="also print the workflow (secrets masked)")
    p.set_defaults(func=run)


def as_dict(job: JobRecord, with_workflow: bool, deliveries: list[Delivery] | None = None,
            links: Callable[[str], dict[str, Any]] = no_links) -> dict:
    """``links``: an output in a bucket gets its s3:// ``location`` and a presigned ``url``."""
    clean = Redactor.for_job(job.workflow, job.extra_data)
    out = {
        "id": job.id, "state": job.shown_state, "priority": job.priority, "attempt": job.attempt,
        "workflow_name": job.workflow_name, "params": mask(job.params), "meta": mask(job.meta),
        "extra_data": mask(job.extra_data), "submitted_at": job.submitted_at, "finished_at": job.finished_at,
        "server": job.server, "reason": clean(job.reason) if job.reason else None,
        "cancel_requested": job.cancel_requested,
        "inputs": assets.listing(job.params),
        "outputs": [{**o._asdict(), **links(o.path)} for o in job.outputs],
        "attempts": [{**a._asdict(), "reason": clean(a.reason) if a.reason else None, **_figures(a.trace)}
                     for a in job.attempts],
        "waiting_since": job.waiting_since if job.shown_state == "posted" else None,
        "progress": job.progress if job.state == "running" else None,
        "staged": ({"machine": job.machine, "folder": job.staged_in, "since": job.staged_at}
                   if job.state == "storing" else None),
        "callback_url": display_url(job.callback_url) if job.callback_url else None,
        "deliveries": [{**d._asdict(), "url": display_url(d.url), "state": d.state,
                        "last_error": clean(d.last_error) if d.last_error else None} for d in deliveries or []],
    }
    if with_workflow:
        out["workflow"] = mask(job.workflow)
    return clean.scrub(out)  # by value too: a secret used as a node id, in a file name, in a trace


def _figures(trace: dict[str, Any] | None) -> dict[str, float | None]:
    """An ended attempt's two figures (comfysup.runner.trace.figures): seconds waited in ComfyUI's queue and
    seconds run; None without a trace."""
    wait, run = figures(trace)
    return {"comfyui_wait_seconds": None if run is None else round(wait, 3),
            "run_seconds": None if run is None else round(run, 3)}


def timeline(trace: dict[str, Any]) -> list[str]:
    """An attempt's trace as lines: each phase with its offset and length, each node's time, cached nodes."""
    phases = phase_durations(trace)
    if not phases:
        return []
    start = phases[0][1]
    nodes = [n for n in trace.get("nodes") or [] if isinstance(n, dict)]
    lines = []
    for name, at, seconds in phases:
        took = "" if seconds is None else age(seconds)
        note = f"  ({PHASE_NOTES[name]})" if name in PHASE_NOTES else ""
        offset = f"+{at - start:.3f} s"
        lines.append(f"      {offset:>11}  {name:12} {took:>10}{note}".rstrip())
        if name == "executing":
            lines += [_node_line(n) for n in nodes]
    lines += _reconnect_lines(trace, start)
    lines += _cached_lines(trace)
    return lines


def _node_line(node: dict[str, Any]) -> str:
    took = "running" if node.get("seconds") is None else age(float(node["seconds"]))
    kind = str(node.get("class_type"))[:40]
    return f"      {'':11}  node {node.get('id')!s:>4} {kind:40} {took:>10}"


def _reconnect_lines(trace: dict[str, Any], start: float) -> list[str]:
    """Each dropped WebSocket of the trace (``[at, same client id]``), with its offset."""
    lines = []
    for drop in trace.get("reconnects") or []:
        if isinstance(drop, list) and len(drop) == 2 and isinstance(drop[0], int | float):
            how = "reconnected with the same client id" if drop[1] else "not reconnected at once; tried again"
            lines.append(f"      {f'+{drop[0] - start:.3f} s':>11}  WebSocket dropped: {how}")
    return lines


def _cached_lines(trace: dict[str, Any]) -> list[str]:
    cached = [str(c) for c in trace.get("cached") or []]
    if not cached:
        return []
    total = trace.get("total_nodes") or "?"
    return [f"      {'':11}  cached: {len(cached)} of {total} node(s) from ComfyUI's cache "
            f"({', '.join(cached[:20])}{' …' if len(cached) > 20 else ''})"]


def delivery_line(d: dict[str, Any], now: float) -> str:
    tries = f"{d['attempts']} tr{'y' if d['attempts'] == 1 else 'ies'}"
    last = ""
    if d["last_status"] or d["last_error"]:
        last = f", last: {d['last_error'] or 'HTTP ' + str(d['last_status'])}"
    if d["state"] == "delivered":
        return f"  webhook    {d['url']} delivered {when(d['delivered_at'])} (HTTP {d['last_status']}, {tries})"
    if d["state"] == "pending":
        due = max(0.0, (d["next_at"] or now) - now)
        return f"  webhook    {d['url']} pending, {tries}, next try in {age(due)}{last}"
    return f"  webhook    {d['url']} given up after {tries}{last}"


def render(job: JobRecord, with_workflow: bool, deliveries: list[Delivery] | None = None,
           links: Callable[[str], dict[str, Any]] = no_links) -> str:
    d = as_dict(job, with_workflow, deliveries, links)
    lines = _heading(job) + _details(d)
    for a in d["attempts"]:
        lines.append(_attempt_line(a))
        lines += timeline(a.get("trace") or {})
    for o in d["outputs"]:
        lines.append(f"  file       {o['path'] or o['name']}  {o['size']} bytes  sha256 {o['sha256']}")
        if o.get("url"):
            lines.append(f"    url      {o['url']}  (valid until {when(o['url_expires_at'])})")
    now = time.time()
    lines += [delivery_line(x, now) for x in d["deliveries"]]
    if with_workflow:
        lines.append(json.dumps(d["workflow"], indent=2))
    return "\n".join(lines)


def _heading(job: JobRecord) -> list[str]:
    """The job's state (and where it waits when posted), workflow, and when it was submitted and finished."""
    posted = (f" (waiting in {job.server}'s queue behind the prompt that runs there since {when(job.waiting_since)})"
              if job.shown_state == "posted" and job.waiting_since is not None else "")
    lines = [f"job {job.id}: {job.shown_state}{posted}" + (" (cancel requested)" if job.cancel_requested else ""),
             f"  workflow   {job.workflow_name}   priority {job.priority}   attempts {job.attempt}",
             f"  submitted  {when(job.submitted_at)}"]
    if job.finished_at:
        lines.append(f"  finished   {when(job.finished_at)} ({age(job.finished_at - job.submitted_at)} after submit)")
    if job.state == "storing":
        lines.append(f"  staged     on {job.machine} in {job.staged_in} since {when(job.staged_at)}: its uploader "
                     "sends them when the bucket answers (machine gone for good: `comfysup retry` runs it again)")
    return lines


def _details(d: dict[str, Any]) -> list[str]:
    """The shown job's parameters, input files, extra_data, meta, reason and progress: each only when it has one."""
    lines = []
    if d["params"]:
        lines.append("  set        " + ", ".join(
            f"{k}={assets.short(v) if assets.is_reference(v) else json.dumps(v)}" for k, v in d["params"].items()))
    for i in d["inputs"]:
        lines.append(f"  input      {i['input']}  {i['name']}  {i['hash']}" + (f"  {i['size']:,} bytes"
                                                                               if i["size"] else ""))
    if d["extra_data"]:
        lines.append("  extra_data " + json.dumps(d["extra_data"]))
    if d["meta"]:
        lines.append("  meta       " + json.dumps(d["meta"]))
    if d["reason"]:
        lines.append(f"  reason     {d['reason']}")
    if d["progress"]:
        lines.append(f"  progress   {bound(progress_text(d['progress']), 200)}")
    return lines


def _attempt_line(a: dict[str, Any]) -> str:
    """One attempt: when, where, its prompt number, outcome (and kind), how long, and its reason."""
    took = age(a["ended_at"] - a["started_at"]) if a["ended_at"] else "running"
    if a["ended_at"] and a["run_seconds"] is not None:
        took += f": waited {age(a['comfyui_wait_seconds'])} in ComfyUI's queue, ran {age(a['run_seconds'])}"
    prompt = f" prompt #{a['prompt_number']}" if a["prompt_number"] is not None else ""
    kind = f" [{a['kind']}]" if a.get("kind") and a["kind"] != a["outcome"] else ""
    return (f"  attempt {a['attempt']}  {when(a['started_at'])} on {a['server']}{prompt}: "
            f"{a['outcome'] or 'running'}{kind} ({took})" + (f": {a['reason']}" if a["reason"] else ""))


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    queue = queue_from(config)
    try:
        (job_id,) = resolve_ids(queue, [args.id])  # the whole id, or any unique prefix of it
        job = queue.reads.get(job_id)
        deliveries = queue.deliveries.deliveries(job_id)
    finally:
        queue.close()
    links = Links(config.store)
    print(json.dumps(as_dict(job, args.workflow, deliveries, links), indent=2) if args.json
          else render(job, args.workflow, deliveries, links))
    return 0
