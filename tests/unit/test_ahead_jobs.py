"""The jobs an attempt takes ahead (comfysup.runner.ahead): one ordered list of Ahead entries, each with its phase,
against a recording queue and server; no socket, no database."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from comfysup.errors import LeaseLost
from comfysup.queue.base import Claim
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.machine import Limits, Message
from comfysup.runner.result import Ahead, AheadAsks, AheadPhase, AttemptResult, ClaimArgs, Ending, Outcome
from comfysup.runner.running import Context, Run


def claim(n: int, **kw: Any) -> Claim:
    return Claim(id=f"job-{n}", attempt=1, owner="runner", server="gpu0", workflow={}, extra_data={},
                 lease_until=0.0, **kw)


class Queue:
    """The lease role the jobs taken ahead write through (``queue.leases``): records every write, hands out the
    claims it is given, in order."""

    def __init__(self, *claims: Claim) -> None:
        self.claims = list(claims)
        self.calls: list[tuple[Any, ...]] = []
        self.lost: set[str] = set()
        self.cancel: set[str] = set()

    @property
    def leases(self) -> Queue:
        """The queue's lease role, which the attempt writes through: this fake is its own."""
        return self

    def claim(self, *args: Any, **kwargs: Any) -> Claim | None:
        return self.claims.pop(0) if self.claims else None

    def record_prompt(self, c: Claim, server: str, number: int, url: str, *, waiting: bool) -> None:
        self.calls.append(("record_prompt", c.id, number, waiting))
        if c.id in self.lost:
            raise LeaseLost(c.id)

    def heartbeat(self, c: Claim, lease_seconds: float) -> bool:
        self.calls.append(("heartbeat", c.id))
        if c.id in self.lost:
            raise LeaseLost(c.id)
        return c.id in self.cancel

    def set_waiting(self, c: Claim, waiting: bool) -> None:
        self.calls.append(("set_waiting", c.id, waiting))

    def cancelled(self, c: Claim, reason: str) -> None:
        self.calls.append(("cancelled", c.id))

    def release(self, c: Claim, reason: str, **kwargs: Any) -> None:
        self.calls.append(("release", c.id, kwargs["kind"]))


class Client:
    """A server whose queue and history are given; a post gets the next number."""

    def __init__(self) -> None:
        self.posted: list[str] = []
        self.running: set[str] = set()

    def own_stream(self, **kwargs: Any) -> Any:
        return SimpleNamespace(client_id="comfysup-1")

    def post_prompt(self, workflow: Any, prompt_id: str, client_id: str, extra_data: Any) -> int:
        self.posted.append(prompt_id)
        return len(self.posted)

    def may_have_run(self, prompt_id: str) -> bool:
        return False

    def delete_queued(self, ids: list[str]) -> None:
        pass

    def queue(self) -> list[Any]:
        return [SimpleNamespace(prompt_id=p) for p in self.running]

    def history(self, prompt_id: str, max_files: int) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def jobs(queue: Queue, asks: AheadAsks, carried: Ahead | None = None) -> tuple[AheadJobs, list[str]]:
    """AheadJobs of job-1's attempt; the prompts it interrupted."""
    settings = SimpleNamespace(server="gpu0", url="http://gpu0", lease_seconds=30.0, heartbeat_seconds=5.0,
                               max_files_per_job=10, output_dirs={})
    station = SimpleNamespace(inputs=SimpleNamespace(workflow=lambda w: w), stop_deadline=lambda: None,
                              peer_waiting=lambda: False)
    client = Client()
    ctx = Context(station, settings, claim(1), queue, client, Clock(), lambda: 1000.0, None)  # type: ignore[arg-type]
    interrupted: list[str] = []

    def interrupt(run: Run, prompt_id: str | None = None, **kwargs: Any) -> None:
        interrupted.append(prompt_id or "")

    return AheadJobs(ctx, asks, carried, interrupt), interrupted


