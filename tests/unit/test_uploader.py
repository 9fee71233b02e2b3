"""The upload outbox's sender as a table: its backoff plan (pure), and one machine's uploader over a SQLite queue
with a store that fails while the bucket is "down" (no S3 server: comfysup.runner.uploader)."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.config import Config, StoreConfig
from comfysup.queue.base import Output, StagedJob
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.staging import StagingBound
from comfysup.runner.uploader import Step, Uploader, UploadPlan
from comfysup.storage.s3 import Unreachable
from tests.queue_contract import make_job

JOB = StagedJob(id="j", attempt=1, machine="m", staged_in="/s/j", staged_at=1000.0, staged_bytes=1, outputs=[],
                reason=None)


def test_the_plan_backs_off_with_full_jitter_once_per_machine_and_resets_on_a_success() -> None:
    plan = UploadPlan(1.0, 8.0, 0.0, rand=lambda: 0.999)
    assert plan.decide(JOB, now=0.0, wall=5000.0) is Step.UPLOAD
    delays = [plan.failed(now=10.0) for _ in range(6)]
    assert [round(d, 2) for d in delays] == [1.0, 2.0, 4.0, 7.99, 7.99, 7.99]  # capped at the max
    assert plan.decide(JOB, now=10.0, wall=5000.0) is Step.WAIT
    assert plan.decide(JOB, now=18.0, wall=5000.0) is Step.UPLOAD
    assert plan.sent() is True and plan.failures == 0 and plan.sent() is False
    assert UploadPlan(1.0, 8.0, 0.0, rand=lambda: 0.0).failed(now=0.0) == 0.0  # full jitter: from 0


@pytest.mark.parametrize(("give_up", "waited", "step"), [(0.0, 1e9, Step.UPLOAD), (3600.0, 3599.0, Step.UPLOAD),
                                                         (3600.0, 3601.0, Step.GIVE_UP)])
def test_the_plan_gives_up_only_past_upload_give_up_hours(give_up: float, waited: float, step: Step) -> None:
    plan = UploadPlan(1.0, 8.0, give_up)
    plan.failed(now=0.0)  # even while waiting for the backoff
    assert plan.decide(JOB, now=0.0 if step is Step.GIVE_UP else 100.0, wall=JOB.staged_at + waited) is step


class FlakyStore:
    """An object store whose bucket is up or down: ``upload`` answers an s3:// path, or raises Unreachable."""

    def __init__(self, root: Path = Path("/nonexistent-staging")) -> None:
        self.root = root
        self.up = False
        self.forgotten: list[str] = []

    def upload(self, job_id: str, staged: Output) -> Output:
        if not self.up:
            raise Unreachable("cannot reach the service")
        return staged._replace(path=f"s3://b/{job_id}/{staged.name}")

    def forget(self, job_id: str) -> None:
        self.forgotten.append(job_id)


