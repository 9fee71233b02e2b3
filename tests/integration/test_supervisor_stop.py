"""The shutdown plan as a table (set a phase, call ``step(now)``), and ``comfysup work`` on the supervisor's
process manager: a dead runner's claim is released at once, a stop releases without counting.

Unit tier: no process, no socket; the work tests use a real SQLite queue in a temp dir and a fake ProcessOps.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from queue_contract import T0, make_job

from comfysup.commands.work import Work
from comfysup.config import build_config
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.supervisor.policy import Action
from comfysup.supervisor.stop import (
    KILL_WAIT_SECONDS,
    MONITOR_STOP_SECONDS,
    RUNNER_STOP_MARGIN_SECONDS,
    Phase,
    StopPlan,
    Target,
)

T = 1000.0
GRACE = 60.0
RUNNERS_TERM = (Target.RUNNERS, Action.TERM)
RUNNERS_KILL = (Target.RUNNERS, Action.KILL)
SERVERS_TERM = (Target.SERVERS, Action.TERM)
SERVERS_KILL = (Target.SERVERS, Action.KILL)
MONITOR_TERM = (Target.MONITOR, Action.TERM)
MONITOR_KILL = (Target.MONITOR, Action.KILL)


def test_begin_asks_the_runners_and_gives_them_the_grace_and_a_margin() -> None:
    plan = StopPlan()
    assert not plan.stopping and plan.keeps_monitor
    assert plan.begin(T, GRACE) == [RUNNERS_TERM]
    assert (plan.phase, plan.deadline) == (Phase.RUNNERS, T + GRACE + RUNNER_STOP_MARGIN_SECONDS)
    assert plan.keeps_monitor  # webhooks of jobs that end in the grace still go out
    assert plan.begin(T + 1, GRACE) == []  # once


# phase, killed, deadline, (runners, servers, monitor) alive, now → actions, phase after
TABLE: list[tuple[Phase, bool, float, tuple[bool, bool, bool], float, list[Any], Phase]] = [
    # runners: waited for until the deadline, then SIGKILLed
    (Phase.RUNNERS, False, T + 70, (True, True, True), T + 10, [], Phase.RUNNERS),
    (Phase.RUNNERS, False, T + 70, (True, True, True), T + 70, [RUNNERS_KILL], Phase.KILLING_RUNNERS),
    (Phase.RUNNERS, False, T + 70, (False, True, True), T + 10, [SERVERS_TERM], Phase.SERVERS),
    # every runner and server gone already: straight on to the monitor
    (Phase.RUNNERS, False, T + 70, (False, False, True), T + 10, [SERVERS_TERM, MONITOR_TERM], Phase.MONITOR),
    (Phase.RUNNERS, False, T + 70, (False, False, False), T + 10, [SERVERS_TERM], Phase.DONE),
    # killed runners: their exits are waited for, at most KILL_WAIT_SECONDS
    (Phase.KILLING_RUNNERS, False, T + 5, (True, True, True), T + 1, [], Phase.KILLING_RUNNERS),
    (Phase.KILLING_RUNNERS, False, T + 5, (True, True, True), T + 5, [SERVERS_TERM], Phase.SERVERS),
    (Phase.KILLING_RUNNERS, False, T + 5, (False, True, True), T + 1, [SERVERS_TERM], Phase.SERVERS),
    # servers: SIGTERM, SIGKILL after the deadline, then at most one more wait
    (Phase.SERVERS, False, T + 5, (False, True, True), T + 1, [], Phase.SERVERS),
    (Phase.SERVERS, False, T + 5, (False, True, True), T + 5, [SERVERS_KILL], Phase.SERVERS),
    (Phase.SERVERS, True, T + 10, (False, True, True), T + 9, [], Phase.SERVERS),
    (Phase.SERVERS, True, T + 10, (False, True, True), T + 10, [MONITOR_TERM], Phase.MONITOR),
    (Phase.SERVERS, False, T + 5, (False, False, True), T + 1, [MONITOR_TERM], Phase.MONITOR),
    # a cold stop: everything was SIGKILLed; its exits are waited for, then the monitor
    (Phase.KILLED, False, T + 5, (True, False, True), T + 1, [], Phase.KILLED),
    (Phase.KILLED, False, T + 5, (True, False, True), T + 5, [MONITOR_TERM], Phase.MONITOR),
    (Phase.KILLED, False, T + 5, (False, False, True), T + 1, [MONITOR_TERM], Phase.MONITOR),
    # the monitor: SIGTERM, a few seconds for a webhook try, SIGKILL, then done
    (Phase.MONITOR, False, T + 3, (False, False, True), T + 1, [], Phase.MONITOR),
    (Phase.MONITOR, False, T + 3, (False, False, True), T + 3, [MONITOR_KILL], Phase.MONITOR),
    (Phase.MONITOR, True, T + 8, (False, False, True), T + 8, [], Phase.DONE),
    (Phase.MONITOR, False, T + 3, (False, False, False), T + 1, [], Phase.DONE),
    (Phase.DONE, False, T, (True, True, True), T + 100, [], Phase.DONE),
]


@pytest.mark.parametrize(("phase", "killed", "deadline", "alive", "now", "actions", "after"), TABLE)
def test_the_stop_table(phase: Phase, killed: bool, deadline: float, alive: tuple[bool, bool, bool], now: float,
                        actions: list[Any], after: Phase) -> None:
    plan = StopPlan(phase=phase, deadline=deadline, killed=killed)
    runners, servers, monitor = alive
    assert plan.step(now, runners=runners, servers=servers, monitor=monitor) == actions
    assert plan.phase is after
    assert plan.done is (after is Phase.DONE)


def test_deadlines_of_the_phases_after_the_runners() -> None:
    plan = StopPlan(phase=Phase.RUNNERS, deadline=T)
    plan.step(T, runners=True, servers=True, monitor=True)
    assert plan.deadline == T + KILL_WAIT_SECONDS
    plan.step(T + 1, runners=False, servers=True, monitor=True)
    assert (plan.phase, plan.deadline) == (Phase.SERVERS, T + 1 + KILL_WAIT_SECONDS)
    plan.step(T + 2, runners=False, servers=False, monitor=True)
    assert (plan.phase, plan.deadline) == (Phase.MONITOR, T + 2 + MONITOR_STOP_SECONDS)
    assert not plan.keeps_monitor  # a monitor that dies now is not started again


def test_a_cold_stop_kills_runners_and_servers_at_once_and_only_once() -> None:
    plan = StopPlan()
    assert plan.cold_stop(T, GRACE) == [RUNNERS_TERM, RUNNERS_KILL, SERVERS_KILL]
    assert (plan.phase, plan.cold, plan.deadline) == (Phase.KILLED, True, T + KILL_WAIT_SECONDS)
    assert plan.cold_stop(T + 1, GRACE) == []
    graceful = StopPlan()
    graceful.begin(T, GRACE)
    assert graceful.cold_stop(T + 1, GRACE) == [RUNNERS_KILL, SERVERS_KILL]  # runners were asked already


# -- comfysup work: the same process manager as the supervisor --------------------------------------------


class FakeOps:
    """Forks hand out made-up pids; exits are what the test says; signals are recorded."""

    def __init__(self) -> None:
        self.next_pid = 4_000_000
        self.killed: list[tuple[int, int]] = []
        self.ended: list[tuple[int, int]] = []

    def fork(self, child: Any) -> int:
        self.next_pid += 1
        return self.next_pid

    def kill(self, pid: int, sig: int) -> bool:
        self.killed.append((pid, sig))
        return True

    def reap(self) -> list[tuple[int, int]]:
        ended, self.ended = self.ended, []
        return ended


def work_with_a_claim(tmp_path: Path) -> tuple[Work, FakeOps, SQLiteQueue, int, str]:
    ops = FakeOps()
    config = build_config({"queue": {"path": str(tmp_path / "q.db")}}, env={})
    work = Work(config, {"gpu0": "http://127.0.0.1:9", "gpu1": "http://127.0.0.1:9"}, until_empty=False,
                ops=ops)  # type: ignore[arg-type]
    runners = [work.manager.fork_runner(name, lambda token: 0) for name in work.servers]
    queue = SQLiteQueue(tmp_path / "q.db")
    work.queue = queue
    job = make_job(1)
    queue.intake.submit([job], now=T0)
    assert queue.leases.claim(runners[0].owner, "gpu0", 30.0) is not None
    return work, ops, queue, runners[0].pid, job.id


def test_work_releases_a_dead_runners_claim_at_once_and_counts_the_attempt(tmp_path: Path) -> None:
    work, ops, queue, pid, job_id = work_with_a_claim(tmp_path)
    ops.ended.append((pid, signal.SIGKILL))  # the wait status of a process killed by SIGKILL
    work.tick(T)
    record = queue.reads.get(job_id)
    assert (record.state, record.attempt) == ("queued", 1)
    assert "runner process died (killed by SIGKILL)" in (record.reason or "")
    assert work.failed == ["comfysup-runner-gpu0 exited with killed by SIGKILL"]
    assert len(work.manager.runners) == 1  # the other one runs on
    # It died waiting for work (as far as its block said) and is not started again: its peer must not keep
    # giving queued jobs back for it ([runner] queue_ahead).
    from comfysup.supervisor.children import waiting_peer

    assert not waiting_peer([work.shared["gpu0"]])
    queue.close()


def test_work_stops_gracefully_then_cold_and_releases_without_counting(tmp_path: Path) -> None:
    work, ops, queue, _pid, job_id = work_with_a_claim(tmp_path)
    work.manager.signals.append(signal.SIGTERM)
    work.tick(T)
    assert sorted(ops.killed) == sorted((p, signal.SIGTERM) for p in work.manager.runners)
    ops.killed.clear()
    work.manager.signals.append(signal.SIGINT)  # the second signal: cold
    work.tick(T + 1)
    assert sorted(ops.killed) == sorted((p, signal.SIGKILL) for p in work.manager.runners)
    ops.ended += [(p, signal.SIGKILL) for p in work.manager.runners]
    work.tick(T + 2)
    assert not work.manager.runners
    record = queue.reads.get(job_id)
    assert (record.state, record.attempt) == ("queued", 0)  # a stop is not the job's fault
    assert record.reason == "comfysup work stopping (cold stop of comfysup work); attempt not counted"
    queue.close()


# -- the supervisor: the monitor's restarts and the stop, ticked by hand ----------------------------------


def test_the_monitor_restarts_by_its_policy_and_stops_last(tmp_path: Path) -> None:
    from comfysup.supervisor.policy import State
    from comfysup.supervisor.supervisor import Supervisor

    ops = FakeOps()
    config = build_config({"queue": {"path": str(tmp_path / "var" / "q.db")}, "comfyui": {"gpus": "cpu:1"},
                           "servers": [{"name": "remote0", "url": "http://127.0.0.1:9"}],
                           "api": {"listen": ""}}, env={})  # the monitor alone: the API is another test's
    sup = Supervisor(config, ops=ops, env={}, clock=lambda: T)  # type: ignore[arg-type]
    sup.units = [u for u in sup.build_units() if u.plan is None]
    sup.monitor_wanted = True
    sup.tick(T)
    first = sup.monitor.pid
    assert first is not None and sup.units[0].runner_pid is not None
    ops.ended.append((first, 1 << 8))  # exit code 1
    sup.tick(T + 1)
    assert sup.monitor.pid is None and sup.monitor.policy.state is State.BACKOFF
    sup.tick(T + 1.5)
    assert sup.monitor.pid is None  # the first restart waits 1 s
    sup.tick(T + 2)
    assert sup.monitor.pid not in (None, first) and sup.monitor.policy.restarts == 1

    sup.manager.signals.append(signal.SIGTERM)
    sup.tick(T + 3)
    runner = sup.units[0].runner_pid
    assert ops.killed == [(runner, signal.SIGTERM)]  # the runners first; the monitor keeps delivering
    ops.ended.append((runner, 0))
    sup.tick(T + 4)
    assert ops.killed[-1] == (sup.monitor.pid, signal.SIGTERM) and not sup.finished
    ops.ended.append((sup.monitor.pid, 0))
    sup.tick(T + 5)
    assert sup.finished and sup.monitor.policy.state is State.STOPPED


class SpawningOps(FakeOps):
    """FakeOps that also spawns commands (the API child) and records group signals."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[list[str]] = []
        self.group_killed: list[tuple[int, int]] = []

    def spawn(self, argv: list[str], **kwargs: Any) -> int:
        self.spawned.append(argv)
        return self.fork(None)

    def killpg(self, pid: int, sig: int) -> bool:
        self.group_killed.append((pid, sig))
        return True


