"""The queue's database goes away and comes back, under the processes that hold connections to it.

A PostgreSQL of the test's own (tests/pg_server.py) is restarted under a runner following its prompts: no prompt is
interrupted, every job is done once, and the runner renews once the server is back, without being restarted.
Meanwhile ``comfysup submit`` and the API answer that the queue is unavailable (503 ``queue_unavailable``), store
nothing, and work again once it is back. SQLite held locked by another process (a backup, BEGIN EXCLUSIVE) for
longer than busy_timeout while a prompt runs leaves the prompt running too.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from comfysup.cli import main
from comfysup.config import load_config
from comfysup.queue import open_queue
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.api_support import api_config, running_api
from tests.pg_server import OwnPostgres, module_postgres, own_postgres  # noqa: F401
from tests.runner_helpers import job_id, jobs_file, trivial_job

ROOT = Path(__file__).resolve().parents[2]
GRAPH = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())


def wait_until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def runner_config(tmp: Path, queue: dict[str, Any]) -> Path:
    """Short leases, so that an outage of a second or two is a large part of one."""
    doc = {"queue": {**queue, "busy_timeout_seconds": 0.3}, "store": {"dir": str(tmp / "store")},
           "comfyui": {"gpus": "cpu:1"},
           "runner": {"attempts": 2, "timeout_seconds": 30.0, "poll_seconds": 0.2, "lease_seconds": 8.0,
                      "heartbeat_seconds": 0.3, "http_timeout_seconds": 5.0, "jitter": False,
                      "base_delay_seconds": 0.05, "max_delay_seconds": 0.2}}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=250)  # three nodes: under a second a prompt
    server.start()
    yield server
    server.stop()


def executions(fake: FakeComfy) -> dict[str, list[str]]:
    return {pid: [e.get("outcome") for e in p.get("executions", [])] for pid, p in fake.stats()["prompts"].items()}


def assert_rode_out(caplog: pytest.LogCaptureFixture) -> None:
    """The runner met the outage while it held a job, and renewed after it."""
    said = [r.getMessage() for r in caplog.records]
    assert any("following the prompt on" in m for m in said), said
    assert any("answers again" in m for m in said), said


def run_runner(config_path: Path, fake: FakeComfy) -> tuple[Runner, threading.Thread]:
    runner = Runner(load_config(str(config_path), env={}), "cpu0", fake.url, RunnerOptions(until_empty=True))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    return runner, thread


@pytest.mark.timeout(60)
def test_postgres_restarted_under_running_prompts_interrupts_none(
        tmp_path: Path, fake: FakeComfy, own_postgres: OwnPostgres,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="comfysup.runner")
    config_path = runner_config(tmp_path, {"url": own_postgres.url})
    assert main(["submit", "--config", str(config_path), str(jobs_file(tmp_path, [trivial_job(n) for n in
                                                                                    range(1, 5)]))]) == 0
    runner, thread = run_runner(config_path, fake)
    wait_until(lambda: any(o == [None] for o in executions(fake).values()), 10, "a prompt to run")
    own_postgres.stop()  # every session ends; the runner's next renewal finds no server
    down = time.monotonic()
    wait_until(lambda: time.monotonic() - down > 1.5, 5, "an outage of a second and a half")
    own_postgres.kill()  # nothing to kill: stopped. The start below recovers as after a crash all the same
    own_postgres.start()
    thread.join(40)
    assert not thread.is_alive()
    runs = executions(fake)
    assert sorted(runs) == [job_id(n) for n in range(1, 5)]
    assert all(outcomes == ["success"] for outcomes in runs.values()), runs  # once each, never interrupted
    assert_rode_out(caplog)
    queue = open_queue(load_config(str(config_path), env={}))
    try:
        jobs = [queue.reads.get(job_id(n)) for n in range(1, 5)]
        assert [(j.state, j.attempt) for j in jobs] == [("done", 1)] * 4
    finally:
        queue.close()
    runner.station.close()


@pytest.mark.timeout(60)
def test_submit_and_the_api_say_the_queue_is_unavailable_while_postgres_is_down(
        tmp_path: Path, own_postgres: OwnPostgres, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    config = api_config(tmp_path, queue_url=own_postgres.url)
    jobs = jobs_file(tmp_path, [trivial_job(1)])
    with running_api(config) as url:
        own_postgres.kill()
        assert main(["submit", "--config", str(config.source), str(jobs)]) == 1
        said = capsys.readouterr().err
        assert "the queue is unavailable" in said and "nothing was submitted" in said and "Traceback" not in said
        answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, timeout=30)
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "queue_unavailable" and "nothing was stored" in error["message"]
        assert answer.headers["Retry-After"]
        assert httpx.get(f"{url}/api/v2/jobs", timeout=30).json()["error"]["code"] == "queue_unavailable"
        own_postgres.start()  # the same API, not restarted, reconnects
        again = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, timeout=30)
        assert again.status_code == 201, again.text
    assert main(["submit", "--config", str(config.source), str(jobs)]) == 0
    assert "submitted 1 job(s)" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_sqlite_locked_past_busy_timeout_leaves_the_prompt_running(tmp_path: Path, fake: FakeComfy,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Another process holds the write lock (BEGIN EXCLUSIVE, as a long backup or a stuck tool) for three seconds,
    ten times busy_timeout_seconds, while a prompt runs: it is never interrupted, and the job is done once."""
    caplog.set_level(logging.INFO, logger="comfysup.runner")
    config_path = runner_config(tmp_path, {"path": str(tmp_path / "queue.db")})
    assert main(["submit", "--config", str(config_path), str(jobs_file(tmp_path, [trivial_job(1),
                                                                                    trivial_job(2)]))]) == 0
    fake.node_ms = 600
    runner, thread = run_runner(config_path, fake)
    wait_until(lambda: any(o == [None] for o in executions(fake).values()), 10, "a prompt to run")
    holder = sqlite3.connect(tmp_path / "queue.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        wait_until(lambda: any(o == ["success"] for o in executions(fake).values()), 10, "the prompt to end")
        locked = time.monotonic()
        wait_until(lambda: time.monotonic() - locked > 1.5, 5, "the lock to have lasted")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    thread.join(30)
    assert not thread.is_alive()
    runs = executions(fake)
    assert all(outcomes == ["success"] for outcomes in runs.values()) and len(runs) == 2, runs
    assert_rode_out(caplog)
    runner.station.close()


@pytest.mark.timeout(60)
def test_an_api_started_while_postgres_is_down_waits_for_it(tmp_path: Path, own_postgres: OwnPostgres,  # noqa: F811
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Exiting instead, it would be restarted in a loop by its supervisor and answer nothing meanwhile."""
    config = api_config(tmp_path, queue_url=own_postgres.url)
    own_postgres.kill()
    caplog.set_level(logging.WARNING, logger="comfysup.api")
    back = threading.Timer(1.0, own_postgres.start)  # the outage the API starts into: a second long
    back.start()
    try:
        with running_api(config) as url:
            assert httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, timeout=30).status_code == 201
    finally:
        back.join()
    assert any("the API starts once it does" in r.getMessage() for r in caplog.records)