def test_an_outage_spends_no_attempt_and_the_jobs_are_done_in_order_once_it_is_back(tmp_path: Path) -> None:
    queue = SQLiteQueue(tmp_path / "q.db")
    staged = tmp_path / "staged.png"
    staged.write_bytes(b"x")
    queue.intake.submit([make_job(1), make_job(2)])
    for _ in range(2):
        claim = queue.leases.claim("m/1/gpu0/t", "gpu0", 30.0)
        assert claim is not None
        out = Output(name="a.png", size=1, sha256="00" * 32, path=str(staged))
        queue.leases.complete(claim, [out], staged_in=str(tmp_path))
    store = FlakyStore()
    now = [0.0]
    config = Config(store=StoreConfig(url="s3://b", upload_base_delay_seconds=1.0, upload_max_delay_seconds=4.0))
    uploader = Uploader(config, queue, store, machine="m", clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(5):
        now[0] += uploader.run_once()
    assert uploader.plan.failures == 5 and queue.reads.status().counts["storing"] == 2
    assert {queue.reads.get(make_job(n).id).attempt for n in (1, 2)} == {1}
    store.up = True
    now[0] += 4.0
    uploader.run_once()
    assert [queue.reads.get(make_job(n).id).state for n in (1, 2)] == ["done", "done"]
    assert store.forgotten == [make_job(1).id, make_job(2).id] and uploader.plan.failures == 0
    queue.close()


def test_a_cancelled_storing_job_is_not_made_done_and_its_staged_files_go(tmp_path: Path) -> None:
    queue = SQLiteQueue(tmp_path / "q.db")
    staged = tmp_path / "staged.png"
    staged.write_bytes(b"x")
    queue.intake.submit([make_job(1)])
    claim = queue.leases.claim("m/1/gpu0/t", "gpu0", 30.0)
    assert claim is not None
    queue.leases.complete(claim, [Output(name="a.png", size=1, sha256="00" * 32, path=str(staged))],
                          staged_in=str(tmp_path))
    store = FlakyStore()
    store.up = True
    uploader = Uploader(Config(store=StoreConfig(url="s3://b")), queue, store, machine="m")  # type: ignore[arg-type]
    job = queue.uploads.staged("m")[0]
    queue.intake.cancel([claim.id])
    uploader._stored(job, job.outputs)
    assert queue.reads.get(claim.id).state == "cancelled" and store.forgotten == [claim.id]
    queue.close()


def test_the_first_pass_removes_the_staging_folders_of_jobs_done_in_the_bucket_only(tmp_path: Path) -> None:
    """An uploader stopped between a done and the removal of its folder: the next one's first pass removes it; it
    leaves the folder of a job that is still running (its runner downloads into it) and the folder of a job done
    on disk before [store] url was set (the same dir: its files are the only copy)."""
    queue = SQLiteQueue(tmp_path / "q.db")
    queue.intake.submit([make_job(1), make_job(2), make_job(3)])
    ended = queue.leases.claim("m/1/gpu0/t", "gpu0", 30.0)
    running = queue.leases.claim("m/1/gpu1/t", "gpu1", 30.0)
    on_disk = queue.leases.claim("m/1/gpu2/t", "gpu2", 30.0)
    assert ended is not None and running is not None and on_disk is not None
    queue.leases.complete(ended, [Output(name="a.png", size=1, sha256="00" * 32, path="s3://b/x/a.png")])
    queue.leases.complete(on_disk, [Output(name="a.png", size=1, sha256="00" * 32, path="/r/a.png")])
    for job_id in (ended.id, running.id, on_disk.id):
        (tmp_path / "staging" / job_id).mkdir(parents=True)
    store = FlakyStore(tmp_path / "staging")
    Uploader(Config(store=StoreConfig(url="s3://b")), queue, store, machine="m").run_once()  # type: ignore[arg-type]
    assert store.forgotten == [ended.id]
    queue.close()


class Staged:
    """A queue's uploads role that says how much this machine's storing jobs hold."""

    def __init__(self) -> None:
        self.bytes = 0
        self.uploads = self

    def staging_bytes(self, machine: str) -> int:
        return self.bytes


def test_the_staging_bound_stops_claims_when_full_and_lets_them_go_again() -> None:
    config = Config(store=StoreConfig(url="s3://b", staging_max_gb=1.0))
    bound = StagingBound(config, machine="m")
    queue = Staged()
    assert bound.look(queue, now=0.0) is False  # type: ignore[arg-type]
    queue.bytes = 2**30
    assert bound.look(queue, now=0.5) is False  # type: ignore[arg-type]  # looked at most once a second
    assert bound.look(queue, now=1.0) is True  # type: ignore[arg-type]
    assert bound.snapshot() == {"bytes": 2**30, "max_bytes": 2**30, "full": True, "reason": bound.reason()}
    assert "the staging folder is full (1.00 of 1 GiB, [store] staging_max_gb)" in bound.reason()
    queue.bytes = 0
    assert bound.look(queue, now=2.0) is False  # type: ignore[arg-type]
    assert StagingBound(Config(store=StoreConfig(staging_max_gb=1.0))).snapshot() is None  # no bucket: no bound
    assert StagingBound(Config(store=StoreConfig(url="s3://b", staging_max_gb=0))).look(queue, 5.0) is False  # type: ignore[arg-type]


def test_each_machine_uploads_only_what_it_staged(tmp_path: Path) -> None:
    """Two machines on one queue: each uploader takes its own machine's storing jobs, never the other's files."""
    queue = SQLiteQueue(tmp_path / "q.db")
    staged = tmp_path / "staged.png"
    staged.write_bytes(b"x")
    queue.intake.submit([make_job(1), make_job(2)])
    for host in ("box-a", "box-b"):
        claim = queue.leases.claim(f"{host}/1/gpu0/t", "gpu0", 30.0)
        assert claim is not None
        queue.leases.complete(claim, [Output(name="a.png", size=1, sha256="00" * 32, path=str(staged))],
                              staged_in=str(tmp_path))
    store = FlakyStore()
    store.up = True
    config = Config(store=StoreConfig(url="s3://b"))
    Uploader(config, queue, store, machine="box-a").run_once()  # type: ignore[arg-type]
    states = {j.machine: j.state for j in queue.reads.get_many([make_job(1).id, make_job(2).id])}
    assert states == {"box-a": "done", "box-b": "storing"} and len(store.forgotten) == 1
    assert list(queue.uploads.by_machine()) == ["box-b"]
    queue.close()
