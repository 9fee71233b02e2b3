"""The attempt's steps (comfysup.runner.steps), as a table: a phase set, an event stepped, the phase and the action
that follow. No server, no queue, no clock: every row runs in microseconds."""

from __future__ import annotations

import time
from typing import Any

import pytest

from comfysup.runner import memory, steps
from comfysup.runner.result import Ending, Outcome
from comfysup.runner.retry import Failure
from comfysup.runner.steps import (
    POSTED,
    Alarm,
    AttemptMachine,
    AttemptPhase,
    Broke,
    CaughtUp,
    Download,
    Downloaded,
    End,
    Failed,
    Follow,
    Found,
    Free,
    Freed,
    Interrupt,
    Interrupted,
    LeaseGone,
    Post,
    QueueGone,
    Record,
    Recorded,
    RecordFailure,
    Stopped,
    Succeeded,
    Terms,
)
from comfysup.runner.stuck import STUCK_KIND

P = AttemptPhase
TIMEOUT = 600.0
ENTRY = {"status": {"status_str": "success"}, "outputs": {}}
OOM = Failed("oom", "CUDA out of memory", True, own_server=True)
STUCK = "prompt still in gpu0's queue 30 s after /interrupt"
TIMED_OUT = Failure("timeout", f"timed out after {TIMEOUT:g} s (while executing: the server did not answer in time)",
                    True)
DONE = Outcome(Ending.DONE, kind="done", outputs=[], adopted=False, adopted_from_disk=False, server_free=True)
GRACEFUL = Stopped(Ending.RELEASED, "interrupted by a graceful stop; attempt not counted", "shutdown")
CANCELLED = Outcome(Ending.CANCELLED, "cancelled by user", kind="cancelled")
QUEUE_LOST = Outcome(Ending.LOST, "the queue did not answer (database is locked); the prompt was interrupted and "
                     "nothing was recorded: the job comes back when its lease expires", kind="queue_unavailable")


def machine(phase: AttemptPhase = P.CATCHING_UP, attempt: int = 1, last_reason: str | None = None,
            cancel: bool = False, **state: Any) -> AttemptMachine:
    m = AttemptMachine(Terms(attempt, 4, last_reason, cancel, TIMEOUT))
    m.phase = phase
    for name, value in state.items():
        setattr(m, name, value)
    return m


def at(phase: AttemptPhase = P.CATCHING_UP, **kw: Any) -> tuple[AttemptPhase, dict[str, Any]]:
    """A row's machine: its phase, and what else is set (made afresh for the row)."""
    return phase, kw