def _api_supervisor(tmp_path: Path) -> tuple[Any, SpawningOps]:
    from comfysup.supervisor.supervisor import Supervisor

    ops = SpawningOps()
    config = build_config({"queue": {"path": str(tmp_path / "var" / "q.db")}, "comfyui": {"gpus": "cpu:1"},
                           "servers": [{"name": "remote0", "url": "http://127.0.0.1:9"}],
                           "api": {"listen": "127.0.0.1:0"}}, env={})
    sup = Supervisor(config, ops=ops, env={}, clock=lambda: T)  # type: ignore[arg-type]
    sup.units = [u for u in sup.build_units() if u.plan is None]
    sup.monitor_wanted = True
    return sup, ops


def test_the_api_child_is_restarted_after_a_crash_and_signalled_as_a_group_at_the_end(tmp_path: Path) -> None:
    sup, ops = _api_supervisor(tmp_path)
    sup.tick(T)
    first = sup.api.pid
    assert first is not None and ops.spawned[-1][1:5] == ["-m", "comfysup", "api", "--existing-queue"]
    ops.ended.append((first, signal.SIGKILL))  # killed: restarted by its policy after its back-off
    sup.tick(T + 1)
    assert sup.api.pid is None
    sup.tick(T + 2)
    assert sup.api.pid not in (None, first) and len(ops.spawned) == 2

    sup.manager.signals.append(signal.SIGTERM)
    sup.tick(T + 3)
    ops.ended.append((sup.units[0].runner_pid, 0))
    sup.tick(T + 4)  # runners gone: the sidecars are told to stop, the API as its whole process group
    assert (sup.api.pid, signal.SIGTERM) in ops.group_killed
    assert (sup.api.pid, signal.SIGTERM) not in ops.killed


def test_an_api_that_cannot_bind_its_address_is_not_started_again(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    sup, ops = _api_supervisor(tmp_path)
    sup.tick(T)
    ops.ended.append((sup.api.pid, 3 << 8))  # exit code 3: BIND_FAILED
    for second in range(1, 30):
        sup.tick(T + second)
    assert len(ops.spawned) == 1 and sup.api.pid is None and not sup.api.wanted
    assert "no API: [api] listen = '127.0.0.1:0' cannot be bound" in caplog.text
    assert sup.monitor.pid is not None  # the rest goes on
