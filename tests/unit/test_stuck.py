"""The pure parts of a stuck prompt's escalation: the supervisor's decision, the out-of-service state of a
runner whose server is not comfysup's, and the reasons people read."""

from __future__ import annotations

import pytest

from comfysup.runner.stuck import OutOfService, StuckChannel, report_stuck, stuck_reason
from comfysup.supervisor.policy import State
from comfysup.supervisor.stuck import Decision, decide


@pytest.mark.parametrize(("reported", "launched", "state", "has_pid", "expected"), [
    (False, True, State.RUNNING, True, Decision.NOTHING),
    (True, False, None, False, Decision.NOTHING),  # [[servers]]: not ours to restart
    (True, True, State.RUNNING, True, Decision.RESTART),
    (True, True, State.STOPPING, True, Decision.WAIT),  # being stopped already: its exit clears it
    (True, True, State.STARTING, True, Decision.CLEAR),  # a new server: the prompt died with the old one
    (True, True, State.BACKOFF, False, Decision.CLEAR),
    (True, True, State.FAILED, False, Decision.CLEAR),
])
def test_the_supervisor_restarts_only_a_running_server_that_holds_the_prompt(
        reported: bool, launched: bool, state: State | None, has_pid: bool, expected: Decision) -> None:
    assert decide(reported, launched, state, has_pid) is expected


def test_out_of_service_until_the_queue_reads_empty() -> None:
    oos = OutOfService(poll_seconds=5.0)
    assert not oos.active and oos.reason is None
    oos.begin("abc", now=100.0)
    assert oos.reason == "out of service: prompt abc stuck after /interrupt"
    assert not oos.due(104.9) and oos.due(105.0)
    assert not oos.seen(105.0, 1) and not oos.due(109.0)
    assert not oos.seen(110.0, None), "a server that does not answer is not back"
    assert oos.seen(115.0, 0) and not oos.active


def test_reasons() -> None:
    assert stuck_reason("gpu0", 60, restarted=True) == ("the prompt did not leave gpu0's queue within 60 s of "
                                                        "/interrupt; the server was restarted")
    assert "gpu0 is out of service until its queue is empty" in stuck_reason("gpu0", 60, restarted=False)


def test_a_report_waits_for_the_restart_only_when_the_parent_restarts_the_server() -> None:
    reported: list[str] = []
    pending = iter([True, True, False, False])
    channel = StuckChannel(restarts=True, report=reported.append, pending=lambda: next(pending))
    alive: list[int] = []
    assert report_stuck(channel, "p1", own=True, alive=lambda: alive.append(1)) is True
    assert reported == ["p1"] and len(alive) == 2
    assert report_stuck(StuckChannel(restarts=True, report=reported.append), "p2", own=False, alive=lambda: None) \
        is False and reported == ["p1"], "a peer's prompt is not this runner's to report"
    assert report_stuck(StuckChannel(report=reported.append), "p3", own=True, alive=lambda: None) is False
    assert reported == ["p1", "p3"]