# (name, the machine as set, the event, the phase after, the action asked for)
ROWS: list[tuple[str, tuple[AttemptPhase, dict[str, Any]], Any, AttemptPhase, Any]] = [
    # 1. catch up
    ("nothing to catch up: post", at(), CaughtUp(Found.NOTHING), P.POSTING, Post()),
    ("a run still queued: followed, not posted", at(), CaughtUp(Found.FOLLOW), P.FOLLOWING, Follow()),
    ("a finished run adopted from history: its entry, not a post", at(), CaughtUp(Found.ADOPTED), P.FOLLOWING,
     Follow()),
    ("out of attempts, nothing to catch up: dead", at(attempt=5, last_reason="server died"),
     CaughtUp(Found.NOTHING), P.RECORDING,
     Record(Outcome(Ending.DEAD, "gave up after 4 attempts, last: server died", kind="gave_up"))),
    ("out of attempts, a run to adopt: adopted all the same", at(attempt=5), CaughtUp(Found.ADOPTED),
     P.FOLLOWING, Follow()),
    ("cancel before the post: what catch-up found is interrupted", at(cancel=True), CaughtUp(Found.FOLLOW),
     P.INTERRUPTING, Interrupt(caught_up=True)),
    ("a run adopted from history that failed: its failure", at(),
     Failed("execution_error", "KSampler: bad input", False), P.RECORDING,
     RecordFailure(Failure("execution_error", "KSampler: bad input", False))),
    # 2. post
    ("posted: followed", at(P.POSTING), POSTED, P.FOLLOWING, Follow()),
    ("a transient post failure (5xx, refused)", at(P.POSTING), Failed("server_error", "POST /prompt 502"),
     P.RECORDING, RecordFailure(Failure("server_error", "POST /prompt 502", True))),
    ("a permanent post failure (400)", at(P.POSTING), Failed("rejected", "node_errors", False), P.RECORDING,
     RecordFailure(Failure("rejected", "node_errors", False))),
    # 3. follow
    ("the run succeeded: its files", at(P.FOLLOWING), Succeeded(ENTRY), P.DOWNLOADING, Download(ENTRY)),
    ("an execution error", at(P.FOLLOWING), Failed("execution_error", "ValueError", False), P.RECORDING,
     RecordFailure(Failure("execution_error", "ValueError", False))),
    ("an interrupt not asked for", at(P.FOLLOWING), Failed("interrupted", "execution_interrupted"),
     P.RECORDING, RecordFailure(Failure("interrupted", "execution_interrupted", True))),
    ("an OOM on its own server: POST /free", at(P.FOLLOWING), OOM, P.FREEING, Free()),
    ("an OOM on a peer's server: the retry policy", at(P.FOLLOWING), OOM._replace(own_server=False),
     P.RECORDING, RecordFailure(Failure("oom", "CUDA out of memory", True))),
    ("a second OOM in the attempt: the retry policy", at(P.FOLLOWING, oom_retried=True), OOM, P.RECORDING,
     RecordFailure(Failure("oom", "CUDA out of memory", True))),
    ("an OOM after the attempt before was released for one: the retry policy",
     at(P.FOLLOWING, last_reason=memory.RELEASED_REASON), OOM, P.RECORDING,
     RecordFailure(Failure("oom", "CUDA out of memory", True))),
    ("stop during follow (a graceful stop's grace)", at(P.FOLLOWING), GRACEFUL, P.RECORDING,
     Record(Outcome(Ending.RELEASED, GRACEFUL.reason, kind="shutdown"))),
    ("cancel during follow (its prompt already interrupted)", at(P.FOLLOWING),
     Stopped(Ending.CANCELLED, "cancelled by user", "cancelled"), P.RECORDING, Record(CANCELLED)),
    ("the server died", at(P.FOLLOWING), Failed("server_died", "the ComfyUI server died"), P.RECORDING,
     RecordFailure(Failure("server_died", "the ComfyUI server died", True))),
    # after an OOM
    ("freed, nothing behind: posted again", at(P.FREEING, oom=(memory.POST_AGAIN, OOM)), Freed(True),
     P.POSTING, Post(again=True)),
    ("freed, a job of ours behind: given back uncounted", at(P.FREEING, oom=(memory.RELEASE, OOM)),
     Freed(True), P.RECORDING,
     Record(Outcome(Ending.RELEASED, f"{memory.RELEASED_REASON} (last: CUDA out of memory)", kind="oom"))),
    ("/free not answered: the OOM's failure", at(P.FREEING, oom=(memory.POST_AGAIN, OOM)), Freed(False),
     P.RECORDING, RecordFailure(Failure("oom", "CUDA out of memory", True))),
    # 4. the alarm (a read that blocked past the deadline, or a stop's grace), an internal error, the interrupt
    ("deadline inside a step: interrupt and wait", at(P.FOLLOWING),
     Alarm("attempt", "the job's timeout of 600 s", "executing"), P.INTERRUPTING, Interrupt()),
    ("deadline during the download", at(P.DOWNLOADING), Alarm("attempt", "the job's timeout", "executing"),
     P.INTERRUPTING, Interrupt()),
    ("deadline at the post", at(P.POSTING), Alarm("attempt", "the job's timeout", "posted"), P.INTERRUPTING,
     Interrupt()),
    ("deadline at catch-up", at(), Alarm("attempt", "the job's timeout", "starting"), P.INTERRUPTING,
     Interrupt()),
    ("deadline during POST /free", at(P.FREEING, oom=(memory.POST_AGAIN, OOM)),
     Alarm("attempt", "the job's timeout", "executing"), P.INTERRUPTING, Interrupt()),
    ("an alarm outside the steps, during the interrupt", at(P.INTERRUPTING),
     Alarm("stop", "the stop's grace", None), P.INTERRUPTING, Interrupt()),
    ("an internal error", at(P.FOLLOWING), Broke("comfysup internal error: KeyError: 'x'"), P.INTERRUPTING,
     Interrupt()),
    ("an internal error while interrupting", at(P.INTERRUPTING, then=TIMED_OUT), Broke("internal"),
     P.INTERRUPTING, Interrupt()),
    ("interrupted after the deadline: a timeout", at(P.INTERRUPTING, then=TIMED_OUT, stuck_fails=True),
     Interrupted(None), P.RECORDING, RecordFailure(TIMED_OUT)),
    ("the timed-out prompt will not leave: stuck", at(P.INTERRUPTING, then=TIMED_OUT, stuck_fails=True),
     Interrupted(STUCK), P.RECORDING, RecordFailure(Failure(STUCK_KIND, STUCK, True))),
    ("interrupted after a cancel before the post", at(P.INTERRUPTING, then=CANCELLED), Interrupted(STUCK),
     P.RECORDING, Record(CANCELLED)),
    ("interrupted after the queue went: nothing written", at(P.INTERRUPTING, then=QUEUE_LOST),
     Interrupted(None), P.ENDED, End(QUEUE_LOST)),
    # 5. download
    ("downloaded: done", at(P.DOWNLOADING), Downloaded([], False, False, True), P.RECORDING, Record(DONE)),
    ("a download failure (a malformed entry, a server gone)", at(P.DOWNLOADING),
     Failed("malformed", "lists no file of 9"), P.RECORDING, RecordFailure(Failure("malformed", "lists no file of 9",
                                                                                   True))),
    ("stop during the download", at(P.DOWNLOADING), GRACEFUL, P.RECORDING,
     Record(Outcome(Ending.RELEASED, GRACEFUL.reason, kind="shutdown"))),
    ("lease lost during the download: nothing written", at(P.DOWNLOADING), LeaseGone("job-1: lease lost"),
     P.ENDED, End(Outcome(Ending.LOST, "job-1: lease lost", kind="lease_lost"))),
    ("the queue gone during the download: the prompt interrupted, unrenewed", at(P.DOWNLOADING),
     QueueGone("database is locked"), P.INTERRUPTING, Interrupt(renew=False)),
    # 6. record
    ("recorded: ended", at(P.RECORDING), Recorded(DONE), P.ENDED, End(DONE)),
    ("lease lost at the record (its fence)", at(P.RECORDING), LeaseGone("fenced"), P.ENDED,
     End(Outcome(Ending.LOST, "fenced", kind="lease_lost"))),
    ("the queue gone at the record", at(P.RECORDING), QueueGone("database is locked"), P.INTERRUPTING,
     Interrupt(renew=False)),
    # a lost lease or queue anywhere
    ("lease lost at catch-up's record_prompt", at(), LeaseGone("taken"), P.ENDED,
     End(Outcome(Ending.LOST, "taken", kind="lease_lost"))),
    ("lease lost at the post's record_prompt", at(P.POSTING), LeaseGone("taken"), P.ENDED,
     End(Outcome(Ending.LOST, "taken", kind="lease_lost"))),
    ("lease lost at a heartbeat", at(P.FOLLOWING), LeaseGone("taken"), P.ENDED,
     End(Outcome(Ending.LOST, "taken", kind="lease_lost"))),
    ("lease lost while waiting out an interrupt", at(P.INTERRUPTING, then=TIMED_OUT), LeaseGone("taken"),
     P.ENDED, End(Outcome(Ending.LOST, "taken", kind="lease_lost"))),
    ("the queue gone at a heartbeat", at(P.FOLLOWING), QueueGone("database is locked"), P.INTERRUPTING,
     Interrupt(renew=False)),
    ("lease lost during POST /free", at(P.FREEING, oom=(memory.POST_AGAIN, OOM)), LeaseGone("taken"),
     P.ENDED, End(Outcome(Ending.LOST, "taken", kind="lease_lost"))),
    ("the queue gone at catch-up", at(), QueueGone("database is locked"), P.INTERRUPTING,
     Interrupt(renew=False)),
    ("the queue gone at the post", at(P.POSTING), QueueGone("database is locked"), P.INTERRUPTING,
     Interrupt(renew=False)),
    ("the queue gone during POST /free", at(P.FREEING, oom=(memory.POST_AGAIN, OOM)), QueueGone("gone"),
     P.INTERRUPTING, Interrupt(renew=False)),
    ("the queue gone while interrupting", at(P.INTERRUPTING, then=TIMED_OUT), QueueGone("gone"),
     P.INTERRUPTING, Interrupt(renew=False)),
    ("stopped at catch-up", at(), GRACEFUL, P.RECORDING,
     Record(Outcome(Ending.RELEASED, GRACEFUL.reason, kind="shutdown"))),
    ("stopped at the post (a job taken ahead lost behind a lost prompt)", at(P.POSTING),
     Stopped(Ending.RELEASED, "queued behind a prompt that gpu0 lost", "server_died"), P.RECORDING,
     Record(Outcome(Ending.RELEASED, "queued behind a prompt that gpu0 lost", kind="server_died"))),
    ("an internal error at catch-up", at(), Broke("internal"), P.INTERRUPTING, Interrupt()),
    ("an internal error at the post", at(P.POSTING), Broke("internal"), P.INTERRUPTING, Interrupt()),
    ("an internal error during the download", at(P.DOWNLOADING), Broke("internal"), P.INTERRUPTING,
     Interrupt()),
    ("an internal error during POST /free", at(P.FREEING, oom=(memory.POST_AGAIN, OOM)), Broke("internal"),
     P.INTERRUPTING, Interrupt()),
]


