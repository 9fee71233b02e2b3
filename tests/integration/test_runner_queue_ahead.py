"""Issue 19: a runner keeps one more job waiting in its server's queue behind the running prompt.

What must still hold: one at most per server, the queued job's timeout counts from its start, a cancel or a
graceful stop takes it out of the server's queue, a crash leaves it to be followed, priority picks it when it
is posted, other clients' prompts are respected, and [runner] queue_ahead = false turns it off.
"""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from comfysup.runner.attempt import Attempt
from comfysup.runner.client import ComfyClient
from comfysup.runner.loop import Runner
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=30)
    server.start()
    yield server
    server.stop()


def _runs(fake: FakeComfy, n: int) -> dict[str, Any]:
    record = fake.stats()["prompts"][job_id(n)]
    assert record["posted"] == 1 and record["executed"] == 1, record
    return {"posted": record["posts"][0]["at"], **record["executions"][0]}


def _assert_one_at_a_time(fake: FakeComfy, ns: range) -> None:
    runs = sorted((_runs(fake, n) for n in ns), key=lambda r: r["started_at"])
    for before, after in itertools.pairwise(runs):
        assert before["ended_at"] <= after["started_at"]  # never two executions at once


@pytest.mark.timeout(60)
def test_the_next_job_waits_in_the_servers_queue_behind_the_running_one(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(n) for n in range(1, 6)])
    Runner(config_of(config), "cpu0", fake.url, until_empty=True).run()
    assert [j.state for j in queue.iter_jobs()] == ["done"] * 5
    assert fake.stats()["order"] == [job_id(n) for n in range(1, 6)]
    for n in range(2, 6):
        last, this = _runs(fake, n - 1), _runs(fake, n)
        assert this["posted"] < last["ended_at"]  # waiting in ComfyUI before the last one ended
        if n > 2:  # the bound: posted only once the one before it executes, so never two of ours waiting
            assert this["posted"] >= last["started_at"]
        assert queue.get(job_id(n)).last_server == "cpu0"  # recorded where it waits (for catch-up)
    _assert_one_at_a_time(fake, range(1, 6))
    queue.close()


@pytest.mark.timeout(60)
def test_off_the_next_job_is_posted_only_when_the_server_is_free(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path, queue_ahead=False)
    queue = submit(config, [trivial_job(n) for n in range(1, 4)])
    Runner(config_of(config), "cpu0", fake.url, until_empty=True).run()
    assert [j.state for j in queue.iter_jobs()] == ["done"] * 3
    for n in (2, 3):
        assert _runs(fake, n)["posted"] >= _runs(fake, n - 1)["ended_at"]
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_jobs_timeout_starts_when_it_starts_executing(tmp_path: Path, fake: FakeComfy) -> None:
    fake.node_ms = 300  # about 0.9 s a prompt: the second waits that long in the queue, then runs as long
    config = write_config(tmp_path, timeout_seconds=1.5, attempts=1, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    Runner(config_of(config), "cpu0", fake.url, until_empty=True).run()
    assert [queue.get(job_id(n)).state for n in (1, 2)] == ["done", "done"]
    second = _runs(fake, 2)
    assert second["ended_at"] - second["posted"] > 1.5  # it would have timed out counted from its POST
    queue.close()


@pytest.mark.timeout(60)
def test_priority_chooses_the_queued_job_when_it_is_posted(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1, priority=10), trivial_job(2), trivial_job(3, priority=5)])
    Runner(config_of(config), "cpu0", fake.url, until_empty=True).run()
    assert fake.stats()["order"] == [job_id(1), job_id(3), job_id(2)]
    assert _runs(fake, 3)["posted"] < _runs(fake, 1)["ended_at"]
    queue.close()


