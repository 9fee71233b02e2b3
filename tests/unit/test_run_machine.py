"""The run's protocol (comfysup.runner.machine), fed the message sequences recorded from a real ComfyUI
(tests/recorded) and every fault the chaos rows inject, as events: no socket, no server, no clock."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from comfysup.runner.machine import (
    CANCELLED,
    GRACEFUL_STOP,
    HISTORY_AFTER_SUCCESS_SECONDS,
    NOTHING,
    EntryFromSocket,
    Fail,
    Interrupt,
    KeepPreview,
    LeaseAnswer,
    Limits,
    Message,
    OfferAheadToPeer,
    OtherPrompt,
    Over,
    Phase,
    Polled,
    PollIn,
    ReadBuffered,
    ReadHistory,
    Reconnected,
    RenewLeases,
    RunMachine,
    TraceIt,
    Unreachable,
    WithdrawAhead,
    Woke,
)
from comfysup.runner.result import Ending

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
POLL = 2.0
LOST_AFTER = 10.0
TIMEOUT = 100.0


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text())


def machine(job_id: str, now: float = 0.0, socket: bool = True) -> RunMachine:
    m = RunMachine()
    m.follow(Limits(job_id, now + TIMEOUT, TIMEOUT, POLL, LOST_AFTER), now, socket)
    return m


def feed(m: RunMachine, messages: list[dict[str, Any]], connection: int = 1) -> list[Any]:
    """Every message in order; the actions they asked for, in order."""
    out: list[Any] = []
    for message in messages:
        out.extend(m.step(Message(message.get("type"), message.get("data") or {}, connection)))
    return out


def ws(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["json"] for m in messages if "json" in m]  # binary frames (previews) aside


def success() -> tuple[str, list[dict[str, Any]]]:
    data = recorded("success.json")
    messages = ws(data["ws_messages"])
    return messages[2]["data"]["prompt_id"], messages


# -- the recorded runs --------------------------------------------------------------------------------------

def test_a_recorded_success_is_watched_whole_and_needs_no_history() -> None:
    job, messages = success()
    m = machine(job)
    actions = feed(m, messages)
    assert m.phase is Phase.ENDED and m.success_seen and m.end_seen and m.watched_on == 1
    assert m.queue_remaining == 0  # the broadcast after it left the queue
    assert m.outputs == {"3": {"images": [{"filename": "comfysup_00001_.png", "subfolder": "", "type": "output"}]}}
    polls = [a.seconds for a in actions if isinstance(a, PollIn)]
    assert polls == [HISTORY_AFTER_SUCCESS_SECONDS, 0.0]  # at the success, then at once at the end
    m.poll_within(1.0, 0.0)
    assert m.step(Woke(1.0, connection=1)) == (EntryFromSocket(),)
    m.step(Over())
    assert m.step(Woke(2.0, connection=1)) == NOTHING  # over: /history is never read again


def test_nothing_before_its_start_is_this_runs_and_statuses_only_count_the_queue() -> None:
    job, messages = success()
    m = machine(job)
    assert feed(m, messages[:2]) == []  # the status broadcasts
    assert m.phase is Phase.QUEUED and m.queue_remaining == 1
    assert feed(m, [{"type": "executing", "data": {"node": "1", "prompt_id": job}}]) == []  # a stale one
    assert m.phase is Phase.QUEUED


def test_every_message_of_the_run_is_traced_from_its_start() -> None:
    job, messages = success()
    m = machine(job)
    actions = feed(m, messages)
    own = [msg for msg in messages if (msg.get("data") or {}).get("prompt_id") == job]
    assert sum(isinstance(a, TraceIt) for a in actions) == len(own)


def test_a_recorded_reconnect_mid_run_reads_the_history_at_once_and_is_not_watched_whole() -> None:
    data = recorded("reconnect.json")["reconnect_mid_run"]
    job = data["prompt_id"]
    m = machine(job)
    feed(m, ws(data["before_disconnect"]), connection=1)
    assert m.phase is Phase.EXECUTING
    assert m.step(Reconnected()) == (PollIn(0.0),)
    after = ws(data["after_reconnect"])
    assert after[1]["data"].get("prompt_id") is None  # the bare ``executing`` a reconnect gets: nobody's
    feed(m, after, connection=2)
    assert m.phase is Phase.ENDED
    m.poll_within(5.0, 0.0)
    assert m.step(Woke(5.0, connection=2)) == (ReadHistory(),)  # messages were lost: /history says how it went


def test_a_recorded_execution_error_fails_the_run_with_its_class() -> None:
    data = recorded("execution-error.json")
    messages = ws(data["ws_messages_client_A_prompt_owner"])
    job = next(msg["data"]["prompt_id"] for msg in messages if msg["type"] == "execution_start")
    m = machine(job)
    fails = [a for a in feed(m, messages) if isinstance(a, Fail)]
    assert len(fails) == 1 and "IndexError" in fails[0].reason, fails
    assert m.phase is Phase.LEFT and not m.success_seen  # its end follows: never a success


def test_an_out_of_memory_error_is_its_own_kind() -> None:
    m = machine("j")
    m.step(Message("execution_start", {"prompt_id": "j"}, 1))
    error = {"prompt_id": "j", "node_id": "3", "node_type": "KSampler", "exception_type": "torch.OutOfMemoryError",
             "exception_message": "CUDA out of memory. Tried to allocate 2.00 GiB", "traceback": []}
    (trace, fail) = m.step(Message("execution_error", error, 1))
    assert isinstance(trace, TraceIt) and isinstance(fail, Fail) and fail.kind == "oom" and fail.transient


def test_a_recorded_cpu_allocation_failure_fails_the_run() -> None:
    error = recorded("execution-error.json")["cpu_allocation_failure"]["execution_error"]
    m = machine(error["prompt_id"])
    m.step(Message("execution_start", {"prompt_id": error["prompt_id"]}, 1))
    assert any(isinstance(a, Fail) for a in m.step(Message("execution_error", error, 1)))


def test_a_recorded_interrupt_not_asked_for_fails_the_run_and_one_asked_for_does_not() -> None:
    message = recorded("interrupt.json")["execution_interrupted message"]
    job = message["data"]["prompt_id"]
    for asked in (False, True):
        m = machine(job)
        m.step(Message("execution_start", {"prompt_id": job}, 1))
        if asked:
            m.interrupting()
        fails = [a for a in m.step(Message(message["type"], message["data"], 1)) if isinstance(a, Fail)]
        assert [f.kind for f in fails] == ([] if asked else ["interrupted"])


def test_recorded_progress_moves_the_trace_and_a_preview_is_kept_while_it_runs() -> None:
    data = recorded("progress-preview.json")["client_sent_feature_flags_supports_preview_metadata"]
    messages = ws(data["ws_messages"])
    job = data["request"]["prompt_id"]
    m = machine(job)
    actions = feed(m, messages)
    assert m.phase is Phase.ENDED
    assert sum(1 for msg in messages if msg["type"] == "progress") >= 1
    assert sum(isinstance(a, TraceIt) for a in actions) >= 3
    m2 = machine(job)
    preview = Message("preview", {"content_type": "image/jpeg", "image": b"x"}, 1)
    assert m2.step(preview) == NOTHING  # before its start: the previous prompt's
    m2.step(Message("execution_start", {"prompt_id": job}, 1))
    assert m2.step(preview) == (KeepPreview(),)


def test_the_message_of_another_prompt_of_ours_is_handed_on() -> None:
    _, messages = success()
    m = machine("someone-ahead-of-it")
    actions = feed(m, messages)
    assert m.phase is Phase.QUEUED  # none of it was this run's
    assert actions[0] == OtherPrompt(True)  # execution_start: that job runs
    assert all(isinstance(a, OtherPrompt) for a in actions)


# -- the faults the chaos rows inject ------------------------------------------------------------------------

def test_a_socket_lost_after_the_success_reads_the_history() -> None:
    job, messages = success()
    m = machine(job)
    success_at = next(i for i, msg in enumerate(messages) if msg["type"] == "execution_success")
    feed(m, messages[:success_at + 1], connection=1)
    assert m.phase is Phase.SUCCEEDED
    assert m.step(Reconnected()) == (PollIn(0.0),)
    m.poll_within(1.0, 0.0)
    assert m.step(Woke(1.0, connection=2)) == (ReadHistory(),)
    assert m.step(Polled(1.0, found=True)) == (ReadBuffered(),)  # its last messages read too, then over


def test_an_end_whose_success_was_lost_is_not_a_success() -> None:
    job, messages = success()
    m = machine(job)
    feed(m, [msg for msg in messages if msg["type"] != "execution_success"])
    assert m.phase is Phase.LEFT and m.end_seen and not m.success_seen
    m.poll_within(1.0, 0.0)
    assert m.step(Woke(1.0, connection=1)) == (ReadHistory(),)


def test_a_history_written_late_is_read_again_soon_after_the_success() -> None:
    job, messages = success()
    m = machine(job)
    feed(m, messages, connection=1)
    m.poll_within(1.0, 0.0)
    assert m.step(Woke(1.0, connection=2)) == (ReadHistory(),)  # watched on another connection: /history
    assert m.step(Polled(1.0, found=False)) == NOTHING
    assert m.next_poll == pytest.approx(1.0 + HISTORY_AFTER_SUCCESS_SECONDS)
    assert m.step(Woke(1.01, connection=2)) == NOTHING
    assert m.step(Woke(1.0 + HISTORY_AFTER_SUCCESS_SECONDS, connection=2)) == (ReadHistory(),)
    assert m.step(Polled(1.06, found=True)) == (ReadBuffered(),)


def test_a_run_still_running_is_polled_every_poll_seconds() -> None:
    m = machine("j", now=0.0)
    assert m.step(Woke(0.5)) == NOTHING
    assert m.wait(0.5, heartbeat_at=50.0) == pytest.approx(POLL - 0.5)
    assert m.step(Woke(POLL)) == (ReadHistory(),)
    m.step(Polled(POLL, found=False))
    assert m.next_poll == pytest.approx(2 * POLL)


def test_a_caught_up_run_without_a_socket_reads_its_history_at_once() -> None:
    m = machine("j", now=3.0, socket=False)
    assert m.step(Woke(3.0)) == (ReadHistory(),)


def test_a_server_that_stays_unreachable_is_taken_as_dead() -> None:
    m = machine("j")
    assert m.step(Unreachable(2.0, "refused")) == NOTHING
    assert m.step(Unreachable(2.0 + LOST_AFTER / 2, "refused")) == NOTHING
    (fail,) = m.step(Unreachable(2.0 + LOST_AFTER, "refused"))
    assert isinstance(fail, Fail) and fail.kind == "server_died" and fail.transient


def test_a_server_that_answers_again_starts_the_count_over() -> None:
    m = machine("j")
    m.step(Unreachable(2.0, "refused"))
    m.step(Polled(3.0, found=False))
    assert m.step(Unreachable(3.0 + LOST_AFTER - 1, "refused")) == NOTHING


def test_the_timeout_interrupts_the_prompt_before_the_attempt_ends() -> None:
    m = machine("j", now=0.0)
    m.step(Message("execution_start", {"prompt_id": "j"}, 1))
    (interrupt,) = m.step(Woke(TIMEOUT))
    assert isinstance(interrupt, Interrupt) and isinstance(interrupt.then, Fail) and interrupt.then.kind == "timeout"


def test_a_cancel_seen_at_the_heartbeat_interrupts_then_records_the_cancel() -> None:
    m = machine("j")
    assert m.step(Woke(1.0, heartbeat_due=True)) == (RenewLeases(),)
    assert m.step(LeaseAnswer(cancelled=False)) == NOTHING
    assert m.step(LeaseAnswer(cancelled=True)) == (Interrupt(CANCELLED),)
    assert CANCELLED.ending is Ending.CANCELLED


def test_a_lease_renewed_mid_download_reads_no_history() -> None:
    """The download's checkpoints are wake-ups of a run that is over: the lease is renewed (a lost one ends the
    attempt there, writing nothing: the driver's LeaseLost), /history is never read again."""
    job, messages = success()
    m = machine(job)
    feed(m, messages)
    m.step(Over())
    assert m.step(Woke(50.0, heartbeat_due=True, connection=1)) == (RenewLeases(),)
    assert m.step(Woke(51.0, connection=1)) == NOTHING


