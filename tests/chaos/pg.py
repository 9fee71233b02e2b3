"""Two "machines" on one PostgreSQL queue, for the chaos suite (the acceptance row, M1).

Each machine is a :class:`~chaos.harness.ChaosRun` of its own (its own folder, config, ports, ComfyUI
base directory, result store, execution log, fault log and ``comfysup run``), told apart by
``COMFYSUP_HOSTNAME``, as two hosts would be. What differs from one SQLite installation is where the
evidence lives, so this module adds only that, and judges it with the checker's own functions:

- :func:`read_queue`: the jobs and attempts from PostgreSQL, as the same ``_Job`` records the checker
  reads from SQLite, plus each done job's machine (the done record names it).
- :func:`check_machines`: the checker's sequence (submissions, terminals, executions, store) over the
  union of both machines' logs and faults, with the store checked per machine: a done job's files are
  looked for in the store of the machine its done record names, never in the other one.

The checker's files are another engineer's and are not changed here: this composes its parts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from supervisor_support import free_base_port, wait_for

from chaos.checker import (
    Evidence,
    Report,
    _bound_deaths,
    _check_executions,
    _check_secrets,
    _check_store,
    _check_submissions,
    _check_terminals,
    _Job,
    read_executions,
)
from chaos.harness import ChaosRun
from comfysup.config import load_config
from comfysup.queue.base import HOSTNAME_VARIABLE

MACHINES = ("machine-a", "machine-b")
DONE_ELSEWHERE = "done elsewhere"
"""How a job done by another machine looks to one machine's store check: not ``done`` (its files are not
owed here), so complete files of an earlier run here count as orphans, as for any job not done."""


# -- the queue, read from PostgreSQL ----------------------------------------------------------------------


def read_queue(url: str) -> tuple[dict[str, _Job], dict[str, str | None], str]:
    """Jobs and attempts as the checker's ``_Job`` records, each job's machine, and a consistency verdict.

    PostgreSQL has no ``PRAGMA integrity_check``; its place is taken by the invariants the promise leans
    on: no attempt of an unknown job, no running job without an owner and lease, no done job without the
    machine that did it. "ok" when they all hold, as the checker expects.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT id, state, attempt, outputs, machine FROM jobs").fetchall()
        jobs = {r[0]: _Job(r[0], r[1], r[2], json.loads(r[3]) if r[3] else []) for r in rows}
        machine_of = {r[0]: r[4] for r in rows}
        for job_id, started, ended, outcome, reason, owner in conn.execute(
                "SELECT job_id, started_at, ended_at, outcome, reason, owner FROM attempts ORDER BY n"):
            if job_id in jobs:
                jobs[job_id].attempts.append((started, ended, outcome, reason, owner))
        problems = [
            f"{n} {what}" for what, n in (
                ("attempt(s) of unknown jobs", conn.execute(
                    "SELECT count(*) FROM attempts a WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = a.job_id)"
                ).fetchone()[0]),
                ("running job(s) without owner or lease", conn.execute(
                    "SELECT count(*) FROM jobs WHERE state = 'running' AND (owner IS NULL OR lease_until IS NULL)"
                ).fetchone()[0]),
                ("done job(s) naming no machine", conn.execute(
                    "SELECT count(*) FROM jobs WHERE state = 'done' AND machine IS NULL").fetchone()[0]),
            ) if n]
    return jobs, machine_of, "; ".join(problems) or "ok"


# -- the checks ------------------------------------------------------------------------------------------


def check_machines(evidence: Evidence, url: str, stores: dict[str, Path]) -> Report:
    """The checker's verdict on a run of several machines sharing the queue at ``url``.

    ``evidence`` holds every machine's execution logs, faults and supervisor logs together (executions
    are matched to faults across machines: a job cut short by a kill on one machine may run again on the
    other). ``stores`` maps each host name to its result store.
    """
    report = Report()
    report.faults = Counter(f.kind for f in evidence.faults)
    jobs, machine_of, report.integrity = read_queue(url)
    _check_submissions(evidence, jobs, report)
    _check_terminals(evidence, jobs, report)
    executions, posts, servers = read_executions(evidence.exec_logs)
    _bound_deaths(executions, evidence.faults, servers, evidence.ended_at, report)
    _check_executions(executions, posts, jobs, evidence.faults, report)
    check_stores(stores, jobs, machine_of, report)
    if evidence.canaries:  # its queue search is SQLite's; a run with canaries needs a PostgreSQL one first
        raise NotImplementedError("the secret search of a PostgreSQL queue")
    _check_secrets(evidence, None, report)  # type: ignore[arg-type]  (returns before using the connection)
    report.figures["done_by"] = dict(Counter(machine_of[j] for j, job in jobs.items() if job.state == "done"))
    return report


