"""A runner keeps one more job waiting in its server's queue behind the running prompt.

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

from comfysup.comfy import ComfyClient, ServerUnavailable
from comfysup.queue.leases import Leases
from comfysup.runner import ahead as ahead_module
from comfysup.runner import attempt as attempt_module
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.attempt import Attempt
from comfysup.runner.interrupt import Interrupter
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerHooks, RunnerOptions
from comfysup.runner.stuck import StuckChannel
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config
from tests.supervisor_support import wait_for

pytestmark = pytest.mark.usefixtures("comfyui_version")


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=30)
    server.start()
    yield server
    server.stop()


WINDOW_NODE_MS = 150
"""Where a test asserts that the next job was posted while the running one executed: that execution is the
window its claim (a durable commit) and its POST have, long enough at 150 ms a node for a loaded machine's
fsyncs."""


def _runs(fake: FakeComfy, n: int) -> dict[str, Any]:
    record = fake.stats()["prompts"][job_id(n)]
    assert record["posted"] == 1 and record["executed"] == 1, record
    return {"posted": record["posts"][0]["at"], **record["executions"][0]}


def _assert_one_at_a_time(fake: FakeComfy, ns: range) -> None:
    runs = sorted((_runs(fake, n) for n in ns), key=lambda r: r["started_at"])
    for before, after in itertools.pairwise(runs):
        assert before["ended_at"] <= after["started_at"]  # never two executions at once


def _two_jobs(tmp_path: Path, fake: FakeComfy, **runner: Any) -> tuple[Path, Any]:
    """Jobs 1 and 2 with queue_ahead on, on a fake whose prompts take about 0.9 s: job 2 waits that long."""
    fake.node_ms = 300
    config = write_config(tmp_path, queue_ahead=True, **runner)
    return config, submit(config, [trivial_job(1), trivial_job(2)])


def _assert_taken_out(fake: FakeComfy, prompt_id: str) -> None:
    """The prompt never ran: it was deleted from the server's queue while it waited."""
    stats = fake.stats()
    assert stats["prompts"][prompt_id]["executed"] == 0
    assert any(d["prompt_id"] == prompt_id and d["removed"] for d in stats["queue_deletes"])


def _server_dies(fake: FakeComfy) -> None:
    """The server dies and is restarted empty, as a supervisor restarts it."""
    fake.crash()
    wait_for(lambda: not fake.running, 5, "the server to die")
    fake.start()


@pytest.mark.timeout(60)
def test_the_next_job_waits_in_the_servers_queue_behind_the_running_one(tmp_path: Path, fake: FakeComfy) -> None:
    fake.node_ms = WINDOW_NODE_MS
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(n) for n in range(1, 6)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 5
    assert fake.stats()["order"] == [job_id(n) for n in range(1, 6)]
    for n in range(2, 6):
        last, this = _runs(fake, n - 1), _runs(fake, n)
        assert this["posted"] < last["ended_at"]  # waiting in ComfyUI before the last one ended
        if n > 2:  # the bound: posted only once the one before it executes, so never two of ours waiting
            assert this["posted"] >= last["started_at"]
        assert queue.reads.get(job_id(n)).last_server == "cpu0"  # recorded where it waits (for catch-up)
    _assert_one_at_a_time(fake, range(1, 6))
    queue.close()