ARGS = ClaimArgs("runner", "gpu0", 30.0, None, 0.0)
QUEUE_AHEAD = AheadAsks(queue_ahead=lambda c, remaining, uncounted: ARGS)


def executing(ctx: Context) -> Run:
    """Job 1's run, its execution_start read, the server's broadcast saying it alone is in the queue."""
    run = Run(ctx.client, "gpu0", 1)
    run.m.follow(Limits("job-1", 1e9, 1e9, 1.0, 10.0), 0.0, True)
    for kind, data in (("execution_start", {"prompt_id": "job-1"}),
                       ("status", {"status": {"exec_info": {"queue_remaining": 1}}})):
        run.m.step(Message(kind, data, 1))
    return run


def ended(run: Run) -> None:
    """Job 1's success and end, read."""
    run.m.step(Message("execution_success", {"prompt_id": "job-1"}, 1))
    run.m.step(Message("executing", {"node": None, "prompt_id": "job-1"}, 1))


def next_started(queue: Queue) -> tuple[AheadJobs, Run, list[str]]:
    """Job 1's attempt with job 2 queued behind it and seen starting, job 1's run ended: one more may be queued
    behind the next; with the prompts it interrupted."""
    ahead, interrupted = jobs(queue, QUEUE_AHEAD)
    run = executing(ahead.ctx)
    ahead.queue_ahead(run)
    ahead.keep_message("job-2", {"type": "execution_start"}, started=True)
    ended(run)
    return ahead, run, interrupted


def test_a_job_queued_ahead_is_one_posted_entry_shown_waiting() -> None:
    queue = Queue(claim(2))
    ahead, _ = jobs(queue, QUEUE_AHEAD)
    run = executing(ahead.ctx)
    assert ahead.may_queue_ahead(run)
    ahead.queue_ahead(run)
    assert not ahead.may_queue_ahead(run)  # asked once an attempt
    (entry,) = ahead.jobs
    assert (entry.claim.id, entry.phase, entry.number, entry.waiting) == ("job-2", AheadPhase.POSTED, 1, True)
    assert queue.calls == [("record_prompt", "job-2", 1, True)]


def test_its_start_read_on_the_shared_socket_is_kept_for_its_attempt() -> None:
    ahead, _ = jobs(Queue(claim(2)), QUEUE_AHEAD)
    ahead.queue_ahead(executing(ahead.ctx))
    ahead.keep_message("job-9", {"type": "executing"}, started=False)  # nobody's
    ahead.keep_message("job-2", {"type": "execution_start"}, started=True)
    assert ahead.jobs[0].started and ahead.jobs[0].events == [{"type": "execution_start"}]
    assert ahead.started_ahead() is ahead.jobs[0].claim  # the end of job 1 says it executes
    ahead.start_recorded()
    assert ahead.started_ahead() is None


def behind_next(queue: Queue) -> tuple[AheadJobs, list[str]]:
    """Job 1's attempt at its done: job 2 runs, job 3 claimed with the done and posted behind it; with the prompts
    it interrupted."""
    ahead, run, interrupted = next_started(queue)
    ahead.ask_behind_next(run, lambda: None)
    assert ahead.may_take_behind_next()
    ahead.take_claimed(queue.claim(), 1000.0, ahead.ctx.clock())
    ahead.post_behind_next()
    return ahead, interrupted


