"""The attempt's hold on its leases while the queue does not answer (comfysup.runner.hold), as a pure rule."""

from __future__ import annotations

import math

import pytest

from comfysup.errors import DatabaseUnavailable
from comfysup.runner.hold import Keeper, LeaseHold, Verdict, reserve_seconds


def test_the_reserve_is_a_heartbeat_and_two_waits() -> None:
    assert reserve_seconds(5.0, 5.0) == 15.0


def test_a_failed_renewal_keeps_the_prompt_until_the_lease_end_is_within_the_reserve() -> None:
    hold = LeaseHold(lease_seconds=60.0, reserve_seconds=15.0, renewed_at=100.0)
    assert hold.failed(101.0, math.inf) is Verdict.KEEP
    assert hold.failing_since == 101.0
    assert hold.failed(144.9, math.inf) is Verdict.KEEP
    assert hold.failed(145.0, math.inf) is Verdict.GIVE_UP  # 160 - 15
    assert hold.failing_since == 101.0  # the first failure of the outage


def test_a_job_taken_ahead_renewed_earlier_brings_the_end_forward() -> None:
    hold = LeaseHold(lease_seconds=60.0, reserve_seconds=15.0, renewed_at=100.0)
    assert hold.failed(140.0, 90.0) is Verdict.GIVE_UP  # its lease ends at 150


def test_a_renewal_that_holds_ends_the_outage_and_moves_the_lease_on() -> None:
    hold = LeaseHold(lease_seconds=60.0, reserve_seconds=15.0, renewed_at=100.0)
    hold.failed(110.0, math.inf)
    assert hold.renewed(130.0) == 20.0
    assert hold.failing_since is None and hold.held_until(math.inf) == 190.0
    assert hold.renewed(131.0) is None


def test_the_keeper_retries_soon_and_raises_once_the_lease_is_spent() -> None:
    now = [100.0]
    retries: list[float] = []
    keeper = Keeper(LeaseHold(10.0, 3.0, 100.0), lambda: now[0], retries.append, lambda: math.inf, "job")

    def down() -> bool:
        raise DatabaseUnavailable("db: the database does not answer", maybe_stored=True)

    assert keeper.renew(down) is None and keeper.failing and retries == [101.0]
    now[0] = 107.0
    with pytest.raises(DatabaseUnavailable, match="too close to go on") as info:
        keeper.renew(down)
    assert info.value.maybe_stored
    assert keeper.renew(lambda: True) is True and not keeper.failing