@pytest.mark.parametrize(("given", "event", "phase", "action"), [row[1:] for row in ROWS],
                         ids=[row[0] for row in ROWS])
def test_the_table(given: tuple[AttemptPhase, dict[str, Any]], event: Any, phase: AttemptPhase, action: Any) -> None:
    m = machine(given[0], **given[1])
    assert m.step(event) == action
    assert m.phase is phase


def test_every_move_of_the_table_has_its_row() -> None:
    moves = {(row[1][0], type(row[2])) for row in ROWS}
    assert set(steps._TABLE) <= moves, [(phase, kind.__name__) for phase, kind in set(steps._TABLE) - moves]


@pytest.mark.parametrize(("phase", "event"), [
    (P.ENDED, Recorded(DONE)), (P.ENDED, LeaseGone("x")), (P.RECORDING, Alarm("attempt", "x", "y")),
    (P.RECORDING, Broke("x")), (P.POSTING, Succeeded(ENTRY)), (P.CATCHING_UP, POSTED), (P.FREEING, OOM)])
def test_an_event_its_phase_does_not_expect_is_a_bug(phase: AttemptPhase, event: Any) -> None:
    with pytest.raises(ValueError, match="unexpected"):
        machine(phase).step(event)


def walk(m: AttemptMachine, *events: Any) -> list[Any]:
    return [m.step(event) for event in events]


