"""``comfysup status``: where every job is, at a glance; ``--json`` for scripts; ``--watch`` to keep looking."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from comfysup.commands._common import config_from, queue_from
from comfysup.config import Config
from comfysup.observability.brokerview import broker_text
from comfysup.observability.views import (
    POSTED_TEXT,
    WINDOW_SECONDS,
    Overview,
    outboxes_text,
    overview,
    progress_text,
    several_tenants,
    staging_text,
    tenant_lines,
)
from comfysup.queue.base import Machine, Status
from comfysup.queue.values import TenantCount
from comfysup.redact import bound
from comfysup.slotstate import memory_note, read_broker_state, read_state, read_work_state, staleness, warmup_cell
from comfysup.timefmt import age


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("status", parents=[common], help="counts by state, running jobs, last dead letters",
                       description="Show how many jobs are queued, waiting to retry, posted (claimed ahead and "
                                   "waiting in their server's queue behind the prompt that runs there), running "
                                   "(executing, or its files being downloaded), storing (its outputs staged on its "
                                   "machine, waiting for the bucket), done, dead and cancelled; what each outbox "
                                   "holds (uploads, webhooks, broker results) and its oldest's age; the oldest "
                                   "queued job's age; each running and posted job; and the last dead letters with "
                                   "their reasons.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--dead", type=int, default=5, metavar="N", help="how many dead letters to list (default 5)")
    p.add_argument("--by", choices=("tenant",), help="tenant: each tenant's jobs queued, running and done, and the "
                   "GPU seconds its jobs held a slot with its share of them (the fair share the claim keeps)")
    p.add_argument("--watch", nargs="?", const=2.0, type=float, metavar="SECONDS",
                   help="refresh in place every SECONDS (default 2): slots, running jobs with their progress, "
                        "counts, jobs per minute, the last dead letters; Ctrl-C stops")
    p.set_defaults(func=run)


def snapshot(status: Status, now: float) -> dict[str, Any]:
    """``running``: the jobs that execute (at most one a server); ``posted``: those that wait in their server's
    queue behind them, with how long (the counts say the same)."""
    return {
        "counts": status.counts,
        "oldest_queued_age_seconds": None if status.oldest_queued_at is None else now - status.oldest_queued_at,
        "running": [{"id": r.id, "server": r.server, "owner": r.owner, "attempt": r.attempt,
                     "elapsed_seconds": now - r.started_at, "lease_left_seconds": r.lease_until - now,
                     "progress": r.progress} for r in status.running if not r.posted],
        "posted": [{"id": r.id, "server": r.server, "owner": r.owner, "attempt": r.attempt,
                    "waiting_seconds": now - (r.waiting_since or now), "lease_left_seconds": r.lease_until - now}
                   for r in status.running if r.posted],
        "recent_dead": [{"id": i, "finished_at": t, "reason": reason} for i, t, reason in status.recent_dead],
    }


def counts_line(c: dict[str, int]) -> str:
    """The counts in one line: posted (waiting in a server's queue) apart from running (executing)."""
    return (f"queued {c['queued']} · waiting to retry {c['waiting']} · posted {c.get('posted', 0)} · "
            f"running {c['running']} · storing {c.get('storing', 0)} · done {c['done']} · dead {c['dead']} · "
            f"cancelled {c['cancelled']}")


def render(status: Status, now: float) -> str:
    c = status.counts
    lines = [counts_line(c)]
    if status.oldest_queued_at is not None:
        lines.append(f"oldest queued job: {age(now - status.oldest_queued_at)} old")
    running = [r for r in status.running if not r.posted]
    posted = [r for r in status.running if r.posted]
    if running:
        lines.append("")
        lines.append(f"{'running job':36}  {'server':10} {'attempt':>7}  {'elapsed':>10}  progress")
        lines += [f"{r.id:36}  {r.server:10} {r.attempt:>7}  {age(now - r.started_at):>10}  "
                  f"{bound(progress_text(r.progress), 80)}" for r in running]
    if posted:
        lines.append("")
        lines.append(f"{'posted job':36}  {'server':10} {'attempt':>7}  {'waiting':>10}")
        lines += [f"{r.id:36}  {r.server:10} {r.attempt:>7}  {age(now - (r.waiting_since or now)):>10}  "
                  f"{POSTED_TEXT}" for r in posted]
    if status.recent_dead:
        lines.append("")
        lines.append("last dead letters:")
        lines += [f"  {i}  {age(now - t)} ago: {bound(reason or '', 300)}" for i, t, reason in status.recent_dead]
    return "\n".join(lines)


MACHINE_STALE_SECONDS = 20.0
"""A supervisor heartbeats every 5 s; after this long without one it has stopped, hangs, or cannot reach the
database, and its slots are shown as last known, not as running."""


def stopped(m: Machine) -> bool:
    """The supervisor's last beat was its clean stop's (every slot stopped): not stale, stopped."""
    slots = [s for s in m.slots if isinstance(s, dict)]
    return bool(slots) and all(s.get("state") == "stopped" for s in slots)


def machines_snapshot(machines: list[Machine]) -> list[dict[str, Any]]:
    return [{"host": m.host, "pid": m.pid, "started_at": m.started_at, "heartbeat_at": m.heartbeat_at,
             "heartbeat_age_seconds": m.age_seconds, "stopped": stopped(m),
             "stale": m.age_seconds > MACHINE_STALE_SECONDS and not stopped(m), "slots": m.slots} for m in machines]


def render_machines(machines: list[Machine]) -> str:
    """Every supervisor sharing the queue, each slot on a line: one status for a cluster."""
    lines = [f"machines sharing this queue: {len(machines)}"]
    for m in machines:
        heard = f"heartbeat {age(m.age_seconds)} ago"
        mark = (f"  STALE: no heartbeat for {age(m.age_seconds)} (stopped, hung, or cannot reach the database)"
                if m.age_seconds > MACHINE_STALE_SECONDS else "")
        if stopped(m):
            heard, mark = f"stopped {age(m.age_seconds)} ago", ""
        lines.append(f"  {m.host} (supervisor pid {m.pid}, {heard}){mark}")
        for slot in m.slots:
            if not isinstance(slot, dict):
                continue
            lines.append(f"    {_cell(slot.get('name')):10} {_cell(slot.get('device')):9} "
                         f"{_cell(slot.get('state')):9} {_cell(slot.get('job')):36}  "
                         f"{bound(slot.get('reason') or slot.get('runner_reason') or '', 200)}".rstrip())
    return "\n".join(lines)


def render_slots(state: dict[str, Any] | None, now: float) -> str:
    """One row per slot of the supervisor: server state, pid, port, restarts, runner pid, current job."""
    if state is None:
        return "supervisor: no state file (comfysup run has not run with this queue)"
    stale = staleness(state, now)
    head = (f"supervisor pid {state.get('pid')}: {state.get('summary', '')}" if stale is None
            else f"supervisor not running ({stale}); last known slots:")
    if state.get("state") == "stopped":
        at = float(state.get("updated_at") or now)
        head = (f"supervisor stopped {age(now - at)} ago ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))}, "
                f"pid {state.get('pid')}); queued jobs wait for `comfysup run`")
    lines = [head, f"{'slot':10} {'device':9} {'server':9} {'pid':>7} {'port':>5} {'restarts':>8} "
                   f"{'runner':>7}  {'comfyui':8}  {'warm-up':9}  {'job':36}  reason"]
    for slot in state["slots"]:
        lines.append(f"{_cell(slot.get('name')):10} {_cell(slot.get('device')):9} {_cell(slot.get('state')):9} "
                     f"{_cell(slot.get('pid')):>7} {_cell(slot.get('port')):>5} {_cell(slot.get('restarts')):>8} "
                     f"{_cell(slot.get('runner_pid')):>7}  {_cell(slot.get('comfyui_version'))[:8]:8}  "
                     f"{warmup_cell(slot):9}  {_cell(slot.get('job')):36}  {bound(_why(slot), 200)}".rstrip())
    return "\n".join(lines)


def _why(slot: dict[str, Any]) -> str:
    """Why a slot takes no job (out of service: a stuck prompt, a server whose answers cannot be read), or why its
    server or runner last stopped."""
    why = str(slot.get("out_of_service") or slot.get("reason") or slot.get("runner_reason") or "")
    memory = memory_note(slot)
    return f"{why}; {memory}" if why and memory else why or memory


def render_work(state: dict[str, Any] | None, now: float) -> str | None:
    """``comfysup work``'s servers, when it runs on this queue folder: each in service or not, and why."""
    if state is None or staleness(state, now) is not None:
        return None
    lines = [f"comfysup work pid {state.get('pid')}: {state.get('summary', '')}"]
    for slot in state["slots"]:
        if isinstance(slot, dict):
            lines.append(f"  {_cell(slot.get('name')):10} {_cell(slot.get('state')):15} {_cell(slot.get('url')):28} "
                         f"{bound(slot.get('reason') or '', 200)}".rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def render_watch(view: Overview, interval: float) -> str:
    """One frame of ``status --watch``: the same sections as the status page."""
    f = view.finished
    head = (f"comfysup status at {time.strftime('%H:%M:%S', time.localtime(view.now))} (every {interval:g} s; "
            "Ctrl-C stops)")
    rate = (f"last {WINDOW_SECONDS / 60:.0f} min: {f.get('done', 0)} done ({view.per_minute:.1f} jobs/min), "
            f"{f.get('dead', 0)} dead, {f.get('cancelled', 0)} cancelled")
    tenants = ["", *tenant_lines(view.tenants)] if several_tenants(view.tenants) else []
    return "\n".join([head, "", render(view.status, view.now), rate, outboxes_text(view.outboxes), *tenants, "",
                      render_slots(view.supervisor, view.now)])


CLEAR_HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
FRAME_SEPARATOR = "\f\n"
"""Between frames when the output is not a terminal (a pipe, a file): a form feed, so frames can be split."""


def watch(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Redraw in place until Ctrl-C, which ends it with exit 0 (stopping to watch is not an error)."""
    interval = max(0.1, float(args.watch))
    config = config_from(args)
    queue = queue_from(config)
    tty = out.isatty()
    try:
        while True:
            frame = render_watch(overview(queue, read_state(config), dead=args.dead), interval)
            if tty:
                out.write(CLEAR_HOME + frame.replace("\n", CLEAR_LINE + "\n") + CLEAR_LINE + "\n" + CLEAR_BELOW)
            else:
                out.write(frame + "\n" + FRAME_SEPARATOR)
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
        return 0
    finally:
        queue.close()


def render_inputs(inputs: dict[str, int]) -> str:
    """The asset store in one line: input files stored once per content, their bytes, uploads to servers."""
    return (f"inputs: {inputs['assets']:,} file(s) stored, {inputs['bytes']:,} bytes, {inputs['uploads']:,} "
            "upload(s) to servers")


def run(args: argparse.Namespace) -> int:
    if args.watch is not None:
        return watch(args)
    config = config_from(args)
    queue = queue_from(config)
    try:
        now = time.time()
        read = Read(status=queue.reads.status(now, dead_limit=args.dead), machines=queue.fleet.machines(),
                    inputs=queue.assets.asset_totals(), backlog=queue.deliveries.announcement_backlog(),
                    outboxes=queue.deliveries.outboxes(now), tenants=queue.reads.tenant_counts())
        read.waiting = queue.uploads.by_machine(now) if read.outboxes["uploads"].items else {}
    finally:
        queue.close()
    if args.by == "tenant":
        print(json.dumps([t._asdict() for t in read.tenants], indent=2) if args.json
              else "\n".join(tenant_lines(read.tenants)))
    elif args.json:
        print(json.dumps(json_report(config, read, now), indent=2))
    else:
        print(text_report(config, read, now))
    return 0


class Read:
    """What one ``comfysup status`` read of the queue found (the supervisor's and work's files are read apart)."""

    def __init__(self, status: Status, machines: list[Machine], inputs: dict[str, Any], backlog: Any,
                 outboxes: dict[str, Any], tenants: list[TenantCount]) -> None:
        self.status = status
        self.machines = machines
        self.inputs = inputs
        self.backlog = backlog
        self.outboxes = outboxes
        self.tenants = tenants
        self.waiting: dict[str, Any] = {}


def json_report(config: Config, read: Read, now: float) -> dict[str, Any]:
    """``status --json``: the queue's counts, the supervisor's and work's states, machines, inputs, outboxes and
    tenants."""
    state, work = read_state(config), read_work_state(config)
    out = snapshot(read.status, now)
    out["supervisor"] = None if state is None else {**state, "stale": staleness(state, now)}
    out["work"] = None if work is None else {**work, "stale": staleness(work, now)}
    out["machines"] = machines_snapshot(read.machines)
    out["inputs"] = read.inputs
    out["outboxes"] = {name: level._asdict() for name, level in read.outboxes.items()}
    out["outboxes"]["uploads_by_machine"] = {m: level._asdict() for m, level in read.waiting.items()}
    out["tenants"] = [t._asdict() for t in read.tenants]
    if config.rabbitmq.url:
        out["rabbitmq"] = {"consumer": read_broker_state(config), "outbox_backlog": read.backlog}
    return out


def text_report(config: Config, read: Read, now: float) -> str:
    """``status`` for a person: counts, inputs, outboxes, staging, tenants (when there are several), slots, work,
    machines and the broker."""
    state, work = read_state(config), read_work_state(config)
    lines = [render(read.status, now)]
    if read.inputs["assets"]:
        lines.append(render_inputs(read.inputs))
    lines.append(outboxes_text(read.outboxes))
    for machine, level in read.waiting.items():
        oldest = age(level.oldest_age_seconds or 0)
        lines.append(f"  uploads waiting on {machine}: {level.items} job(s), oldest {oldest} "
                     f"(its uploader sends them; machine gone for good: `comfysup show ID`, `comfysup retry ID`)")
    lines.extend(filter(None, (staging_text(state), staging_text(work))))
    if several_tenants(read.tenants):
        lines += ["", *tenant_lines(read.tenants)]
    lines += ["", render_slots(state, now)]
    work_text = render_work(work, now)
    if work_text:
        lines += ["", work_text]
    if read.machines:
        lines += ["", render_machines(read.machines)]
    if config.rabbitmq.url:
        lines += ["", broker_text(read_broker_state(config), read.backlog)]
    return "\n".join(lines)
