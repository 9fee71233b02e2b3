"""A runner whose queue database stops answering, against fake_comfy.

The attempt cannot renew its lease any more, and when the lease runs out the job may be handed to a
runner on another machine that cannot see this server. So the attempt interrupts its prompt and ends
without writing anything, and the runner claims nothing until the database answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from comfysup.errors import DatabaseLocked, DatabaseUnavailable
from comfysup.queue.db import Role
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.attempt import Attempt
from comfysup.runner.loop import Runner, settings_from
from comfysup.runner.options import RunnerHooks, RunnerOptions
from comfysup.runner.station import Station
from comfysup.runner.store import ResultStore
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=5)
    server.start()
    yield server
    server.stop()


class FlakyQueue:
    """A real queue whose chosen methods fail like a database that went away, while ``down`` is set."""

    def __init__(self, inner: SQLiteQueue, failing: set[str], error: Exception) -> None:
        self.inner = inner
        self.failing = failing
        self.error = error
        self.down = threading.Event()
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return self._flaky(name, getattr(self.inner, name))

    def _flaky(self, name: str, attr: Any) -> Any:
        if isinstance(attr, Role):  # a role of the queue: its methods fail as the queue's own, by their names
            return SimpleNamespace(**{n: self._flaky(n, getattr(attr, n)) for n in dir(attr) if not n.startswith("_")})
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down.is_set() and name in self.failing:
                self.calls[name] = self.calls.get(name, 0) + 1
                raise self.error
            return attr(*args, **kwargs)

        return call


def executions(fake: FakeComfy, n: int) -> list[dict[str, Any]]:
    return fake.stats()["prompts"].get(job_id(n), {}).get("executions", [])


def wait_until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def attempt_in_thread(station: Station, claim: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("outcome", Attempt(station, claim).run().outcome))
    thread.start()
    return thread, result


@pytest.mark.timeout(60)
def test_a_queue_down_past_the_lease_interrupts_the_prompt_before_the_lease_ends_and_writes_nothing(
        tmp_path: Path, fake: FakeComfy) -> None:
    """Renewals are tried again while the lease holds; the prompt is interrupted before it could end (by this
    machine's clock, which stamps no later than the database), and nothing is written. (A lock and a lost server
    are one QueueUnavailable to the attempt.)"""
    error = DatabaseLocked("q.db: database is locked for more than 0.1 s")
    fake.script(["hang"])
    config = write_config(tmp_path, heartbeat_seconds=0.1, lease_seconds=1.5)
    queue = submit(config, [trivial_job(1)])
    claim = queue.leases.claim("runner-a", "cpu0", lease_seconds=1.5)
    assert claim is not None
    flaky = FlakyQueue(queue, {"heartbeat", "complete", "retry_later", "dead", "release", "cancelled"}, error)
    station = Station(settings_from(config_of(config), "cpu0", fake.url, {}), flaky,  # type: ignore[arg-type]
                      ResultStore(tmp_path / "store", 1 << 30))
    thread, result = attempt_in_thread(station, claim)
    wait_until(lambda: executions(fake, 1), 10, "the prompt to run")
    flaky.down.set()
    down_at = time.monotonic()
    lease_end = queue.reads.get(job_id(1)).lease_until  # this machine's clock: SQLite
    thread.join(20)
    assert not thread.is_alive()
    outcome = result["outcome"]
    assert (outcome.state, outcome.kind) == ("lost", "queue_unavailable")
    assert str(error) in outcome.reason
    assert executions(fake, 1)[-1]["outcome"] == "interrupted"
    assert time.time() < lease_end  # over before the lease could hand the job to another runner
    assert time.monotonic() - down_at > 0.6  # not at the first failed renewal
    assert set(flaky.calls) == {"heartbeat"} and flaky.calls["heartbeat"] >= 2  # tried again; no outcome written
    assert not any(e.prompt_id == job_id(1) for e in station.client.queue())  # gone from the server
    job = queue.reads.get(job_id(1))
    assert (job.state, job.owner, job.attempt) == ("running", "runner-a", 1)  # untouched: the lease decides
    assert job.attempts[0].ended_at is None
    station.close()


@pytest.mark.timeout(60)
def test_a_queue_down_for_less_than_a_lease_leaves_the_prompt_running(tmp_path: Path, fake: FakeComfy) -> None:
    """Every write fails for a while (renewals, progress, the outcome): the prompt runs on, the lease is renewed
    once the queue answers, and the job is done once, never interrupted."""
    error = DatabaseUnavailable("postgresql://db:5432/q: the database does not answer")
    fake.node_ms = 300  # three nodes: about a second a prompt
    config = write_config(tmp_path, heartbeat_seconds=0.1, lease_seconds=5.0)
    queue = submit(config, [trivial_job(1)])
    claim = queue.leases.claim("runner-a", "cpu0", lease_seconds=5.0)
    assert claim is not None
    every = {"heartbeat", "complete", "complete_and_claim", "retry_later", "dead", "release", "cancelled",
             "set_progress", "set_preview", "set_waiting", "record_prompt", "claim"}
    flaky = FlakyQueue(queue, every, error)
    station = Station(settings_from(config_of(config), "cpu0", fake.url, {}), flaky,  # type: ignore[arg-type]
                      ResultStore(tmp_path / "store", 1 << 30))
    thread, result = attempt_in_thread(station, claim)
    wait_until(lambda: executions(fake, 1), 10, "the prompt to run")
    flaky.down.set()
    wait_until(lambda: executions(fake, 1)[-1].get("outcome") is not None, 30, "the prompt to end")
    wait_until(lambda: flaky.calls.get("complete", 0) + flaky.calls.get("complete_and_claim", 0) >= 1, 30,
               "its outcome to be tried")
    assert flaky.calls.get("heartbeat", 0) >= 1 and thread.is_alive()
    flaky.down.clear()
    thread.join(20)
    outcome = result["outcome"]
    assert (outcome.state, outcome.kind) == ("done", "done")
    assert [e["outcome"] for e in executions(fake, 1)] == ["success"]  # once, never interrupted
    job = queue.reads.get(job_id(1))
    assert (job.state, job.attempt) == ("done", 1)
    station.close()


@pytest.mark.timeout(60)
def test_a_prompt_posted_when_the_queue_stops_answering_is_interrupted(tmp_path: Path, fake: FakeComfy) -> None:
    """record_prompt fails right after POST /prompt: the prompt must not run on unattended."""
    fake.script(["hang"])
    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1)])
    claim = queue.leases.claim("runner-a", "cpu0", lease_seconds=30)
    assert claim is not None
    flaky = FlakyQueue(queue, {"record_prompt"}, DatabaseUnavailable("postgresql://db:5432/q: gone"))
    flaky.down.set()
    station = Station(settings_from(config_of(config), "cpu0", fake.url, {}), flaky,  # type: ignore[arg-type]
                      ResultStore(tmp_path / "store", 1 << 30))
    outcome = Attempt(station, claim).run().outcome
    assert (outcome.state, outcome.kind) == ("lost", "queue_unavailable")
    assert fake.stats()["prompts"][job_id(1)]["posted"] == 1
    wait_until(lambda: not any(e.prompt_id == job_id(1) for e in station.client.queue()), 10,
               "the prompt to leave the server's queue")
    assert fake.stats()["interrupts"]  # POST /interrupt for this prompt was sent
    assert all(e["outcome"] != "success" for e in executions(fake, 1))
    assert queue.reads.get(job_id(1)).attempts[0].prompt_number is None
    station.close()


@pytest.mark.timeout(60)
def test_the_runner_claims_nothing_while_the_queue_is_down_and_resumes_after(
        tmp_path: Path, fake: FakeComfy, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    flaky = FlakyQueue(queue, {"claim", "active_count", "maintenance"},
                       DatabaseUnavailable("postgresql://db:5432/q: the database does not answer"))
    flaky.down.set()
    caplog.set_level(logging.INFO, logger="comfysup.runner")
    runner = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True), queue=flaky)  # type: ignore[arg-type]
    thread = threading.Thread(target=runner.run)
    thread.start()
    wait_until(lambda: flaky.calls.get("claim", 0) >= 2, 10, "the runner to try claiming twice")
    assert thread.is_alive()  # it did not crash
    assert flaky.calls["claim"] <= 4  # about once a second, not a hot loop
    assert fake.stats()["prompts"] == {}
    flaky.down.clear()
    thread.join(30)
    assert not thread.is_alive()
    assert [queue.reads.get(job_id(n)).state for n in (1, 2)] == ["done", "done"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("the queue does not answer" in m for m in messages) == 1  # said once
    assert any("the queue answers again" in m for m in messages)


@pytest.mark.timeout(30)
def test_a_runner_started_while_the_database_is_down_waits_for_it(tmp_path: Path, fake: FakeComfy,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Crashing instead would be restarted in a loop until the supervisor marked the slot failed."""
    from comfysup.runner import loop

    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1)])
    tries: list[float] = []
    real_open = loop.open_queue

    def open_queue(cfg: Any, create: bool = True, **kwargs: Any) -> Any:
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise DatabaseUnavailable("postgresql://db:5432/q: cannot connect: connection refused")
        return real_open(cfg, create=create, **kwargs)

    monkeypatch.setattr(loop, "open_queue", open_queue)
    alive: list[float] = []
    runner = Runner(config_of(config), "cpu0", fake.url,
                    RunnerOptions(until_empty=True), RunnerHooks(on_alive=lambda: alive.append(1)))
    assert len(tries) == 3 and tries[2] - tries[0] >= 1.5  # retried about once a second
    assert len(alive) >= 2  # and told the supervisor it is alive meanwhile
    runner.run()
    assert queue.reads.get(job_id(1)).state == "done"
