"""A runner on a PostgreSQL queue, against fake_comfy: woken by NOTIFY, and safe when the database goes away."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
from pg_support import pg_url  # noqa: F401  (a fixture)

from comfysup.config import Config, load_config
from comfysup.jobs import JobsFile
from comfysup.queue.postgres import CHANNEL, PostgresQueue
from comfysup.runner.loop import Runner
from fake_comfy import FakeComfy
from tests.runner_helpers import job_id, jobs_file, trivial_job

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=5)
    server.start()
    yield server
    server.stop()


def pg_config(tmp: Path, url: str, **runner: Any) -> Config:
    settings = {"attempts": 2, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
                "timeout_seconds": 20.0, "poll_seconds": 0.2, "lease_seconds": 10.0, "heartbeat_seconds": 0.5,
                "http_timeout_seconds": 5.0, **runner}
    doc = {"queue": {"url": url, "path": str(tmp / "var" / "queue.db")}, "store": {"dir": str(tmp / "store")},
           "comfyui": {"gpus": "cpu:1"}, "runner": settings}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return load_config(str(path), env={})


def submit(tmp: Path, queue: PostgresQueue, jobs: list[dict[str, Any]]) -> None:
    file = JobsFile(jobs_file(tmp, jobs, name=f"jobs-{jobs[0]['id'][:8]}.jsonl"))
    assert file.validate().ok
    queue.intake.submit(file.jobs())


@pytest.mark.timeout(60)
def test_an_idle_runner_is_woken_by_notify_not_by_its_poll(tmp_path: Path, pg_url: str,  # noqa: F811
                                                            fake: FakeComfy) -> None:
    """The idle wait is made 30 s long: a job claimed within a second was claimed because of the NOTIFY."""
    config = pg_config(tmp_path, pg_url)
    runner = Runner(config, "cpu0", fake.url)
    runner.idle_seconds = 30.0
    idle = threading.Event()
    wait = runner.queue.wait_for_work

    def waiting(timeout_seconds: float) -> None:
        idle.set()
        wait(timeout_seconds)

    runner.queue.wait_for_work = waiting  # type: ignore[method-assign]
    thread = threading.Thread(target=runner.run)
    thread.start()
    submitter = PostgresQueue(pg_url)
    try:
        for n in (1, 2, 3):
            assert idle.wait(10), "the runner never went idle"
            time.sleep(0.05)  # into the wait itself, past the event
            idle.clear()
            submit(tmp_path, submitter, [trivial_job(n)])
            deadline = time.monotonic() + 10
            while submitter.reads.get(job_id(n)).state != "done" and time.monotonic() < deadline:
                time.sleep(0.02)
            job = submitter.reads.get(job_id(n))
            assert job.state == "done"
            waited = job.attempts[0].started_at - job.submitted_at  # both on the database's clock
            assert waited < 1.0, f"job {n} waited {waited:.3f} s for an idle runner"
    finally:
        runner.state.stopping = True
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"NOTIFY {CHANNEL}")  # wake it so it sees the stop flag
        thread.join(15)
        submitter.close()
    assert not thread.is_alive()
