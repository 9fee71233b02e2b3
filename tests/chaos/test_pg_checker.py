"""The two-machine checker (chaos/pg.py) catches what it counts on a PostgreSQL queue: a clean synthetic
run of two machines passes, and a doubled done record, a lost job, a file missing from the store of the
machine that did the job, or a done record naming no machine fails it. Without these a reader that saw
nothing would make the acceptance row green.

The run is made with the real queue (PostgresQueue), two real result stores and execution-log lines as
fake_comfy writes them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)

from chaos.checker import Evidence, Report, Submission
from chaos.faults import FaultLog
from chaos.pg import check_machines
from comfysup.queue.base import NewJob
from comfysup.queue.postgres import PostgresQueue
from comfysup.runner.store import ResultStore
from fake_comfy.images import png_bytes

pytestmark = pytest.mark.timeout(60)
T0 = 1_700_000_000.0
HOSTS = ("machine-a", "machine-b")


@dataclass
class Run:
    """Four jobs, done once each, alternately on machine-a and machine-b, each file in its machine's store."""

    root: Path
    url: str
    ids: list[str]
    stores: dict[str, ResultStore]
    exec_log: Path
    faults: FaultLog
    submissions: list[Submission]

    def check(self) -> Report:
        evidence = Evidence(root=self.root, queue_path=self.root / "unused.db", store=self.root / "unused",
                            exec_logs=[self.exec_log], faults=self.faults.faults(), submissions=self.submissions,
                            ended_at=T0 + 100)
        return check_machines(evidence, self.url, {h: s.root for h, s in self.stores.items()})

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(query, args)


@pytest.fixture
def run(tmp_path: Path, pg_url: str) -> Run:  # noqa: F811
    queue = PostgresQueue(pg_url)
    stores = {h: ResultStore(tmp_path / h / "results", 2**20) for h in HOSTS}
    ids = [str(uuid.uuid4()) for _ in range(4)]
    queue.intake.submit([NewJob(id=i, workflow={"1": {"class_type": "SaveImage", "inputs": {}}}, spec_hash="h")
                  for i in ids], now=T0)
    r = Run(tmp_path, pg_url, ids, stores, tmp_path / "exec.jsonl", FaultLog(tmp_path / "faults.jsonl"),
            [Submission(tmp_path / "jobs.jsonl", tuple(ids), "accepted")])
    with open(r.exec_log, "w") as log:
        for n, job_id in enumerate(ids):
            host = HOSTS[n % 2]
            claim = queue.leases.claim(f"{host}/{100 + n}/cpu0/t", "cpu0", 30)
            assert claim is not None and claim.id == job_id
            for event, at in (("start", T0 + 10 * n + 1), ("end", T0 + 10 * n + 2)):
                line = {"event": event, "pid": 200 + n, "port": 9000 + n, "prompt_id": job_id, "number": n,
                        "started_at": T0 + 10 * n + 1, "ended_at": at, "outcome": "success", "cached": False}
                log.write(json.dumps(line) + "\n")
            stores[host].prepare(job_id)
            output = stores[host].write(job_id, f"job{n}_00001_.png", [png_bytes(8, 8, (n, 0, 0))])
            queue.leases.complete(claim, [output])
    queue.close()
    return r


def test_a_clean_two_machine_run_passes(run: Run) -> None:
    report = run.check()
    assert report.ok, report.explain()
    assert (report.jobs, report.states["done"], report.executions, report.attempts) == (4, 4, 4, 4)
    assert report.figures["done_by"] == {"machine-a": 2, "machine-b": 2}


def test_a_second_done_record_is_double_terminal(run: Run) -> None:
    run.sql("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome) "
            "VALUES (%s, 2, 'machine-b/9/cpu1/y', 'cpu1', %s, %s, 'done')", (run.ids[0], T0 + 50, T0 + 51))
    report = run.check()
    assert not report.ok and [d.split(":")[0] for d in report.double_terminal] == [run.ids[0]]


def test_a_job_left_queued_is_lost(run: Run) -> None:
    run.sql("UPDATE jobs SET state = 'queued' WHERE id = %s", (run.ids[1],))
    assert run.check().lost == [f"{run.ids[1]}: queued after the run drained"]


def test_files_are_owed_by_the_store_of_the_machine_that_did_the_job(run: Run) -> None:
    done_on_b = run.ids[1]
    folder_b = run.stores["machine-b"].job_dir(done_on_b)
    folder_a = run.stores["machine-a"].job_dir(done_on_b)
    folder_b.rename(folder_a)  # complete and intact, but on the other machine: `results` would point wrongly
    report = run.check()
    assert not report.ok and len(report.missing_files) == 1 and done_on_b in report.missing_files[0]
    assert not report.extra_results  # on machine-a it is a job done elsewhere: its files there are orphans
    assert report.orphan_files == 1


def test_a_complete_file_of_a_job_done_elsewhere_is_an_orphan_not_a_violation(run: Run) -> None:
    done_on_b = run.ids[1]
    run.stores["machine-a"].prepare(done_on_b)
    run.stores["machine-a"].write(done_on_b, "job1_00001_.png", [png_bytes(8, 8, (1, 0, 0))])
    report = run.check()
    assert report.ok, report.explain()
    assert report.orphan_files == 1


def test_a_done_record_naming_no_machine_fails(run: Run) -> None:
    run.sql("UPDATE jobs SET machine = NULL WHERE id = %s", (run.ids[2],))
    report = run.check()
    assert not report.ok and "naming no machine" in report.integrity
