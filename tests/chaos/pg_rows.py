"""Row G1: the queue's PostgreSQL (a server of the row's own) killed or stopped at random moments while prompts
run, and started again after an outage shorter, or longer, than a lease.

The promise: nothing lost, no job executed twice at once, and a prompt interrupted only by an outage longer than a
lease. An attempt whose renewals fail follows its prompt on until its lease's end comes within its reserve
(comfysup.runner.hold: a heartbeat and twice the runner's longest database wait), so an outage that leaves the last
renewal's lease more than that, and the next try a second, interrupts nothing. Each outage is recorded as a
``db_down`` fault with whether it was long enough to interrupt (``past_lease``): the checker matches a run
interrupted by one (and the job's next run) to it, and an interruption in a shorter outage stays unmatched, a
failure. This module counts every interrupted execution and matches each to an outage of at least a lease.
A ``comfysup submit`` tried in an outage must exit non-zero, say the queue is unavailable, and store nothing
(the checker holds a rejected file to that).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pg_server import OwnPostgres
from supervisor_support import wait_for

from chaos.checker import Evidence, Report, Submission, read_executions
from chaos.faults import scenario_rng
from chaos.pg import Machine, check_machines
from comfysup.runner.hold import RETRY_SECONDS, reserve_seconds

HOST = "machine-g1"
LEASE_SECONDS = 6.0
HEARTBEAT_SECONDS = 0.3
INTERRUPT_SLACK_SECONDS = 1.0
"""An interrupt caused by an outage lands before the server is back; this covers the wake-up that saw it."""


def quiet_limit() -> float:
    """The longest outage that may not interrupt a prompt: the lease, less the attempt's reserve, the heartbeat
    that may have passed since its last renewal, and the retry after the server is back."""
    wait = HEARTBEAT_SECONDS  # a runner's longest database wait: the heartbeat, under [queue] busy_timeout_seconds
    return LEASE_SECONDS - reserve_seconds(HEARTBEAT_SECONDS, wait) - HEARTBEAT_SECONDS - RETRY_SECONDS


def g1_postgres_outages(tmp: Path, seed: int, *, jobs: int, outages: int, node_ms: float = 300.0) -> Report:
    """G1 with a PostgreSQL of its own (initdb in a temporary folder, its own port)."""
    server = OwnPostgres()
    server.start()
    try:
        return _outages(tmp / "run", seed, server, jobs=jobs, outages=outages, node_ms=node_ms)
    finally:
        server.close()


def _outages(tmp: Path, seed: int, server: OwnPostgres, *, jobs: int, outages: int, node_ms: float) -> Report:
    runner = {"lease_seconds": LEASE_SECONDS, "heartbeat_seconds": HEARTBEAT_SECONDS}
    m = Machine(tmp, HOST, seed, server.url, node_ms=node_ms, runner=runner)
    m.rng = scenario_rng(seed, "G1")
    started = time.monotonic()
    figures: dict[str, Any] = {"outages_short": 0, "outages_long": 0, "kills": 0, "stops": 0, "submits_refused": 0}
    stuck: list[str] = []
    slow: dict[str, list[str]] = {}
    try:
        _submit(m, jobs, slow)
        proc = m.start()
        m.wait_ready(proc, seconds=60)
        for n in range(outages):
            if m.active() < 6:
                _submit(m, max(4, jobs // max(outages, 1)), slow)
            long = n % 2 == 1 or m.rng.random() < 0.2

            def in_flight(long: bool = long) -> bool:
                """Any prompt for a short outage; a slow one (longer than the lease) for a long one."""
                assert proc.poll() is None, f"the supervisor exited\n{m.describe()}"
                return any(s.get("job") and (not long or s["job"] in slow) and m.slot_running(s["job"])
                           for s in m.slots())

            wait_for(in_flight, 120, "a prompt in flight", m.describe)
            _outage(m, server, long, figures)
            time.sleep(m.rng.uniform(0.3, 1.5))  # the gap between two outages
        try:
            m.drain(proc, 120 + jobs * 0.5)
        except AssertionError as exc:  # the checker still runs: it says which jobs never ended
            stuck.append(str(exc).splitlines()[0])
        m.outputs["status"] = m.command("status")[1]
        slots = (m.state() or {}).get("slots", [])
        figures["restarts"] = sum(s.get("runner_restarts", 0) + s.get("restarts", 0) for s in slots)
        figures["exit"] = m.stop(proc)
        figures["seconds"] = round(time.monotonic() - started, 1)
        evidence = Evidence(root=tmp, queue_path=m.queue_path, store=m.store, exec_logs=[m.exec_log],
                            faults=m.faults.faults(), submissions=m.submissions, logs=[m.log_path],
                            not_scanned=[s.path for s in m.submissions], ended_at=time.time())
        report = check_machines(evidence, server.url, {HOST: m.store})
        report.row_failures += stuck
        if figures["restarts"]:  # a runner or server that crashed on the database's absence, or was killed as silent
            report.row_failures.append(f"{figures['restarts']} runner or server restart(s) during the outages")
        if figures["exit"] != 0:
            report.row_failures.append(f"SIGTERM: the supervisor exited {figures['exit']}, not 0")
        figures.update(interruptions(evidence))
        report.row_failures += figures.pop("early")
        report.figures.update(figures, seed=seed, lease_seconds=LEASE_SECONDS, quiet_limit=round(quiet_limit(), 2))
        return report
    finally:
        m.cleanup()


def _submit(m: Machine, count: int, slow: dict[str, list[str]]) -> None:
    """``count`` jobs, a quarter of them slow on their first post (ten times node_ms: longer than a lease), so a
    long outage finds a prompt it must interrupt; a job posted again runs at the normal pace."""
    jobs = m.jobs_for(count)
    slow.update({j["id"]: ["slow"] for j in jobs[::4]})
    m.set_script(slow)
    m.submit(jobs)


def _outage(m: Machine, server: OwnPostgres, long: bool, figures: dict[str, Any]) -> None:
    """One outage: the server killed (a crash) or stopped (a restart), down for a drawn time, started again."""
    seconds = (m.rng.uniform(LEASE_SECONDS + 0.5, LEASE_SECONDS + 2.5) if long
               else m.rng.uniform(0.2, quiet_limit() - 1.5))  # a margin for a loaded machine's late wake-ups
    how = m.rng.choice(("kill", "stop"))
    start = time.time()
    server.kill() if how == "kill" else server.stop()
    if m.rng.random() < 0.5:
        _submit_while_down(m, figures)
    time.sleep(max(0.0, start + seconds - time.time()))  # the fault itself: the server is down this long
    server.start()
    end = time.time()
    m.faults.record("db_down", at=start, until=end, how=how, past_lease=end - start >= quiet_limit())
    figures["outages_long" if long else "outages_short"] += 1
    figures["kills" if how == "kill" else "stops"] += 1


def _submit_while_down(m: Machine, figures: dict[str, Any]) -> None:
    """``comfysup submit`` while the server is down: a clear refusal, nothing stored (the checker sees to that)."""
    jobs = m.jobs_for(2)
    path = m.write_jobs(jobs)
    code, said = m.command("submit", str(path))
    m.submissions.append(Submission(path, tuple(j["id"] for j in jobs), "accepted" if code == 0 else "rejected"))
    assert code != 0 and "the queue is unavailable" in said and "Traceback" not in said, said
    figures["submits_refused"] += 1


def interruptions(evidence: Evidence) -> dict[str, Any]:
    """Every interrupted execution, matched to the outage it ended in: one of at least a lease (allowed), or a
    shorter one, or none (each a failure, listed in ``early``)."""
    executions, _, _ = read_executions(evidence.exec_logs)
    outages = [f for f in evidence.faults if f.kind == "db_down"]
    counted = {"interruptions": 0, "interrupted_in_long_outages": 0, "early": []}
    for run in executions:
        if run.outcome != "interrupted" or run.ended_at is None:
            continue
        counted["interruptions"] += 1
        during = next((f for f in outages if f.at <= run.ended_at <= (f.until or f.at) + INTERRUPT_SLACK_SECONDS),
                      None)
        if during is not None and (during.detail or {}).get("past_lease"):
            counted["interrupted_in_long_outages"] += 1
            continue
        where = f"an outage of {(during.until or during.at) - during.at:.1f} s" if during else "no outage"
        counted["early"].append(f"{run.job}: interrupted at {run.ended_at:.3f} during {where}, shorter than "
                                f"{quiet_limit():.1f} s")
    return counted