def check_stores(stores: dict[str, Path], jobs: dict[str, _Job], machine_of: dict[str, str | None],
                 report: Report) -> None:
    """Each machine's store checked by the checker's own rules, seeing as ``done`` only the jobs done there.

    A done job naming a machine without a store here is missing its files; a recorded path that is not
    in its machine's store would send ``comfysup results`` readers to the wrong place: missing too.
    """
    for job_id, job in jobs.items():
        host = machine_of.get(job_id)
        if job.state != "done":
            continue
        if host not in stores:
            report.missing_files.append(f"{job_id}: done on {host!r}, a machine without a store in this run")
            continue
        for out in job.outputs:
            expected = (stores[host] / job_id / out["name"]).resolve()
            if out.get("path") and Path(out["path"]).resolve() != expected:
                report.missing_files.append(f"{job_id}: {out['name']} recorded at {out['path']}, not in the "
                                            f"store of {host} ({expected})")
    for host, store in stores.items():
        view = {job_id: job if job.state != "done" or machine_of.get(job_id) == host
                else dataclasses.replace(job, state=DONE_ELSEWHERE) for job_id, job in jobs.items()}
        _check_store(store, view, report)


# -- the machines ----------------------------------------------------------------------------------------


class Machine(ChaosRun):
    """One installation of comfysup acting as the host ``host``, on the PostgreSQL queue at ``url``."""

    def __init__(self, tmp: Path, host: str, seed: int, url: str, *, node_ms: float,
                 runner: dict[str, Any] | None = None, avoid_ports: tuple[int, ...] = ()) -> None:
        super().__init__(tmp, f"M1/{host}", seed, node_ms=node_ms, runner=runner, queue={"url": url})
        self.host = host
        self.url = url
        # Both installations pick their ports at random: two machines would not share a port space, these do.
        while any(abs(self.base_port - p) < 2 for p in avoid_ports):
            self.base_port = free_base_port()
        text = self.config_path.read_text()
        self.config_path.write_text(text.replace(f"base_port = {self.config.comfyui.base_port}",
                                                 f"base_port = {self.base_port}"))
        self.config = load_config(str(self.config_path), env={})
        assert self.config.comfyui.base_port == self.base_port and self.config.queue.url == url

    def start(self, env: dict[str, str] | None = None) -> Any:
        """``comfysup run`` as this host: owners, the machine registry and done records carry its name."""
        return super().start({HOSTNAME_VARIABLE: self.host, **(env or {})})

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The shared queue, read directly (the harness reads SQLite here)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(query.replace("?", "%s"), args).fetchall()

    def held(self) -> list[str]:
        """Jobs that runners of this host hold now."""
        return [r[0] for r in self.sql("SELECT id FROM jobs WHERE state = 'running' AND owner LIKE ?",
                                       (f"{self.host}/%",))]

    def executing(self) -> bool:
        """A slot of this machine is mid-prompt (its server's /queue says so): a kill now cuts a run."""
        return any(self.slot_running(s["job"]) for s in self.slots() if s.get("job"))


