"""An operator's orders to a slot, carried out by its supervisor: held (no claim until put back) and a restart
(a drain, then the server's restart), over a real SQLite queue."""

from __future__ import annotations

from pathlib import Path

from comfysup.queue.base import host_name
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.supervisor import orders, recycle
from comfysup.supervisor.children import Unit, new_shared
from comfysup.supervisor.policy import Limits, Policy, State

LIMITS = Limits(startup_seconds=10.0, quick_failure_seconds=30.0, max_quick_failures=2, max_delay_seconds=60.0,
                stop_seconds=5.0)


def _unit(name: str) -> Unit:
    server = Policy(LIMITS, state=State.RUNNING, started_at=0.0, spawned_once=True)
    return Unit(name=name, device="cuda:0", url="http://127.0.0.1:1", plan=None, server=server,
                runner=Policy(LIMITS), shared=new_shared(), server_pid=4242)


def test_a_held_slot_is_not_usable_until_put_back_and_a_restart_drains_it(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "queue.db")
    gpu0, gpu1 = _unit("gpu0"), _unit("gpu1")
    q.orders.hold_slot(host_name(), "gpu0", "ann@10.0.0.1")
    q.orders.hold_slot("another-host", "gpu1", "ann@10.0.0.1")
    q.orders.ask_restart(host_name(), "gpu1", "bo")
    orders.carry_out(q, [gpu0, gpu1], 100.0)
    assert gpu0.held_by == "ann@10.0.0.1" and not gpu0.usable
    assert gpu1.held_by is None and gpu1.draining == "restart asked by bo from the console" and not gpu1.usable
    assert recycle.step(gpu1, 0, 101.0, 0.5)  # the runner holds no job: the server's restart begins
    assert [o.slot for o in q.orders.slot_orders(host_name())] == ["gpu0"]  # the restart ask is done
    q.orders.hold_slot(host_name(), "gpu0", None)
    orders.carry_out(q, [gpu0], 102.0)
    assert gpu0.held_by is None and gpu0.usable
    q.close()
