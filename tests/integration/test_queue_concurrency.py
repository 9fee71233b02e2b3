"""Eight processes drain one SQLite queue at once: the claimed row is the lock, and fencing holds.

The proof is read back from the attempts table, which records every claim with its owner and its
start and end: no two attempts of one job overlap in time, and each job has exactly one ``done``.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from pathlib import Path

import pytest
from queue_contract import check_attempt_history, make_job

from comfysup.errors import LeaseLost
from comfysup.queue.base import Output
from comfysup.queue.sqlite import SQLiteQueue

WORKERS = 8
JOBS = 2000
CTX = multiprocessing.get_context("fork")


def _worker(path: str, owner: str, lease_seconds: float, stall_every: int, stall_seconds: float,
            start: multiprocessing.synchronize.Barrier, report: str) -> None:
    """Claim, heartbeat and complete until the queue is empty; write what this owner completed.

    Every ``stall_every``-th job (0: never) this runner hangs longer than its lease before completing,
    as a stuck ComfyUI call would, so another runner takes the job over and this one must be fenced out.
    """
    queue = SQLiteQueue(path, create=False, busy_timeout_seconds=60)
    rng = random.Random(owner)
    completed: list[str] = []
    lost: list[str] = []
    start.wait()
    while True:
        claim = queue.leases.claim(owner, f"server-{owner}", lease_seconds)
        if claim is None:
            if not queue.reads.running_owners():
                break
            queue.maintenance()  # another runner may still lose a lease to us; look again
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


def _drain(tmp_path: Path, lease_seconds: float, stall_every: int = 0,
           stall_seconds: float = 0.0) -> tuple[SQLiteQueue, dict[str, dict[str, list[str]]]]:
    path = tmp_path / "q.db"
    queue = SQLiteQueue(path)
    queue.intake.submit([make_job(i) for i in range(JOBS)])
    start = CTX.Barrier(WORKERS)
    procs = []
    for n in range(WORKERS):
        owner = f"runner-{n}"
        p = CTX.Process(target=_worker, args=(str(path), owner, lease_seconds, stall_every, stall_seconds, start,
                                               str(tmp_path / f"{owner}.json")))
        p.start()
        procs.append((owner, p))
    for _, p in procs:
        p.join(timeout=90)
        assert p.exitcode == 0, f"worker exit code {p.exitcode}"
    reports = {owner: json.loads((tmp_path / f"{owner}.json").read_text()) for owner, _ in procs}
    return queue, reports


def _check_invariants(queue: SQLiteQueue, reports: dict[str, dict[str, list[str]]]) -> None:
    ids = {make_job(i).id for i in range(JOBS)}
    completions = [(owner, job_id) for owner, r in reports.items() for job_id in r["completed"]]
    assert len(completions) == JOBS, "some job was completed twice, or not at all"
    assert {job_id for _, job_id in completions} == ids
    assert queue.reads.status().counts["done"] == JOBS

    rows = queue.db.conn.execute(
        "SELECT job_id, attempt, owner, started_at, ended_at, outcome FROM attempts ORDER BY job_id, started_at"
    ).fetchall()
    check_attempt_history(rows, ids, completions)
    assert queue.db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.timeout(120)
def test_eight_processes_claim_heartbeat_and_complete_2000_jobs_once_each(tmp_path: Path) -> None:
    queue, reports = _drain(tmp_path, lease_seconds=60)
    _check_invariants(queue, reports)
    assert all(not r["lost"] for r in reports.values())  # no lease expired, so no fencing happened
    assert sum(1 for r in reports.values() if r["completed"]) >= 2  # the work really was shared
    queue.close()


@pytest.mark.timeout(120)
def test_leases_lost_under_load_are_fenced_and_the_job_still_completes_once(tmp_path: Path) -> None:
    queue, reports = _drain(tmp_path, lease_seconds=0.3, stall_every=150, stall_seconds=0.6)
    _check_invariants(queue, reports)
    lost = [job_id for r in reports.values() for job_id in r["lost"]]
    expired = queue.db.conn.execute("SELECT count(*) FROM attempts WHERE outcome = 'lease_expired'").fetchone()[0]
    assert len(lost) <= expired
    assert expired >= 1  # the stalls did make other runners take jobs over
    queue.close()