def test_the_one_queued_behind_the_next_is_claimed_with_the_done_and_recorded_by_the_next_end() -> None:
    """Queued behind the next job: asked for as the done is written (what the socket holds read first), claimed in
    the done's transaction, posted once it committed; its number is left for the end of the attempt it is handed
    to (one write a job)."""
    queue = Queue(claim(2), claim(3))
    ahead, run, _ = next_started(queue)
    assert ahead.may_queue_behind_next(run)
    read: list[bool] = []
    ahead.ask_behind_next(run, lambda: read.append(True))
    assert read == [True] and ahead.behind == ARGS and ahead.may_take_behind_next()
    ahead.take_claimed(queue.claim(), 1000.0, ahead.ctx.clock())
    assert ahead.jobs[1].phase is AheadPhase.CLAIMED  # claimed with the done: posted once that committed
    ahead.post_behind_next()
    assert [(e.claim.id, e.phase, e.number, e.waiting) for e in ahead.jobs] == \
        [("job-2", AheadPhase.STARTED, 1, True), ("job-3", AheadPhase.POSTED, 2, True)]
    assert ahead.jobs[1].unrecorded and ahead.unrecorded_prompt() is None  # not this attempt's to record
    assert not [c for c in queue.calls if c[1] == "job-3"]  # no write of its own
    result = AttemptResult(Outcome(Ending.DONE), tuple(ahead.jobs))
    assert result.next_claim is not None and result.next_claim.id == "job-2"
    nxt, _ = jobs(queue, QUEUE_AHEAD, carried=result.ahead[1])  # job 2's attempt
    prompt = nxt.unrecorded_prompt()
    assert prompt is not None and (prompt.claim.id, prompt.server, prompt.number, prompt.waiting) == \
        ("job-3", "gpu0", 2, True)
    nxt.prompt_recorded(True)  # by job 2's end
    assert nxt.unrecorded_prompt() is None
    nxt.record_unrecorded()
    assert not [c for c in queue.calls if c[1] == "job-3"]  # nothing left to record


def test_a_number_the_end_did_not_record_is_recorded_before_the_jobs_pass_on() -> None:
    """An end other than done writes no number: the next job's, posted after the done before, is recorded on its
    own."""
    queue = Queue(claim(2), claim(3))
    ahead, _ = behind_next(queue)
    nxt, _ = jobs(queue, QUEUE_AHEAD, carried=ahead.jobs[1])
    nxt.record_unrecorded()
    assert queue.calls[-1] == ("record_prompt", "job-3", 2, True)
    nxt.record_unrecorded()  # once
    assert [c for c in queue.calls if c[1] == "job-3"] == [("record_prompt", "job-3", 2, True)]


def test_a_number_recorded_by_the_end_for_a_claim_lost_interrupts_its_prompt() -> None:
    queue = Queue(claim(2), claim(3))
    ahead, _ = behind_next(queue)
    nxt, interrupted = jobs(queue, QUEUE_AHEAD, carried=ahead.jobs[1])
    nxt.prompt_recorded(False)
    assert interrupted == ["job-3"] and nxt.jobs == []


def test_nothing_is_claimed_behind_the_next_once_a_stop_began_or_the_next_went() -> None:
    stopping: list[float] = []
    ahead, run, _ = next_started(Queue(claim(2), claim(3)))
    ahead.ask_behind_next(run, lambda: None)
    ahead.ctx.station.stop_deadline = lambda: stopping[0] if stopping else None
    stopping.append(5.0)  # a graceful stop began while the files were stored
    assert not ahead.may_take_behind_next()
    stopping.clear()
    ahead.jobs.clear()  # the next job lost its lease meanwhile
    assert not ahead.may_take_behind_next()
    ahead.post_behind_next()
    assert ahead.jobs == [] and ahead.behind is None


def test_a_claim_behind_a_next_dropped_by_the_done_waits_for_its_own_attempt() -> None:
    """The done found the next job's lease lost (its number's record held nothing): it is dropped, and the job
    claimed with the done is not posted behind it; it becomes the next job, which its own attempt posts."""
    queue = Queue(claim(2), claim(3))
    ahead, run, _ = next_started(queue)
    ahead.ask_behind_next(run, lambda: None)
    ahead.take_claimed(queue.claim(), 1000.0, ahead.ctx.clock())
    ahead.drop(ahead.jobs[0])
    ahead.post_behind_next()
    assert [(e.claim.id, e.phase) for e in ahead.jobs] == [("job-3", AheadPhase.CLAIMED)]