def two_machines(tmp: Path, seed: int, url: str, *, jobs: int, node_ms: float = 40.0, kill_at: float = 0.3,
                 lease_seconds: float = 6.0, handover: bool = True) -> Report:
    """M1: two machines share one queue; one supervisor is killed mid-run and started again.

    The kill comes once ``kill_at`` of the jobs are terminal and machine-a is mid-prompt. With
    ``handover``, machine-a stays down until machine-b has claimed every job it held, after their leases
    expired (the lease is the only thing that hands a dead machine's claims on), so the row shows a
    job cut short on one machine and finished on the other; without it, machine-a is started again at
    once and releases its own stale claims.
    """
    runner = {"lease_seconds": lease_seconds}
    a = Machine(tmp / MACHINES[0], MACHINES[0], seed, url, node_ms=node_ms, runner=runner)
    b = Machine(tmp / MACHINES[1], MACHINES[1], seed, url, node_ms=node_ms, runner=runner,
                avoid_ports=(a.base_port,))
    figures: dict[str, Any] = {"machines": 2}
    stuck: list[str] = []
    started = time.monotonic()
    try:
        ids = a.submit(a.jobs_for(jobs))
        procs = {a.host: a.start(), b.host: b.start()}
        for m in (a, b):
            m.wait_ready(procs[m.host], seconds=60)

        def time_to_kill() -> bool:
            for m in (a, b):
                assert procs[m.host].poll() is None, f"{m.host} exited\n{m.describe()}"
            return a.terminal() >= kill_at * jobs and a.executing()

        wait_for(time_to_kill, 60 + jobs * 0.2, "machine-a mid-prompt after a share of the jobs", a.describe)
        children = a.kill_supervisor(procs[a.host])
        try:
            wait_for(a.all_gone, 5, "machine-a's servers and runners to die with its supervisor")
            figures["strays"] = 0
        except AssertionError:
            figures["strays"] = len(a.strays())
            for pid in a.strays():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        # Read after every process of machine-a is gone: a job it finished between a read before the kill
        # and the kill itself is done, and no other machine will (or should) take it on.
        held = a.held()
        figures.update(held_at_kill=len(held), done_at_kill=a.terminal(), killed_pids=len(children) + 1)
        if handover and held:
            def handed_on() -> bool:
                assert procs[b.host].poll() is None, f"machine-b exited\n{b.describe()}"
                taken = b.sql("SELECT count(DISTINCT job_id) FROM attempts WHERE job_id = ANY(?) AND owner LIKE ?",
                              (held, f"{b.host}/%"))[0][0]
                return taken == len(held)

            def why() -> str:
                rows = b.sql("SELECT id, state, owner, lease_until, run_after, "
                             "extract(epoch from clock_timestamp()) FROM jobs WHERE id = ANY(?)", (held,))
                return f"held at the kill: {rows}\n{b.describe()}"

            wait_for(handed_on, lease_seconds * 3 + 30, "machine-a's claims to expire and be taken on", why)
        procs[a.host] = a.start()
        a.wait_ready(procs[a.host], seconds=60)
        for m in (a, b):
            try:
                m.drain(procs[m.host], 120 + jobs * 0.2)
            except AssertionError as exc:  # the checker still runs: it says which jobs never ended
                stuck.append(str(exc).splitlines()[0])
        a.outputs["status"] = a.command("status")[1]  # while both run: every machine heartbeating
        b.outputs["status"] = b.command("status")[1]
        figures["exits"] = {m.host: m.stop(procs[m.host]) for m in (a, b)}
        figures["seconds"] = round(time.monotonic() - started, 1)
        evidence = Evidence(root=tmp, queue_path=a.queue_path, store=a.store, exec_logs=[a.exec_log, b.exec_log],
                            faults=sorted(a.faults.faults() + b.faults.faults(), key=lambda f: f.at),
                            submissions=a.submissions + b.submissions, logs=[a.log_path, b.log_path],
                            not_scanned=[s.path for s in a.submissions], ended_at=time.time())
        report = check_machines(evidence, url, {a.host: a.store, b.host: b.store})
        report.row_failures += stuck
        report.row_failures += [f"SIGTERM: {host} exited {code}, not 0" for host, code in figures["exits"].items()
                                if code != 0]
        if figures["strays"]:
            report.row_failures.append(f"{figures['strays']} process(es) of machine-a outlived its supervisor by 5 s")
        report.row_failures += status_failures(a.outputs["status"], (a.host, b.host))
        figures["taken_over_by_b"] = sum(1 for job_id in held if _done_by(a, job_id) == b.host)
        figures["submitted"] = len(ids)
        report.figures.update(figures, seed=seed)
        return report
    finally:
        a.cleanup()
        b.cleanup()


def _done_by(m: Machine, job_id: str) -> str | None:
    rows = m.sql("SELECT machine FROM jobs WHERE id = ? AND state = 'done'", (job_id,))
    return rows[0][0] if rows else None


def status_failures(text: str, hosts: tuple[str, ...]) -> list[str]:
    """What ``comfysup status`` must show of a cluster: every machine, live, each with its two slots."""
    failures = []
    if f"machines sharing this queue: {len(hosts)}" not in text:
        failures.append(f"status does not count {len(hosts)} machines:\n{text}")
    lines = text.splitlines()
    for host in hosts:
        at = next((i for i, line in enumerate(lines) if line.strip().startswith(f"{host} (supervisor pid")), None)
        if at is None:
            failures.append(f"status does not show {host}")
            continue
        if "STALE" in lines[at]:
            failures.append(f"status shows {host} stale while it runs: {lines[at]}")
        slots = [line.split()[0] for line in lines[at + 1:at + 3] if line.startswith("    ")]
        if slots != ["cpu0", "cpu1"]:
            failures.append(f"status shows slots {slots} under {host}, not cpu0 and cpu1")
    return failures