def test_a_graceful_stop_takes_the_unstarted_job_ahead_back_then_interrupts_at_the_end_of_its_grace() -> None:
    m = machine("j")
    m.step(Message("execution_start", {"prompt_id": "j"}, 1))
    assert m.step(Woke(1.0, stop_at=5.0, ahead_unstarted=True)) == (OfferAheadToPeer(), WithdrawAhead())
    assert m.step(Woke(5.0, stop_at=5.0)) == (Interrupt(GRACEFUL_STOP),)
    assert GRACEFUL_STOP.ending is Ending.RELEASED


def test_once_the_run_ended_the_job_ahead_is_left_to_its_own_attempt() -> None:
    job, messages = success()
    m = machine(job)
    feed(m, messages)
    m.poll_within(1.0, 10.0)
    assert m.step(Woke(1.0, stop_at=5.0, ahead_unstarted=True)) == NOTHING  # it may run: followed through the grace


# -- cost --------------------------------------------------------------------------------------------------

def test_a_message_costs_microseconds_and_progress_allocates_no_action() -> None:
    job, messages = success()
    progress = Message("progress", {"prompt_id": job, "value": 1, "max": 20}, 1)
    m = machine(job)
    feed(m, messages[:4])
    assert m.step(progress) is m.step(progress)  # a shared constant: nothing allocated per message
    started = time.perf_counter()
    for _ in range(200):
        feed(machine(job), messages)
    assert (time.perf_counter() - started) / (200 * len(messages)) < 50e-6