@pytest.mark.parametrize(("age", "fence"), [(0.1, True), (0.6, False), (None, False)])
def test_the_own_claim_made_by_the_attempt_before_is_the_downloads_fence_while_fresh(age: float | None,
                                                                                    fence: bool) -> None:
    """A job claimed by the attempt before (queued ahead, claimed with its done) holds a lease written then: within
    FRESH_RENEWAL_SECONDS that write is the download's fence, and no heartbeat of its own is needed."""
    ahead, _ = jobs(Queue(), QUEUE_AHEAD)
    now = ahead.ctx.clock()
    ahead.own_renewed_at = None if age is None else now - age
    assert ahead.renewed_own(now) is fence


def test_when_the_next_loses_its_lease_the_one_behind_it_becomes_the_next() -> None:
    queue = Queue(claim(2), claim(3))
    ahead, interrupted = behind_next(queue)
    queue.lost.add("job-2")
    ahead.ctx.clock.now += 10  # type: ignore[attr-defined]
    ahead.renew(ahead.ctx.clock())
    assert interrupted == ["job-2"]  # its prompt must not run here
    assert [e.claim.id for e in ahead.jobs] == ["job-3"]
    assert ("heartbeat", "job-3") in queue.calls  # still renewed here, handed to the next attempt


def test_a_cancel_of_the_next_takes_it_out_of_the_server_and_records_it() -> None:
    queue = Queue(claim(2))
    ahead, interrupted = jobs(queue, QUEUE_AHEAD)
    ahead.queue_ahead(executing(ahead.ctx))
    queue.cancel.add("job-2")
    ahead.ctx.clock.now += 10  # type: ignore[attr-defined]
    ahead.renew(ahead.ctx.clock())
    assert interrupted == ["job-2"] and ("cancelled", "job-2") in queue.calls and ahead.jobs == []


@pytest.mark.parametrize(("running", "released"), [(False, True), (True, False)])
def test_a_stop_releases_the_next_only_when_the_server_shows_it_never_ran(running: bool, released: bool) -> None:
    queue = Queue(claim(2))
    ahead, _ = jobs(queue, QUEUE_AHEAD)
    ahead.queue_ahead(executing(ahead.ctx))
    if running:
        ahead.ctx.client.running.add("job-2")  # type: ignore[attr-defined]
    ahead.withdraw_next(cancelled=False)
    assert (("release", "job-2", "shutdown") in queue.calls) is released
    assert [e.phase for e in ahead.jobs] == ([] if released else [AheadPhase.STARTED])


def test_a_job_that_may_have_run_elsewhere_is_claimed_ahead_but_posted_by_its_own_attempt() -> None:
    queue = Queue(claim(2, last_server="gpu1"))
    ahead, _ = jobs(queue, QUEUE_AHEAD)
    ahead.queue_ahead(executing(ahead.ctx))
    (entry,) = ahead.jobs
    assert entry.phase is AheadPhase.CLAIMED and not entry.posted and entry.claim.waiting
    assert queue.calls == [("set_waiting", "job-2", True)]


def test_the_hand_off_asks_with_a_done_on_a_free_server_and_posts_without_waiting() -> None:
    asked: list[Outcome] = []

    def hand_off(c: Claim, outcome: Outcome) -> ClaimArgs:
        asked.append(outcome)
        return ARGS

    queue = Queue(claim(2))
    ahead, _ = jobs(queue, AheadAsks(hand_off=hand_off))
    ahead.hand_off()
    assert [(o.state, o.server_free) for o in asked] == [(Ending.DONE, True)]
    assert (ahead.jobs[0].phase, ahead.jobs[0].waiting) == (AheadPhase.POSTED, False)


def test_a_job_carried_from_the_attempt_before_is_this_attempts_next_from_the_start() -> None:
    carried = Ahead(claim(2), 1.0, 0.0, AheadPhase.POSTED, number=7)
    ahead, _ = jobs(Queue(), QUEUE_AHEAD, carried)
    assert ahead.next is carried and not ahead.may_queue_ahead(executing(ahead.ctx))
    assert carried.renewed_at == 0.0  # its last renewal as the attempt before made it: being handed on renews nothing
