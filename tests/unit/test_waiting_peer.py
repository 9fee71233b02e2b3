"""No job is queued behind a running prompt while another runner of the machine waits for work
(two jobs on two GPUs run side by side, not one after the other on one)."""

from __future__ import annotations

from comfysup.supervisor.children import new_shared, prepare_runner, waiting_peer


def test_a_peer_waits_only_while_it_may_claim_and_holds_no_job() -> None:
    peer = new_shared()
    assert not waiting_peer([])
    assert not waiting_peer([peer])  # a fresh block: neither allowed to claim nor waiting
    peer.may_claim, peer.waiting = 1, 1
    assert waiting_peer([new_shared(), peer])
    peer.waiting = 0  # it holds a job, or its server is busy with other clients' prompts
    assert not waiting_peer([peer])
    peer.may_claim, peer.waiting = 0, 1  # its server is down or recycled: the supervisor says no claim
    assert not waiting_peer([peer])


def test_a_runner_about_to_start_counts_as_waiting_once_it_may_claim() -> None:
    """A runner forked before its server answers has not asked for work yet: once the supervisor lets it claim,
    its peers leave the next job to it rather than queue it behind their running prompt."""

    class Unit:
        shared = new_shared()

    unit = Unit()
    prepare_runner(unit, 0.0, may_claim=False)  # type: ignore[arg-type]
    assert not waiting_peer([unit.shared])
    unit.shared.may_claim = 1
    assert waiting_peer([unit.shared])