@pytest.mark.timeout(60)
def test_off_the_next_job_is_posted_only_when_the_server_is_free(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path, queue_ahead=False)
    queue = submit(config, [trivial_job(n) for n in range(1, 4)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 3
    for n in (2, 3):
        assert _runs(fake, n)["posted"] >= _runs(fake, n - 1)["ended_at"]
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_jobs_timeout_starts_when_it_starts_executing(tmp_path: Path, fake: FakeComfy) -> None:
    # About 0.9 s a prompt: the second waits that long in the queue, then runs as long.
    config, queue = _two_jobs(tmp_path, fake, timeout_seconds=1.5, attempts=1)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [queue.reads.get(job_id(n)).state for n in (1, 2)] == ["done", "done"]
    second = _runs(fake, 2)
    assert second["ended_at"] - second["posted"] > 1.5  # it would have timed out counted from its POST
    queue.close()


@pytest.mark.timeout(60)
def test_priority_chooses_the_queued_job_when_it_is_posted(tmp_path: Path, fake: FakeComfy) -> None:
    fake.node_ms = WINDOW_NODE_MS
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1, priority=10), trivial_job(2), trivial_job(3, priority=5)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert fake.stats()["order"] == [job_id(1), job_id(3), job_id(2)]
    assert _runs(fake, 3)["posted"] < _runs(fake, 1)["ended_at"]
    queue.close()


def _when_queued(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Call ``act`` (given the attempt's Context) once a job has been posted behind the running one."""
    original = AheadJobs._take

    def take(self: AheadJobs, args: Any, behind: str | None) -> None:
        original(self, args, behind)
        if behind is not None and self.next_posted is not None:
            act(self.ctx)  # what the attempt's steps read: its queue, claim, client

    monkeypatch.setattr(AheadJobs, "_take", take)


@pytest.mark.timeout(60)
def test_a_cancel_takes_the_queued_job_out_of_the_servers_queue(tmp_path: Path, fake: FakeComfy,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config, queue = _two_jobs(tmp_path, fake, heartbeat_seconds=0.2)
    _when_queued(monkeypatch, lambda attempt: attempt.queue.intake.cancel([job_id(2)]))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert queue.reads.get(job_id(1)).state == "done"
    assert queue.reads.get(job_id(2)).state == "cancelled"
    _assert_taken_out(fake, job_id(2))
    queue.close()


@pytest.mark.timeout(60)
def test_a_graceful_stop_releases_the_queued_job_uncounted(tmp_path: Path, fake: FakeComfy,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    config, queue = _two_jobs(tmp_path, fake)
    runner = Runner(config_of(config), "cpu0", fake.url)
    _when_queued(monkeypatch, lambda attempt: runner._on_signal(signal.SIGTERM, None))
    runner.run()
    assert queue.reads.get(job_id(1)).state == "done"  # the running one had its grace
    second = queue.reads.get(job_id(2))
    assert (second.state, second.attempt) == ("queued", 0), second
    _assert_taken_out(fake, job_id(2))
    queue.close()


@pytest.mark.timeout(60)
def test_a_graceful_stop_takes_out_a_queued_job_whose_posts_answer_was_lost(tmp_path: Path, fake: FakeComfy,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Job 2's POST reached the server, which queued it, but its answer was lost (a timeout, a reset): the stop must
    still take it out of the server's queue before releasing it as never run; left there it ran after the stop, its
    record saying it never had, and ran again at the next start."""
    config, queue = _two_jobs(tmp_path, fake)
    post = ComfyClient.post_prompt

    def post_answer_lost(self: ComfyClient, workflow: Any, prompt_id: str, *args: Any, **kwargs: Any) -> Any:
        number = post(self, workflow, prompt_id, *args, **kwargs)
        if prompt_id == job_id(2):
            raise ServerUnavailable("POST /prompt: the answer was lost", "connection")
        return number

    monkeypatch.setattr(ComfyClient, "post_prompt", post_answer_lost)
    runner = Runner(config_of(config), "cpu0", fake.url)
    _when_queued(monkeypatch, lambda attempt: runner._on_signal(signal.SIGTERM, None))
    runner.run()
    monkeypatch.undo()
    assert queue.reads.get(job_id(1)).state == "done"
    second = queue.reads.get(job_id(2))
    assert (second.state, second.attempt) == ("queued", 0), second
    _assert_taken_out(fake, job_id(2))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert queue.reads.get(job_id(2)).state == "done"
    assert fake.stats()["prompts"][job_id(2)]["executed"] == 1, "ran after the stop, and again"
    queue.close()


class Killed(BaseException):
    """The runner process dies here."""


@pytest.mark.timeout(60)
def test_after_a_crash_the_queued_job_is_followed_where_it_is_not_posted_again(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    config, queue = _two_jobs(tmp_path, fake)
    runner = Runner(config_of(config), "cpu0", fake.url)

    def die(attempt: Any) -> None:
        raise Killed  # job 2 waits in the server's queue, job 1 runs

    _when_queued(monkeypatch, die)
    with pytest.raises(Killed):
        runner.run()
    monkeypatch.undo()
    assert sorted(queue.leases.release_owner(runner.owner, "runner process died", count_attempt=False)) == \
        [job_id(1), job_id(2)]
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    for n in (1, 2):
        job = queue.reads.get(job_id(n))
        assert job.state == "done", job
    _assert_one_at_a_time(fake, range(1, 3))  # each posted once, executed once
    queue.close()


@pytest.mark.timeout(60)
def test_other_clients_prompts_are_respected(tmp_path: Path, fake: FakeComfy) -> None:
    fake.node_ms = 100
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    runner = Runner(config_of(config), "cpu0", fake.url)
    claim = queue.leases.claim(runner.owner, "cpu0", 10.0)
    assert claim is not None
    assert runner._queue_ahead_claim(claim, 1) is not None  # the running prompt alone: free
    client = ComfyClient(fake.url)
    other = trivial_job(7)
    client.post_prompt(other["workflow"], other["id"], "someone-else")
    client.post_prompt(trivial_job(8)["workflow"], job_id(8), "someone-else")
    time.sleep(0.05)
    assert runner._queue_ahead_claim(claim, None) is None  # one of theirs waits: max_queue 1 says no
    (tmp_path / "wide").mkdir()
    wide_config = config_of(write_config(tmp_path / "wide", max_queue=3, queue_ahead=True))
    wide = Runner(wide_config, "cpu0", fake.url, queue=queue)
    assert wide._queue_ahead_claim(claim, None) is not None
    client.post_prompt(trivial_job(9)["workflow"], job_id(9), runner.station.client.own_stream().client_id)
    assert wide._queue_ahead_claim(claim, None) is None  # one of ours already waits: the bound is one
    runner.station.close()
    wide.station.close()
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_job_destroyed_by_a_server_death_before_it_started_is_not_counted(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    config, queue = _two_jobs(tmp_path, fake)

    # Job 2 waits behind job 1, which executes: the server dies.
    _when_queued(monkeypatch, lambda attempt: _server_dies(fake))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    first, second = queue.reads.get(job_id(1)), queue.reads.get(job_id(2))
    assert (first.state, first.attempt) == ("done", 2)  # it executed: its destroyed run is counted
    assert first.attempts[0].kind == "server_died"
    assert (second.state, second.attempt) == ("done", 1), second  # it never started: not counted
    assert (second.attempts[0].outcome, second.attempts[0].kind) == ("released_uncounted", "server_died")
    assert "before this one started" in (second.attempts[0].reason or "")
    assert fake.stats()["prompts"][job_id(2)]["executed"] == 1
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_job_whose_start_may_have_been_missed_is_counted(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run ahead of it ended (its end was read) before the server died: the queued one may have started,
    so its loss is counted as the running one's is."""
    config, queue = _two_jobs(tmp_path, fake, attempts=3)
    original = attempt_module.record

    def record(ctx: Any, outcome: Any, ahead: AheadJobs, redact: Any) -> None:  # job 1 ended, job 2 runs: the
        if ctx.claim.id == job_id(1) and ahead.next_posted is not None:  # server dies now
            _server_dies(fake)
        original(ctx, outcome, ahead, redact)

    monkeypatch.setattr(attempt_module, "record", record)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    second = queue.reads.get(job_id(2))
    assert (second.state, second.attempt) == ("done", 2), second
    assert (second.attempts[0].outcome, second.attempts[0].kind) == ("retry", "server_died")
    queue.close()


@pytest.mark.timeout(60)
def test_a_stop_after_the_running_job_ended_gives_the_queued_one_its_grace(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the job ahead has ended on the server, the queued one may be executing (its start not read yet,
    while the first is downloaded): it is treated as a running job, followed through the grace, not
    interrupted at once. A third one, queued behind it, never ran: out of the server's queue, uncounted."""
    fake.node_ms = 200
    config = write_config(tmp_path, queue_ahead=True, grace_seconds=20.0)
    queue = submit(config, [trivial_job(1), trivial_job(2), trivial_job(3)])
    runner = Runner(config_of(config), "cpu0", fake.url)
    original = Attempt._download

    def download(self: Attempt, run: Any, entry: Any) -> Any:
        if self.claim.id == job_id(1):
            assert self.ahead.next_posted is not None and self.ahead.next_posted.claim.id == job_id(2)
            runner._on_signal(signal.SIGTERM, None)
        return original(self, run, entry)

    monkeypatch.setattr(Attempt, "_download", download)
    runner.run()
    assert [queue.reads.get(job_id(n)).state for n in (1, 2)] == ["done", "done"]
    stats = fake.stats()
    assert stats["prompts"][job_id(2)]["executed"] == 1
    assert not [i for i in stats["interrupts"] if i["prompt_id"] == job_id(2)]
    third = queue.reads.get(job_id(3))
    assert (third.state, third.attempt) == ("queued", 0), third
    assert stats["prompts"].get(job_id(3), {"executed": 0})["executed"] == 0
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_jobs_end_read_before_its_attempt_began_is_not_thrown_away(tmp_path: Path, fake: FakeComfy) -> None:
    """Short prompts end while the job before them is still recorded: their attempt begins with their whole run
    in the socket, and queueing the next job behind them must not empty it (left to the next /history poll, 30 s
    away here, each would pass its 10 s timeout)."""
    fake.node_ms = 1
    config = write_config(tmp_path, queue_ahead=True, poll_seconds=30.0, timeout_seconds=10.0, attempts=1)
    queue = submit(config, [trivial_job(n) for n in range(1, 7)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 6
    queue.close()


@pytest.mark.timeout(60)
def test_the_job_after_next_is_claimed_with_this_ones_done_and_posted_while_the_next_runs(
        tmp_path: Path, fake: FakeComfy) -> None:
    """Once a run ends and the job queued behind it starts, the attempt that followed it claims one more in the
    transaction of its done (one durable write a job: the claim made at the done's time) and posts it behind the
    running one as soon as that committed, so the server still finds it waiting when the running one ends."""
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(n) for n in range(1, 7)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 6
    together = [n for n in range(1, 5)
                if queue.reads.get(job_id(n + 2)).attempts[0].started_at == queue.reads.get(job_id(n)).finished_at]
    assert together, "job n+2 was never claimed in job n's done"  # the attempt of n+1 would claim it later
    for n in together:
        finished = queue.reads.get(job_id(n)).finished_at or 0
        assert _runs(fake, n + 2)["posted"] >= finished  # posted once its claim was durable, with the done
    for n in range(3, 7):  # and still the bound: posted only once the one before it executes
        assert _runs(fake, n)["posted"] >= _runs(fake, n - 1)["started_at"]
    _assert_one_at_a_time(fake, range(1, 7))
    queue.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fresh_seconds", [0.5, 0.0])
def test_a_claim_made_by_the_attempt_before_is_the_fence_of_the_download(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch, fresh_seconds: float) -> None:
    """Job n's lease was written by its claim, in the done of the attempt two before it (or as it was queued
    ahead): job n's download takes that as its fence instead of a heartbeat of its own (no transaction a job for
    it). A claim older than FRESH_RENEWAL_SECONDS (0 here: every one) is not taken: each download renews."""
    monkeypatch.setattr(ahead_module, "FRESH_RENEWAL_SECONDS", fresh_seconds)
    renewed: list[str] = []
    heartbeat = Leases.heartbeat

    def counted(self: Leases, claim: Any, *args: Any, **kwargs: Any) -> Any:
        renewed.append(claim.id)
        return heartbeat(self, claim, *args, **kwargs)

    monkeypatch.setattr(Leases, "heartbeat", counted)
    config = write_config(tmp_path, queue_ahead=True, heartbeat_seconds=4.0)  # fresh: within min(0.5 s, 4 s / 4)
    queue = submit(config, [trivial_job(n) for n in range(1, 7)])
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 6
    own = [n for n in range(1, 7) if job_id(n) in renewed]
    if fresh_seconds:
        assert len(own) <= 3, f"jobs {own} renewed with a heartbeat of their own before their download"
    else:
        assert own == list(range(1, 7))
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_job_goes_back_to_a_runner_that_waits_for_work(tmp_path: Path, fake: FakeComfy,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Another server comes up (or finishes its last job) while a job waits here behind a running prompt: the
    job goes back to the queue, uncounted, for that server's runner, instead of waiting a whole prompt."""
    config, queue = _two_jobs(tmp_path, fake)
    peer = {"waiting": False}
    _when_queued(monkeypatch, lambda attempt: peer.update(waiting=True))

    def first_done(claim: Any, outcome: Any) -> None:
        if outcome is not None:
            runner.state.stopping = True  # the peer takes job 2: this runner stops after job 1

    runner = Runner(config_of(config), "cpu0", fake.url,
                    hooks=RunnerHooks(peer_waiting=lambda: peer["waiting"], on_job=first_done))
    runner.run()
    assert queue.reads.get(job_id(1)).state == "done"
    second = queue.reads.get(job_id(2))
    assert (second.state, second.attempt) == ("queued", 0), second
    assert (second.attempts[0].outcome, second.attempts[0].kind) == ("released_uncounted", "withdrawn")
    assert "another runner waiting for work" in (second.attempts[0].reason or "")
    _assert_taken_out(fake, job_id(2))
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_job_that_started_unseen_is_never_taken_back(tmp_path: Path, fake: FakeComfy,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The run ahead of it ended and it started while the end was still unread in the socket: a runner waiting
    for work must not get it back (it would be interrupted and run twice); the server's own /queue and
    /history say it ran, so it stays this runner's next job."""
    config, queue = _two_jobs(tmp_path, fake)
    peer = {"waiting": False}
    runner = Runner(config_of(config), "cpu0", fake.url,
                    RunnerOptions(until_empty=True), RunnerHooks(peer_waiting=lambda: peer["waiting"]))
    client = ComfyClient(fake.url)

    def once_it_runs(attempt: Any) -> None:
        wait_for(lambda: any(e.prompt_id == job_id(2) and e.running for e in client.queue()), 10, "job 2 to run")
        peer["waiting"] = True  # job 1's end is in the socket, unread

    _when_queued(monkeypatch, once_it_runs)
    runner.run()
    assert [queue.reads.get(job_id(n)).state for n in (1, 2)] == ["done", "done"]
    assert queue.reads.get(job_id(2)).attempt == 1 and len(queue.reads.get(job_id(2)).attempts) == 1
    stats = fake.stats()
    assert stats["prompts"][job_id(2)]["executed"] == 1
    assert not [i for i in stats["interrupts"] if i["prompt_id"] == job_id(2)]
    client.close()
    queue.close()


@pytest.mark.timeout(60)
def test_cancelling_the_next_job_keeps_the_one_queued_behind_it(tmp_path: Path, fake: FakeComfy,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Job 1 ended, job 2 runs, job 3 waits behind it (claimed with job 1's done), and then job 2 is cancelled:
    job 3's prompt is still in the server's queue, so it becomes this runner's next job, renewed and followed
    there; never left unowned (its lease would lapse and another attempt post it again)."""
    fake.node_ms = 150
    config = write_config(tmp_path, queue_ahead=True, heartbeat_seconds=0.2, lease_seconds=3.0)
    queue = submit(config, [trivial_job(n) for n in range(1, 4)])  # none left to claim when job 1 is recorded
    cancelled: list[str] = []
    original = AheadJobs.post_behind_next

    def post_behind_next(self: AheadJobs) -> None:
        original(self)
        if len(self.jobs) == 2 and not cancelled:
            cancelled.append(self.jobs[0].claim.id)
            queue.intake.cancel([self.jobs[0].claim.id])  # a user's cancel of the running job 2,
            self.renew(self.ctx.clock() + self.ctx.s.heartbeat_seconds)  # seen at its next heartbeat, now

    monkeypatch.setattr(AheadJobs, "post_behind_next", post_behind_next)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert cancelled, "no job was ever queued behind the next one"
    states = {j.id: j.state for j in queue.reads.iter_jobs()}
    assert states.pop(cancelled[0]) == "cancelled" and set(states.values()) == {"done"}, states
    for job in states:  # each done job ran once on the server, posted once
        record = fake.stats()["prompts"][job]
        assert (record["posted"], record["executed"]) == (1, 1), (job, record)
    assert all(len(queue.reads.get(j).attempts) == 1 for j in states)
    queue.close()


@pytest.mark.timeout(60)
def test_while_a_stuck_prompt_is_waited_out_the_job_queued_behind_it_keeps_its_lease(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for an interrupted prompt to leave the queue lasts up to leave_queue_seconds (60 s by default, as
    long as a lease): the job queued behind it is renewed meanwhile, so no other runner takes it as expired (its
    attempt counted) before it is released, uncounted, at the stuck prompt's report."""
    fake.script_by_id({job_id(1): ["hostile:run:ignore-interrupt", "ok"]})
    config, queue = _two_jobs(tmp_path, fake, timeout_seconds=1.0, leave_queue_seconds=1.5, heartbeat_seconds=0.2,
                              lease_seconds=3.0)
    renewed_while_waiting: list[str] = []
    waiting = {"now": False}
    interrupt_now, heartbeat = Interrupter._interrupt_now, Leases.heartbeat

    def interrupt_watched(self: Interrupter, *args: Any) -> Any:
        waiting["now"] = True
        try:
            return interrupt_now(self, *args)
        finally:
            waiting["now"] = False

    def heartbeat_watched(self: Leases, claim: Any, *args: Any, **kwargs: Any) -> Any:
        if waiting["now"]:
            renewed_while_waiting.append(claim.id)
        return heartbeat(self, claim, *args, **kwargs)

    monkeypatch.setattr(Interrupter, "_interrupt_now", interrupt_watched)
    monkeypatch.setattr(Leases, "heartbeat", heartbeat_watched)
    # The supervisor's part: the stuck server is restarted (here at once), and with it the stuck prompt is gone.
    stuck = StuckChannel(restarts=True, report=lambda prompt_id: _server_dies(fake) if prompt_id else None)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True), RunnerHooks(stuck=stuck)).run()
    assert renewed_while_waiting.count(job_id(2)) >= 3, renewed_while_waiting  # 1.5 s of wait, every 0.2 s
    first, second = queue.reads.get(job_id(1)), queue.reads.get(job_id(2))
    assert (first.state, first.attempt, first.attempts[0].kind) == ("done", 2, "stuck"), first.attempts
    told = [(a.attempt, a.outcome, a.kind, a.reason, a.started_at, a.ended_at) for a in second.attempts]
    assert (second.state, second.attempt) == ("done", 1), told  # released uncounted, then run once
    assert [a.outcome for a in second.attempts] == ["released_uncounted", "done"], told
    queue.close()


@pytest.mark.timeout(60)
def test_a_queued_job_whose_start_was_read_before_a_reconnect_is_judged_by_its_history(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job 1's attempt read job 2's execution_start (job 2 runs now), then the kept socket dropped: the messages sent
    before job 2's attempt reconnects are lost, so its run was not watched whole and /history says how it went,
    whatever its end on the new connection says."""
    config, queue = _two_jobs(tmp_path, fake, poll_seconds=30.0)  # no /history poll while a run goes on
    ask = AheadJobs.ask_behind_next

    def read_then_drop(self: AheadJobs, run: Any, read_buffered: Any) -> None:
        ask(self, run, read_buffered)  # at job 1's done: what the socket holds is read
        if self.ctx.claim.id == job_id(1):
            assert self.next_posted is not None and self.next_posted.started  # job 2's start was read here
            self.ctx.client.stream.close()  # the socket drops; job 2's attempt connects again

    read: list[str] = []
    history = ComfyClient.history

    def history_logged(self: ComfyClient, prompt_id: str, *args: Any, **kwargs: Any) -> Any:
        read.append(prompt_id)
        return history(self, prompt_id, *args, **kwargs)

    monkeypatch.setattr(AheadJobs, "ask_behind_next", read_then_drop)
    monkeypatch.setattr(ComfyClient, "history", history_logged)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [(j.state, j.attempt) for j in queue.reads.iter_jobs()] == [("done", 1), ("done", 1)]
    # No id is looked up before its POST (the client's one look at the server found neither, and nobody else posted
    # there); job 1, watched whole, is judged by its messages; job 2's run by its entry, read after the reconnect.
    assert (read.count(job_id(1)), read.count(job_id(2))) == (0, 1), read
    _assert_one_at_a_time(fake, range(1, 3))
    queue.close()
