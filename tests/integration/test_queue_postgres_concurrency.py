"""Eight processes drain one PostgreSQL queue at once: SKIP LOCKED hands each row to one claimer, and
fencing holds when leases are lost under load (the SQLite version is test_queue_concurrency.py).

The proof is read back from the attempts table: no two attempts of one job overlap in time, and each job
has exactly one ``done``, recorded for the owner that reported completing it.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from pathlib import Path

import psycopg
import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)
from queue_contract import check_attempt_history, make_job

from comfysup.errors import LeaseLost
from comfysup.queue.base import Output
from comfysup.queue.postgres import PostgresQueue

WORKERS = 8
JOBS = 2000
CTX = multiprocessing.get_context("fork")


def _worker(url: str, owner: str, lease_seconds: float, stall_every: int, stall_seconds: float,
            start: multiprocessing.synchronize.Barrier, report: str) -> None:
    """Claim, heartbeat and complete until nothing is left; every ``stall_every``-th job hangs past its
    lease first, as a stuck ComfyUI call would, so another runner takes it over."""
    queue = PostgresQueue(url)
    rng = random.Random(owner)
    completed: list[str] = []
    lost: list[str] = []
    start.wait()
    while True:
        claim = queue.leases.claim(owner, f"server-{owner}", lease_seconds)
        if claim is None:
            if not queue.reads.running_owners():
                break
            queue.wait_for_work(0.05)  # another runner may still lose a lease to us; look again
            continue
        try:
            queue.leases.heartbeat(claim, lease_seconds)
            if stall_every and rng.randrange(stall_every) == 0:
                time.sleep(stall_seconds)  # a hung call, not synchronisation
                queue.leases.heartbeat(claim, lease_seconds)
            queue.leases.complete(claim, [Output(f"{claim.id}.png", 1, "00" * 32)])
            completed.append(claim.id)
        except LeaseLost:
            lost.append(claim.id)
    queue.close()
    Path(report).write_text(json.dumps({"completed": completed, "lost": lost}))


def _drain(url: str, tmp_path: Path, jobs: int, lease_seconds: float, stall_every: int = 0,
           stall_seconds: float = 0.0) -> dict[str, dict[str, list[str]]]:
    queue = PostgresQueue(url)
    queue.intake.submit([make_job(i) for i in range(jobs)])
    queue.close()
    start = CTX.Barrier(WORKERS)
    procs = []
    for n in range(WORKERS):
        owner = f"runner-{n}"
        p = CTX.Process(target=_worker, args=(url, owner, lease_seconds, stall_every, stall_seconds, start,
                                               str(tmp_path / f"{owner}.json")))
        p.start()
        procs.append((owner, p))
    for _, p in procs:
        p.join(timeout=90)
        assert p.exitcode == 0, f"worker exit code {p.exitcode}"
    return {owner: json.loads((tmp_path / f"{owner}.json").read_text()) for owner, _ in procs}


def _check_invariants(url: str, jobs: int, reports: dict[str, dict[str, list[str]]]) -> int:
    """Returns how many attempts ended with an expired lease."""
    ids = {make_job(i).id for i in range(jobs)}
    completions = [(owner, job_id) for owner, r in reports.items() for job_id in r["completed"]]
    assert len(completions) == jobs, "some job was completed twice, or not at all"
    assert {job_id for _, job_id in completions} == ids
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs WHERE state = 'done'").fetchone()[0] == jobs
        rows = conn.execute("SELECT job_id, attempt, owner, started_at, ended_at, outcome FROM attempts "
                            "ORDER BY job_id, started_at, n").fetchall()
    check_attempt_history(rows, ids, completions)
    return sum(1 for r in rows if r[5] == "lease_expired")


@pytest.mark.timeout(120)
def test_eight_processes_claim_heartbeat_and_complete_2000_jobs_once_each(pg_url: str,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    reports = _drain(pg_url, tmp_path, JOBS, lease_seconds=60)
    assert _check_invariants(pg_url, JOBS, reports) == 0
    assert all(not r["lost"] for r in reports.values())  # no lease expired, so no fencing happened
    assert sum(1 for r in reports.values() if r["completed"]) >= 2  # the work really was shared


@pytest.mark.timeout(120)
def test_leases_lost_under_load_are_fenced_and_the_job_still_completes_once(pg_url: str,  # noqa: F811
                                                                            tmp_path: Path) -> None:
    reports = _drain(pg_url, tmp_path, 800, lease_seconds=0.3, stall_every=60, stall_seconds=0.6)
    expired = _check_invariants(pg_url, 800, reports)
    lost = [job_id for r in reports.values() for job_id in r["lost"]]
    assert len(lost) <= expired
    assert expired >= 1  # the stalls did make other runners take jobs over
