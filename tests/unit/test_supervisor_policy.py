"""The restart policy as a table: set a state, call transition(now), check the actions and the new state.

No process, no socket, no clock: supervisord's way of testing Subprocess.transition().
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from comfysup.supervisor.policy import Action, Limits, Policy, State, backoff_delay

LIMITS = Limits(startup_seconds=10.0, quick_failure_seconds=5.0, max_quick_failures=3, max_delay_seconds=4.0,
                stop_seconds=2.0)
T = 1000.0


def policy(state: State, **fields: Any) -> Policy:
    p = Policy(LIMITS, state=state, spawned_once=state is not State.STOPPED, started_at=fields.pop("started_at", T))
    for key, value in fields.items():
        setattr(p, key, value)
    return p


@pytest.mark.parametrize(("given", "now", "observed", "actions", "state", "checks"), [
    # a fresh policy starts its process once
    (policy(State.STOPPED, spawned_once=False), T, {}, [Action.SPAWN], State.STOPPED, {}),
    # after a shutdown nothing is started again
    (policy(State.STOPPED, spawned_once=True), T, {}, [], State.STOPPED, {}),
    # starting: waiting for the first answer
    (policy(State.STARTING), T + 1, {}, [], State.STARTING, {}),
    (policy(State.STARTING), T + 1, {"answered": True}, [], State.RUNNING, {"answered_at": T + 1}),
    # an exit before it ever answered is a boot failure, counted as quick however late it came
    (policy(State.STARTING), T + 9, {"exited": "exit code 1"}, [], State.BACKOFF,
     {"quick_failures": 1, "retry_at": T + 9 + 1}),
    # no answer within startup_seconds: killed, counted, and the kill's exit is not counted again
    (policy(State.STARTING), T + 10, {}, [Action.KILL], State.BACKOFF,
     {"quick_failures": 1, "awaiting_exit": True}),
    # running: an exit soon after the start is quick, with a growing delay
    (policy(State.RUNNING, quick_failures=1), T + 2, {"exited": "killed by SIGKILL"}, [], State.BACKOFF,
     {"quick_failures": 2, "retry_at": T + 2 + 2}),
    # an exit after it stayed up restarts from the shortest delay and is not a quick failure
    (policy(State.RUNNING, quick_failures=2), T + 60, {"exited": "killed by SIGKILL"}, [], State.BACKOFF,
     {"quick_failures": 0, "retry_at": T + 60 + 1}),
    # staying up past quick_failure_seconds forgets earlier quick failures
    (policy(State.RUNNING, quick_failures=2), T + 6, {}, [], State.RUNNING, {"quick_failures": 0}),
    # the last allowed quick failure makes it failed: no restart, no loop
    (policy(State.RUNNING, quick_failures=2), T + 1, {"exited": "exit code 1"}, [], State.FAILED,
     {"quick_failures": 3, "retry_at": None}),
    (policy(State.STARTING, quick_failures=2), T + 10, {}, [Action.KILL], State.FAILED, {"awaiting_exit": True}),
    # backoff: spawn when the delay has passed, not before, and never before a killed process is gone
    (policy(State.BACKOFF, retry_at=T + 4), T + 3.9, {}, [], State.BACKOFF, {}),
    (policy(State.BACKOFF, retry_at=T + 4), T + 4, {}, [Action.SPAWN], State.BACKOFF, {}),
    (policy(State.BACKOFF, retry_at=T + 4, awaiting_exit=True), T + 5, {}, [], State.BACKOFF, {}),
    (policy(State.BACKOFF, retry_at=T + 4, awaiting_exit=True, quick_failures=1), T + 5,
     {"exited": "killed by SIGKILL"}, [Action.SPAWN], State.BACKOFF, {"quick_failures": 1, "awaiting_exit": False}),
    # failed stays failed whatever happens
    (policy(State.FAILED), T + 100, {"exited": "exit code 1"}, [], State.FAILED, {}),
    (policy(State.FAILED), T + 100, {"answered": True}, [], State.FAILED, {}),
    # recycling: a deliberate stop, then a restart at once that counts no failure
    (policy(State.RUNNING), T + 20, {"recycle": "recycled after 2 job(s)"}, [Action.TERM], State.STOPPING,
     {"stop_deadline": T + 22}),
    (policy(State.STOPPING, stop_deadline=T + 22, quick_failures=0), T + 21, {"exited": "killed by SIGTERM"},
     [Action.SPAWN], State.STOPPING, {"quick_failures": 0}),
    (policy(State.STOPPING, stop_deadline=T + 22), T + 22, {}, [Action.KILL], State.STOPPING, {"stop_deadline": None}),
    (policy(State.STOPPING, stop_deadline=None), T + 30, {}, [], State.STOPPING, {}),
])
def test_transition_table(given: Policy, now: float, observed: dict[str, Any], actions: list[Action], state: State,
                          checks: dict[str, Any]) -> None:
    p = replace(given)
    assert p.transition(now, **observed) == actions
    assert p.state is state
    for key, value in checks.items():
        assert getattr(p, key) == value, key


def test_backoff_delays_grow_and_are_capped() -> None:
    assert [backoff_delay(n, 4.0) for n in range(1, 6)] == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_server_that_always_exits_at_start_backs_off_then_fails() -> None:
    """The whole life of a slot whose server exits at once: spawn, exit, wait 1 s, 2 s, then failed."""
    p = Policy(LIMITS)
    now = T
    spawns = []
    for _ in range(20):
        actions = p.transition(now)
        if Action.SPAWN in actions:
            spawns.append(now)
            p.spawned(now)
            now += 0.1
            p.transition(now, exited="exit code 1")
        now += 0.5
        if p.state is State.FAILED:
            break
    assert p.state is State.FAILED
    assert len(spawns) == LIMITS.max_quick_failures
    assert [round(b - a, 1) for a, b in itertools.pairwise(spawns)] == [1.1, 2.1]
    assert p.restarts == 2
    assert "3 quick failures in a row" in p.reason and "exit code 1" in p.reason


def test_a_failed_spawn_counts_as_a_quick_failure() -> None:
    p = Policy(LIMITS)
    assert p.transition(T) == [Action.SPAWN]
    p.spawn_failed(T, "port 8188 is already in use by pid 42 (python -m http.server)")
    assert p.state is State.BACKOFF
    assert "pid 42" in p.reason
    assert p.transition(T + 1) == [Action.SPAWN]
    p.spawned(T + 1)
    assert p.restarts == 1
    assert p.transition(T + 2, answered=True) == []
    assert p.state is State.RUNNING
