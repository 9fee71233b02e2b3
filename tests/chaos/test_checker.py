"""The checker catches each violation it counts: a clean synthetic run passes, and each metric, broken on
its own, fails it. Without these a checker that always said "ok" would make every chaos row green.

The synthetic run is made with the real queue (SQLiteQueue), the real result store and execution-log
lines as fake_comfy writes them; each test then damages one thing.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import Evidence, Report, Submission, check, complete_png
from chaos.faults import FaultLog
from comfysup.queue.base import NewJob
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.store import ResultStore
from fake_comfy.images import png_bytes

pytestmark = pytest.mark.timeout(30)
CANARY = "canary-0123456789"
T0 = 1_700_000_000.0


@dataclass
class Run:
    """Three jobs done once each on two servers, with files, logs and an execution log, all consistent."""

    root: Path
    queue: SQLiteQueue
    store: ResultStore
    ids: list[str]
    faults: FaultLog
    exec_log: Path
    log: Path
    jobs_file: Path
    submissions: list[Submission] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, Path] = field(default_factory=dict)

    def evidence(self) -> Evidence:
        return Evidence(root=self.root, queue_path=self.queue.path, store=self.store.root,
                        exec_logs=[self.exec_log], faults=self.faults.faults(), submissions=self.submissions,
                        logs=[self.log], canaries=[CANARY], outputs=self.outputs, not_scanned=[self.jobs_file],
                        ended_at=T0 + 100, inputs=self.inputs)

    def check(self) -> Report:
        return check(self.evidence())

    def exec_line(self, event: str, job: str, *, pid: int, number: int, at: float, outcome: str | None = None,
                  word: str = "ok", started_at: float | None = None) -> None:
        line: dict[str, Any] = {"event": event, "at": at, "pid": pid, "port": 9000 + pid % 2, "prompt_id": job,
                                "number": number, "word": word}
        if event == "start":
            line |= {"started_at": at, "cached": False}
        if event == "end":
            line |= {"started_at": started_at, "ended_at": at, "outcome": outcome}
        with open(self.exec_log, "a") as f:
            f.write(json.dumps(line) + "\n")

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> None:
        conn = sqlite3.connect(self.queue.path)
        conn.execute(query, args)
        conn.commit()
        conn.close()


@pytest.fixture
def run(tmp_path: Path) -> Run:
    queue = SQLiteQueue(tmp_path / "var" / "queue.db")
    store = ResultStore(tmp_path / "var" / "results", 2**20)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("".join(json.dumps({"id": i, "extra_data": {"api_key_comfy_org": CANARY}}) + "\n"
                                 for i in ids))
    queue.intake.submit([NewJob(id=i, workflow={"1": {"class_type": "SaveImage", "inputs": {}}}, spec_hash="h",
                         extra_data={"api_key_comfy_org": CANARY}) for i in ids], now=T0)
    r = Run(tmp_path, queue, store, ids, FaultLog(tmp_path / "faults.jsonl"), tmp_path / "exec.jsonl",
            tmp_path / "supervisor.log", jobs_file, [Submission(jobs_file, tuple(ids), "accepted")])
    lines = []
    for n, job_id in enumerate(ids):
        claim = queue.leases.claim(f"host/{100 + n}/cpu{n % 2}/t", f"cpu{n % 2}", 30, now=T0 + 10 * n)
        assert claim is not None and claim.id == job_id
        queue.leases.record_prompt(claim, claim.server, n)
        r.exec_line("start", job_id, pid=200 + n, number=n, at=T0 + 10 * n + 1)
        r.exec_line("end", job_id, pid=200 + n, number=n, at=T0 + 10 * n + 2, outcome="success",
                    started_at=T0 + 10 * n + 1)
        store.prepare(job_id)
        output = store.write(job_id, f"job{n}_00001_.png", [png_bytes(8, 8, (n, 0, 0))])
        queue.leases.complete(claim, [output], now=T0 + 10 * n + 3)
        lines.append(f"job {job_id}: done on cpu{n % 2} after 1 attempt(s), 1 file(s)")
    r.log.write_text("\n".join(lines) + "\n")
    r.outputs["status"] = "3 done"
    queue.close()
    return r


def test_a_clean_run_passes(run: Run) -> None:
    report = run.check()
    assert report.ok, report.explain()
    assert (report.jobs, report.states["done"], report.executions, report.attempts) == (3, 3, 3, 3)


def test_an_output_that_is_not_its_input_inverted_is_a_wrong_output(run: Run) -> None:
    white, black = run.root / "white.png", run.root / "black.png"
    white.write_bytes(png_bytes(8, 8, (255, 255, 255)))  # job 0's output is black: white inverted
    black.write_bytes(png_bytes(8, 8, (0, 0, 0)))
    run.inputs = {run.ids[0]: white}
    report = run.check()
    assert report.ok and report.figures["outputs_checked_against_inputs"] == 1, report.explain()
    run.inputs = {run.ids[0]: black}
    report = run.check()
    assert not report.ok and len(report.wrong_outputs) == 1
    assert "192 of 192 samples are not the inverse of black.png" in report.wrong_outputs[0]


def test_a_job_never_terminal_is_lost(run: Run) -> None:
    run.sql("UPDATE jobs SET state = 'queued' WHERE id = ?", (run.ids[0],))
    assert run.check().lost == [f"{run.ids[0]}: queued after the run drained"]


def test_an_accepted_job_missing_from_the_queue_is_lost(run: Run) -> None:
    extra = str(uuid.uuid4())
    run.submissions.append(Submission(run.jobs_file, (extra,), "accepted"))
    assert run.check().lost == [f"{extra}: accepted, not in the queue"]


def test_part_of_a_killed_or_rejected_file_in_the_queue_is_a_partial_submit(run: Run) -> None:
    other = str(uuid.uuid4())
    run.submissions[0] = Submission(run.jobs_file, (*run.ids, other), "killed")
    report = run.check()
    assert len(report.partial_submits) == 1 and "3 of 4 rows" in report.partial_submits[0]
    run.submissions[0] = Submission(run.jobs_file, tuple(run.ids), "killed")  # all of it: the kill came late
    assert run.check().ok


def test_two_terminal_records_or_log_lines_are_double_terminal(run: Run) -> None:
    run.sql("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome) "
            "VALUES (?, 2, 'host/9/cpu0/x', 'cpu0', ?, ?, 'done')", (run.ids[1], T0 + 50, T0 + 51))
    assert [d.split(":")[0] for d in run.check().double_terminal] == [run.ids[1]]
    run.sql("DELETE FROM attempts WHERE attempt = 2")
    with open(run.log, "a") as f:
        f.write(f"job {run.ids[2]}: dead-lettered, something\n")
    assert run.check().double_terminal == [f"{run.ids[2]}: 2 terminal log lines"]


def test_a_person_s_retry_allows_a_second_terminal_record(run: Run) -> None:
    run.sql("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome) "
            "VALUES (?, 2, 'host/9/cpu0/x', 'cpu0', ?, ?, 'done')", (run.ids[1], T0 + 50, T0 + 51))
    run.faults.record("requeue", at=T0 + 49, ids=[run.ids[1]])
    assert run.check().ok


def test_overlapping_attempts_are_overlapping_claims(run: Run) -> None:
    run.sql("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome) "
            "VALUES (?, 2, 'host/9/cpu1/x', 'cpu1', ?, ?, 'released')", (run.ids[0], T0 + 0.5, T0 + 1))
    report = run.check()
    assert len(report.overlapping_claims) == 1 and report.overlapping_claims[0].startswith(run.ids[0])


def test_overlapping_executions_on_two_servers_are_concurrent(run: Run) -> None:
    job = run.ids[0]
    run.exec_line("start", job, pid=301, number=7, at=T0 + 1.5)  # while pid 200 still ran it (until T0 + 2)
    run.exec_line("end", job, pid=301, number=7, at=T0 + 2.5, outcome="success", started_at=T0 + 1.5)
    _attempt(run, job, T0 + 4)
    report = run.check()
    assert len(report.concurrent) == 1 and report.concurrent[0].startswith(job)


def test_an_execution_after_a_success_is_a_failure_even_when_a_kill_took_the_history(run: Run) -> None:
    job = run.ids[0]
    run.exec_line("start", job, pid=301, number=7, at=T0 + 5)
    run.exec_line("end", job, pid=301, number=7, at=T0 + 6, outcome="success", started_at=T0 + 5)
    _attempt(run, job, T0 + 4.5)
    report = run.check()
    assert len(report.after_completed) == 1 and not report.unmatched and not report.re_executions
    assert not report.ok and not report.concurrent and not report.uncounted
    run.faults.record("server_kill", pids=(200,), at=T0 + 2.1)  # the first run's server, its history with it
    report = run.check()
    assert len(report.after_completed) == 1 and not report.re_executions, "a completed run is adopted, never re-run"


def test_a_run_killed_after_its_files_and_before_its_history_is_completed(run: Run) -> None:
    job = run.ids[0]
    run.exec_line("start", job, pid=400, number=9, at=T0 - 5)
    run.exec_line("completed", job, pid=400, number=9, at=T0 - 4.9)  # files written, then the kill
    with open(run.exec_log) as f:  # exec_line writes no completed_at: give the line its field
        lines = f.read().splitlines()
    lines[-1] = lines[-1][:-1] + f', "completed_at": {T0 - 4.9}}}'
    run.exec_log.write_text("\n".join(lines) + "\n")
    run.faults.record("server_kill", pids=(400,), at=T0 - 4.8)
    _attempt(run, job, T0 - 6)
    report = run.check()
    assert report.after_completed and not report.re_executions and not report.ok


def test_a_re_execution_after_the_server_was_killed_mid_prompt_is_matched(run: Run) -> None:
    job = run.ids[0]
    run.exec_line("start", job, pid=400, number=9, at=T0 - 5)  # no end line: its server was killed
    run.faults.record("server_kill", pids=(400,), at=T0 - 4)
    _attempt(run, job, T0 - 6)
    report = run.check()
    assert report.ok, report.explain()
    assert report.re_executions == {"server_kill mid-prompt": 1}


def test_an_execution_without_an_end_nor_a_kill_is_an_unexplained_death(run: Run) -> None:
    job = run.ids[0]
    run.exec_line("start", job, pid=400, number=9, at=T0 - 5)
    _attempt(run, job, T0 - 6)
    report = run.check()
    assert report.unexplained_deaths and len(report.concurrent) == 1  # open until the run's end


def test_more_executions_than_attempts_is_an_uncounted_run(run: Run) -> None:
    job = run.ids[0]
    run.exec_line("start", job, pid=400, number=9, at=T0 - 5, word="crash")
    run.exec_line("end", job, pid=400, number=9, at=T0 - 4, outcome="crashed", word="crash", started_at=T0 - 5)
    report = run.check()
    assert report.re_executions == {"crash": 1}
    assert report.uncounted == [f"{job}: 2 executions, 0 posts, 1 attempts"]


def test_one_more_execution_after_an_oom_is_counted_with_it(run: Run) -> None:
    """After an OOM the attempt sends POST /free and posts the job once more without counting: one
    execution more than attempts per OOM run is the rule, two more is an uncounted run."""
    job = run.ids[0]
    run.exec_line("start", job, pid=400, number=9, at=T0 - 5, word="oom")
    run.exec_line("end", job, pid=400, number=9, at=T0 - 4, outcome="error", word="oom", started_at=T0 - 5)
    report = run.check()
    assert report.re_executions == {"oom": 1} and report.uncounted == []
    run.exec_line("start", job, pid=400, number=10, at=T0 - 3, word="crash")
    run.exec_line("end", job, pid=400, number=10, at=T0 - 2, outcome="crashed", word="crash", started_at=T0 - 3)
    assert run.check().uncounted == [f"{job}: 3 executions, 0 posts, 1 attempts and 1 OOM run(s)"]


def test_a_missing_or_changed_recorded_file_fails(run: Run) -> None:
    folder = run.store.root
    (folder / run.ids[0] / "job0_00001_.png").unlink()
    (folder / run.ids[1] / "job1_00001_.png").write_bytes(png_bytes(8, 8, (9, 9, 9)))
    report = run.check()
    assert [m.split(":")[0] for m in report.missing_files] == [run.ids[0]]
    assert [m.split(":")[0] for m in report.partial_files] == [run.ids[1]]


def test_a_cut_image_under_a_final_name_is_partial_and_a_part_file_is_fine(run: Run) -> None:
    folder = run.store.root / run.ids[2]
    whole = png_bytes(8, 8, (1, 2, 3))
    (folder / "extra_00002_.png").write_bytes(whole[:-5])
    (folder / ".extra_00003_.png.part").write_bytes(whole[:-5])
    report = run.check()
    assert report.partial_files == [f"{run.ids[2]}/extra_00002_.png: under a final name and not a complete image"]
    assert report.part_files == 1


def test_a_second_complete_result_in_a_done_job_s_folder_is_extra(run: Run) -> None:
    (run.store.root / run.ids[2] / "again_00002_.png").write_bytes(png_bytes(8, 8, (1, 2, 3)))
    assert len(run.check().extra_results) == 1


def test_a_file_outside_the_job_folders_fails(run: Run) -> None:
    (run.store.root / "loose.png").write_bytes(png_bytes(2, 2, (0, 0, 0)))
    (run.store.root / "not-a-job").mkdir()
    (run.store.root / "not-a-job" / "x.png").write_bytes(b"x")
    assert sorted(run.check().outside_files) == ["loose.png", "not-a-job/x.png"]


@pytest.mark.parametrize("where", ["log", "supervisor.json", "reason", "output", "store"])
def test_the_canary_anywhere_but_the_job_s_spec_is_a_leak(run: Run, where: str) -> None:
    if where == "log":
        with open(run.log, "a") as f:
            f.write(f"posting with key {CANARY}\n")
    elif where == "supervisor.json":
        (run.root / "var" / "supervisor.json").write_text(json.dumps({"job": CANARY}))
    elif where == "reason":
        run.sql("UPDATE attempts SET reason = ? WHERE job_id = ?", (f"failed: {CANARY}", run.ids[0]))
    elif where == "output":
        run.outputs["show"] = f"extra_data: {CANARY}"
    else:
        (run.store.root / run.ids[0] / "notes.txt").write_text(CANARY)
    report = run.check()
    assert len(report.leaks) == 1, report.leaks
    assert not report.ok


def test_the_job_s_own_spec_and_the_user_s_jobs_file_are_not_leaks(run: Run) -> None:
    assert CANARY.encode() in run.queue.path.read_bytes() + _wal(run)  # it is there, and allowed
    assert CANARY in run.jobs_file.read_text()
    assert run.check().leaks == []


def test_a_damaged_queue_fails_the_integrity_check(run: Run) -> None:
    conn = sqlite3.connect(run.queue.path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(run.queue.path.read_bytes())
    page = 4096
    data[page:] = b"\xa5" * (len(data) - page)  # every page but the schema's is garbage
    run.queue.path.write_bytes(bytes(data))
    report = run.check()
    assert report.integrity != "ok" and not report.ok


def test_complete_png_needs_every_chunk_and_iend_last() -> None:
    whole = png_bytes(4, 4, (1, 2, 3))
    assert complete_png(whole)
    assert not complete_png(whole[:-1]) and not complete_png(whole + b"x") and not complete_png(b"GIF89a")
    flipped = bytearray(whole)
    flipped[40] ^= 0xFF
    assert not complete_png(bytes(flipped))


def _attempt(run: Run, job: str, started: float) -> None:
    """One more attempt row (ended) for ``job``, so an extra execution is counted, not uncounted."""
    run.sql("INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome) "
            "VALUES (?, 0, 'host/8/cpu1/y', 'cpu1', ?, ?, 'retry')", (job, started, started + 0.01))


def _wal(run: Run) -> bytes:
    wal = run.queue.path.with_name(run.queue.path.name + "-wal")
    return wal.read_bytes() if wal.exists() else b""


def test_time_is_not_needed_to_read_the_fault_log(tmp_path: Path) -> None:
    log = FaultLog(tmp_path / "f.jsonl")
    log.record("server_kill", pids=[1, 2], job="j", slot="cpu0")
    fault = log.faults()[0]
    assert (fault.kind, fault.pids, fault.job, fault.detail) == ("server_kill", (1, 2), "j", {"slot": "cpu0"})
    assert abs(fault.at - time.time()) < 5


def test_outputs_in_a_bucket_are_read_back_and_hashed(run: Run) -> None:
    """Row U1: a done job's object missing from the bucket, or with other bytes, fails the run."""
    import shutil

    conn = sqlite3.connect(run.queue.path)
    objects: dict[str, bytes] = {}
    for n, job_id in enumerate(run.ids):
        [out] = json.loads(conn.execute("SELECT outputs FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])
        data = (run.store.root / job_id / out["name"]).read_bytes()
        out["path"] = f"s3://bucket/prefix/{job_id}/{out['name']}"
        conn.execute("UPDATE jobs SET outputs = ? WHERE id = ?", (json.dumps([out]), job_id))
        if n == 0:
            objects[out["path"]] = data
        elif n == 1:
            objects[out["path"]] = data[:-1]
    conn.commit()
    conn.close()
    shutil.rmtree(run.store.root)  # only staging there: everything is in the bucket
    evidence = run.evidence()
    evidence.objects = objects
    report = check(evidence)
    assert [m.split(":")[0] for m in report.missing_files] == [run.ids[2]]
    assert [m.split(":")[0] for m in report.partial_files] == [run.ids[1]]
    assert report.figures["objects_checked"] == 1