def _when_queued(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Call ``act`` once a job has been posted behind the running one."""
    original = Attempt._hand_off

    def hand_off(self: Attempt, run: Any = None) -> None:
        original(self, run)
        if run is not None and self.posted_out is not None:
            act(self)

    monkeypatch.setattr(Attempt, "_hand_off", hand_off)


@pytest.mark.timeout(60)
def test_a_cancel_takes_the_queued_job_out_of_the_servers_queue(tmp_path: Path, fake: FakeComfy,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fake.node_ms = 300
    config = write_config(tmp_path, heartbeat_seconds=0.2, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    _when_queued(monkeypatch, lambda attempt: attempt.queue.cancel([job_id(2)]))
    Runner(config_of(config), "cpu0", fake.url, until_empty=True).run()
    assert queue.get(job_id(1)).state == "done"
    assert queue.get(job_id(2)).state == "cancelled"
    stats = fake.stats()
    assert stats["prompts"][job_id(2)]["executed"] == 0
    assert any(d["prompt_id"] == job_id(2) and d["removed"] for d in stats["queue_deletes"])
    queue.close()


@pytest.mark.timeout(60)
def test_a_graceful_stop_releases_the_queued_job_uncounted(tmp_path: Path, fake: FakeComfy,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake.node_ms = 300
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    runner = Runner(config_of(config), "cpu0", fake.url)
    _when_queued(monkeypatch, lambda attempt: runner._on_signal(signal.SIGTERM, None))
    runner.run()
    assert queue.get(job_id(1)).state == "done"  # the running one had its grace
    second = queue.get(job_id(2))
    assert (second.state, second.attempt) == ("queued", 0), second
    stats = fake.stats()
    assert stats["prompts"][job_id(2)]["executed"] == 0
    assert any(d["prompt_id"] == job_id(2) and d["removed"] for d in stats["queue_deletes"])
    queue.close()


class Killed(BaseException):
    """The runner process dies here."""


@pytest.mark.timeout(60)
def test_after_a_crash_the_queued_job_is_followed_where_it_is_not_posted_again(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.node_ms = 300
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    runner = Runner(config_of(config), "cpu0", fake.url)

    def die(attempt: Attempt) -> None:
        raise Killed  # job 2 waits in the server's queue, job 1 runs

    _when_queued(monkeypatch, die)
    with pytest.raises(Killed):
        runner.run()
    monkeypatch.undo()
    assert sorted(queue.release_owner(runner.owner, "runner process died", count_attempt=False)) == \
        [job_id(1), job_id(2)]
    Runner(config_of(config), "cpu0", fake.url, until_empty=True).run()
    for n in (1, 2):
        job = queue.get(job_id(n))
        assert job.state == "done", job
    _assert_one_at_a_time(fake, range(1, 3))  # each posted once, executed once
    queue.close()


@pytest.mark.timeout(60)
def test_other_clients_prompts_are_respected(tmp_path: Path, fake: FakeComfy) -> None:
    fake.node_ms = 100
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    runner = Runner(config_of(config), "cpu0", fake.url)
    claim = queue.claim(runner.owner, "cpu0", 10.0)
    assert claim is not None
    assert runner._ahead_job(claim, 1) is not None  # the running prompt alone: free
    client = ComfyClient(fake.url)
    other = trivial_job(7)
    client.post_prompt(other["workflow"], other["id"], "someone-else")
    client.post_prompt(trivial_job(8)["workflow"], job_id(8), "someone-else")
    time.sleep(0.05)
    assert runner._ahead_job(claim, None) is None  # one of theirs waits: max_queue 1 says no
    (tmp_path / "wide").mkdir()
    wide_config = config_of(write_config(tmp_path / "wide", max_queue=3, queue_ahead=True))
    wide = Runner(wide_config, "cpu0", fake.url, queue=queue)
    assert wide._ahead_job(claim, None) is not None
    client.post_prompt(trivial_job(9)["workflow"], job_id(9), runner.station.client.own_stream().client_id)
    assert wide._ahead_job(claim, None) is None  # one of ours already waits: the bound is one
    runner.station.close()
    wide.station.close()
    queue.close()
