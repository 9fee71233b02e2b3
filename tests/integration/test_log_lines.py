"""Log lines that read as sentences: a dead runner's released claim said `runner runner
process died`, and a released attempt `released without counting the attempt (…; attempt not counted)`."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from queue_contract import T0, make_job

from comfysup.commands.work import Work
from comfysup.config import build_config
from comfysup.queue.base import Claim
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.loop import Runner
from comfysup.runner.result import Outcome


class FakeOps:
    """Forks hand out made-up pids; exits are what the test says (as in test_supervisor_stop)."""

    def __init__(self) -> None:
        self.next_pid = 4_000_000
        self.ended: list[tuple[int, int]] = []

    def fork(self, child: Any) -> int:
        self.next_pid += 1
        return self.next_pid

    def kill(self, pid: int, sig: int) -> bool:
        return True

    def reap(self) -> list[tuple[int, int]]:
        ended, self.ended = self.ended, []
        return ended


def work_with_a_claim(tmp_path: Path) -> tuple[Work, FakeOps, SQLiteQueue, int]:
    ops = FakeOps()
    config = build_config({"queue": {"path": str(tmp_path / "q.db")}}, env={})
    work = Work(config, {"gpu0": "http://127.0.0.1:9"}, until_empty=False, ops=ops)  # type: ignore[arg-type]
    runner = work.manager.fork_runner("gpu0", lambda token: 0)
    queue = SQLiteQueue(tmp_path / "q.db")
    work.queue = queue
    queue.intake.submit([make_job(1)], now=T0)
    assert queue.leases.claim(runner.owner, "gpu0", 30.0) is not None
    return work, ops, queue, runner.pid


def test_a_dead_runners_release_reads_as_a_sentence(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    work, ops, queue, pid = work_with_a_claim(tmp_path)
    ops.ended.append((pid, signal.SIGKILL))
    with caplog.at_level(logging.INFO):
        work.tick(1000.0)
    queue.close()
    lines = [r.getMessage() for r in caplog.records if "released" in r.getMessage()]
    assert lines == [f"gpu0: released {make_job(1).id}: runner process died (killed by SIGKILL)"]
    assert "runner runner" not in caplog.text


def test_a_released_attempt_says_attempt_not_counted_once_and_outside_parentheses(
        caplog: pytest.LogCaptureFixture) -> None:
    claim = Claim(id=make_job(1).id, attempt=1, owner="h/1/gpu0/t", server="gpu0", workflow={}, extra_data={},
                  lease_until=0.0)
    outcome = Outcome("released", "interrupted by a graceful stop; attempt not counted", kind="shutdown")
    with caplog.at_level(logging.INFO):
        Runner._log(SimpleNamespace(server="gpu0"), claim, outcome)  # type: ignore[arg-type]
    assert caplog.records[-1].getMessage() == (f"job {claim.id}: released, interrupted by a graceful stop; "
                                               "attempt not counted")
