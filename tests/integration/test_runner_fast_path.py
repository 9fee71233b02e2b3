"""In the runner: what a job no longer pays between two prompts, and model affinity end to end.

Each test counts what actually happened (sockets opened, GET /queue calls, transactions, model loads in
the fake), so a change that brings a cost back makes it fail; nothing here is timed.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest

from comfysup.comfy import ComfyClient, EventStream
from comfysup.queue.leases import Leases
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.attempt import Attempt
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import TRIVIAL, config_of, job_id, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=2)
    server.start()
    yield server
    server.stop()


class Counts:
    """Calls of a few methods, counted by wrapping them on their class for one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        self.monkeypatch = monkeypatch

    def watch(self, cls: type, name: str) -> None:
        original = getattr(cls, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return original(*args, **kwargs)

        self.monkeypatch.setattr(cls, name, counted)

    def __getitem__(self, name: str) -> int:
        return self.calls.get(name, 0)


@pytest.mark.timeout(60)
def test_the_next_job_is_posted_before_the_last_ones_files_are_recorded(tmp_path: Path, fake: FakeComfy,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The handoff: when a prompt succeeded and the server said its queue is empty, the next job is claimed and
    posted at once, and the finished one is downloaded and recorded while the server runs it."""
    counts = Counts(monkeypatch)
    for cls, name in ((EventStream, "connect"), (ComfyClient, "queue"), (ComfyClient, "history"),
                      (Leases, "claim"), (Leases, "complete"), (Leases, "complete_and_claim")):
        counts.watch(cls, name)
    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(n) for n in range(1, 7)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    jobs = list(queue.reads.iter_jobs())
    assert [j.state for j in jobs] == ["done"] * 6
    assert all(p["posted"] == p["executed"] == 1 for p in fake.stats()["prompts"].values())
    assert fake.stats()["order"] == [job_id(n) for n in range(1, 7)]
    for before, after in itertools.pairwise(jobs):
        assert after.attempts[0].started_at < before.finished_at  # claimed (and posted) before the last was done
        assert after.last_server == "cpu0" and after.attempts[0].prompt_number is not None
    assert counts["connect"] == 1  # one socket for all six prompts
    # Claims: the first, one handoff after each job (the sixth finds none), and the empty queue at the end;
    # the last done still tries to take a job in its own transaction.
    assert counts["claim"] == 8 and counts["complete"] == 5 and counts["complete_and_claim"] == 1
    # The server's own status broadcast said it was free: GET /queue only before the first and last claims, and
    # in the client's one look at what the server holds, before the first POST.
    assert counts["queue"] == 3
    # Never read per job: that look (its /queue and /history) found no id of these jobs, and each later POST's
    # number followed the one before (no other client posted), so no id can have run there since; never after a
    # run either: each was watched whole on the socket, its outputs in its executed messages.
    assert counts["history"] == 0
    queue.close()


@pytest.mark.timeout(60)
def test_the_next_job_is_posted_before_the_last_ones_files_are_read(tmp_path: Path, fake: FakeComfy,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """execution_success and then the end with an empty queue say the server is idle: the next prompt goes
    to it at once, and the finished one's files (round trips of an idle server) are read after."""
    calls: list[tuple[str, str]] = []
    post, download = ComfyClient.post_prompt, Attempt._download

    def post_logged(self: ComfyClient, workflow: Any, prompt_id: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(("post", prompt_id))
        return post(self, workflow, prompt_id, *args, **kwargs)

    def download_logged(self: Attempt, *args: Any) -> Any:
        calls.append(("download", self.claim.id))
        return download(self, *args)

    monkeypatch.setattr(ComfyClient, "post_prompt", post_logged)
    monkeypatch.setattr(Attempt, "_download", download_logged)
    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(n) for n in range(1, 5)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 4
    for n in range(2, 5):
        assert calls.index(("post", job_id(n))) < calls.index(("download", job_id(n - 1))), calls
    queue.close()


@pytest.mark.timeout(60)
def test_without_a_handoff_the_done_and_the_next_claim_are_one_transaction(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = Counts(monkeypatch)
    for cls, name in ((ComfyClient, "queue"), (Leases, "claim"), (Leases, "complete"),
                      (Leases, "complete_and_claim")):
        counts.watch(cls, name)
    monkeypatch.setattr(AheadJobs, "may_hand_off", lambda self, run: False)  # as when the server's queue was not empty
    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(n) for n in range(1, 7)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 6
    assert all(p["executed"] == 1 for p in fake.stats()["prompts"].values())
    assert counts["complete_and_claim"] == 6 and counts["complete"] == 0  # the sixth finds nothing left
    assert counts["claim"] == 2  # the first job, and the empty queue at the end
    # Before the first and last claims, and once in the client's look at what the server holds before the first
    # POST: no job's id was in it, and no other client posted since, so none is looked up again.
    assert counts["queue"] == 2 + 1
    queue.close()


@pytest.mark.timeout(60)
def test_a_job_posted_again_gets_a_socket_of_its_own(tmp_path: Path, fake: FakeComfy,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A job posted again must not read its first run's late messages as its own: here the post after an
    out-of-memory error, in the same attempt, as for a second attempt."""
    counts = Counts(monkeypatch)
    counts.watch(EventStream, "connect")
    fake.script_by_id({job_id(1): ["oom", "ok"]})
    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert queue.reads.get(job_id(1)).state == "done" and queue.reads.get(job_id(1)).attempt == 1
    assert queue.reads.get(job_id(2)).state == "done"
    assert counts["connect"] == 2  # the kept socket, and a new client id for the repost
    assert len(fake.stats()["frees"]) == 1
    queue.close()


def model_job(n: int, model: str) -> dict[str, Any]:
    """A trivial job whose graph runs a checkpoint loader: the fake costs load_ms when the model changes."""
    workflow = copy.deepcopy(TRIVIAL)
    workflow["4"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": model}}
    workflow["2"]["inputs"]["model_hint"] = ["4", 0]  # an input ImageInvert ignores, linking the loader in
    return {"id": job_id(n), "workflow": workflow, "set": {"1.color": n, "3.filename_prefix": f"job{n}"}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("max_wait", "loads"), [(300.0, 2), (0.0, 8)])
def test_a_runner_keeps_to_the_model_its_server_has_loaded(tmp_path: Path, fake: FakeComfy, max_wait: float,
                                                           loads: int) -> None:
    """Jobs alternating between two checkpoints: with affinity the runner runs all of one model, then the
    other (two loads); with affinity_max_wait_seconds = 0 it keeps submission order (a load per job)."""
    config = write_config(tmp_path, affinity_max_wait_seconds=max_wait)
    models = ["a.safetensors", "b.safetensors"] * 4
    queue = submit(config, [model_job(n, m) for n, m in enumerate(models, start=1)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 8
    assert len([m for m in fake.stats()["model_loads"] if m["class_type"] == "CheckpointLoaderSimple"]) == loads
    order = fake.stats()["order"]  # execution starts
    expected = [job_id(n) for n in (1, 3, 5, 7, 2, 4, 6, 8)] if max_wait else [job_id(n) for n in range(1, 9)]
    assert order == expected
    queue.close()


@pytest.mark.timeout(60)
def test_a_job_claimed_with_the_last_done_goes_back_uncounted_when_the_runner_stops(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AheadJobs, "may_hand_off", lambda self, run: False)  # the job comes with the done
    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    runner = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True))
    original = Leases.complete_and_claim

    def then_stop(self: Leases, *args: Any, **kwargs: Any) -> Any:
        claim = original(self, *args, **kwargs)
        runner.state.stopping = True  # SIGTERM right after the transaction that claimed job 2
        return claim

    monkeypatch.setattr(Leases, "complete_and_claim", then_stop)
    runner.run()
    assert queue.reads.get(job_id(1)).state == "done"
    second = queue.reads.get(job_id(2))
    assert (second.state, second.attempt) == ("queued", 0)
    assert [a.outcome for a in second.attempts] == ["released_uncounted"]
    assert job_id(2) not in fake.stats()["prompts"]  # never posted
    queue.close()


@pytest.mark.timeout(60)
def test_a_job_handed_off_before_a_stop_is_followed_to_its_end(tmp_path: Path, fake: FakeComfy,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Already on the server when the stop came: it runs within the grace like any running job, and is not
    left running there without an owner, nor put back in the queue while it runs."""
    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(n) for n in range(1, 4)])
    runner = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True))
    original = Runner._hand_off_claim

    def then_stop(self: Runner, claim: Any, outcome: Any) -> Any:
        more = original(self, claim, outcome)
        self.state.stopping = True  # SIGTERM right as the hand-off goes on to claim job 2
        return more

    monkeypatch.setattr(Runner, "_hand_off_claim", then_stop)
    runner.run()
    assert [queue.reads.get(job_id(n)).state for n in (1, 2, 3)] == ["done", "done", "queued"]
    assert fake.stats()["order"] == [job_id(1), job_id(2)]
    queue.close()


class Killed(BaseException):
    """The runner process dies here (a kill -9 in the middle of a download)."""


@pytest.mark.timeout(60)
def test_a_runner_killed_after_a_handoff_leaves_both_jobs_to_be_adopted_not_rerun(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    from comfysup.runner.store import ResultStore

    config = write_config(tmp_path, queue_ahead=False)  # the hand-off at the end
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    runner = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True))
    original = ResultStore.write

    def die(self: ResultStore, job: str, *args: Any, **kwargs: Any) -> Any:
        if job == job_id(1):
            raise Killed  # job 2 was claimed and posted a moment ago; job 1 is not recorded
        return original(self, job, *args, **kwargs)

    monkeypatch.setattr(ResultStore, "write", die)
    with pytest.raises(Killed):
        runner.run()
    assert queue.reads.get(job_id(2)).last_server == "cpu0"  # its number was recorded with the handoff
    assert sorted(queue.leases.release_owner(runner.owner, "runner process died")) == [job_id(1), job_id(2)]
    monkeypatch.setattr(ResultStore, "write", original)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    for n in (1, 2):
        job = queue.reads.get(job_id(n))
        assert (job.state, job.attempt) == ("done", 2)
        assert fake.stats()["prompts"][job_id(n)]["posted"] == fake.stats()["prompts"][job_id(n)]["executed"] == 1
    queue.close()