def test_the_happy_path() -> None:
    m = machine()
    assert walk(m, CaughtUp(Found.NOTHING), POSTED, Succeeded(ENTRY), Downloaded([], False, False, True),
                Recorded(DONE)) == [Post(), Follow(), Download(ENTRY), Record(DONE), End(DONE)]
    assert (m.phase, m.outcome) == (P.ENDED, DONE)


def test_an_oom_is_freed_and_posted_once_more_in_the_same_attempt_then_the_second_is_the_policys() -> None:
    m = machine()
    assert walk(m, CaughtUp(Found.NOTHING), POSTED, OOM, Freed(True), POSTED, OOM) == [
        Post(), Follow(), Free(), Post(again=True), Follow(), RecordFailure(Failure("oom", "CUDA out of memory", True))]


def test_a_cancel_asked_before_the_post_interrupts_and_ends_cancelled_whatever_the_prompt_did() -> None:
    m = machine(cancel=True)
    assert walk(m, CaughtUp(Found.NOTHING), Interrupted(STUCK)) == [Interrupt(caught_up=True), Record(CANCELLED)]


def test_a_deadline_interrupts_and_waits_then_the_stuck_prompt_is_the_failure() -> None:
    m = machine()
    assert walk(m, CaughtUp(Found.FOLLOW), Alarm("attempt", "the job's timeout of 600 s", "executing"),
                Interrupted(STUCK)) == [Follow(), Interrupt(), RecordFailure(Failure(STUCK_KIND, STUCK, True))]


@pytest.mark.parametrize(("during", "stuck", "outcome"), [
    ("executing", STUCK, Outcome(Ending.RELEASED, "interrupted by a stop (the stop's grace) while executing; attempt "
                                 "not counted", kind="shutdown")),
    (None, None, Outcome(Ending.RELEASED, "interrupted by the stop's grace; attempt not counted", kind="shutdown"))])
def test_a_stops_alarm_releases_the_job_uncounted(during: str | None, stuck: str | None, outcome: Outcome) -> None:
    m = machine(P.FOLLOWING)
    assert walk(m, Alarm("stop", "the stop's grace", during), Interrupted(stuck)) == [Interrupt(), Record(outcome)]


def test_a_timeout_outside_the_steps_is_a_timeout_even_when_the_prompt_is_stuck() -> None:
    m = machine(P.DOWNLOADING)
    assert walk(m, Alarm("attempt", "the job's timeout of 600 s", None), Interrupted(STUCK)) == [
        Interrupt(), RecordFailure(Failure("timeout", "timed out (the job's timeout of 600 s)", True))]


def test_an_internal_error_interrupts_then_fails_transiently() -> None:
    m = machine(P.FOLLOWING)
    assert walk(m, Broke("comfysup internal error: KeyError: 'x'"), Interrupted(None)) == [
        Interrupt(), RecordFailure(Failure("internal", "comfysup internal error: KeyError: 'x'", True))]


def test_a_queue_gone_interrupts_unrenewed_and_ends_with_nothing_written() -> None:
    m = machine(P.FOLLOWING)
    assert walk(m, QueueGone("database is locked"), Interrupted(None)) == [Interrupt(renew=False), End(QUEUE_LOST)]
    assert m.outcome == QUEUE_LOST


def test_an_attempt_is_a_handful_of_small_steps() -> None:
    """An attempt steps its machine about six times: each step costs microseconds, and allocates its action."""
    events = (CaughtUp(Found.NOTHING), POSTED, Succeeded(ENTRY), Downloaded([], False, False, True), Recorded(DONE))
    started = time.perf_counter()
    for _ in range(1000):
        m = AttemptMachine(Terms(1, 4, None, False, TIMEOUT))
        for event in events:
            m.step(event)
    assert (time.perf_counter() - started) / 1000 < 1e-3
    assert m.outcome == DONE
