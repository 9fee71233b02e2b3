"""An operator's orders to this machine's slots, as the console wrote them in the queue (comfysup.queue.orders):
read at each housekeeping pass and carried out here.

- Held: ``Unit.held_by`` is set, so the slot is not usable (comfysup.supervisor.children ``Unit.usable``) and
  its runner's ``may_claim`` stays 0: the job it runs finishes, no other is claimed, until the slot is put back.
- A restart: the slot is drained as a recycle is (comfysup.supervisor.recycle ``drain``: the job finishes, then
  the server restarts), and the ask is marked done. A slot without a server of comfysup's ([[servers]]) cannot
  be restarted from here: the ask is marked done and the log says why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from comfysup.errors import QueueError
from comfysup.queue.base import Queue, host_name
from comfysup.supervisor.children import Unit
from comfysup.supervisor.recycle import drain

log = logging.getLogger("comfysup.supervisor")


def carry_out(queue: Queue, units: Sequence[Unit], now: float) -> None:
    """Read this host's orders and apply them to ``units``; a queue that does not answer changes nothing."""
    host = host_name()
    try:
        orders = {o.slot: o for o in queue.orders.slot_orders(host)}
    except QueueError as exc:
        log.debug("the slots' orders could not be read: %s", exc)
        return
    for unit in units:
        order = orders.get(unit.name)
        held = order.held_by if order is not None else None
        if held != unit.held_by:
            log.info("%s: %s", unit.name, f"held by {held} from the console: it finishes its job and claims no "
                     "other" if held else "put back from the console: it claims jobs again")
            unit.held_by = held
        if order is None or order.restart_at is None:
            continue
        if unit.server is None:
            log.warning("%s: a restart was asked by %s, but its server is not comfysup's ([[servers]])", unit.name,
                        order.restart_by)
        elif unit.draining is None:
            drain(unit, now, f"restart asked by {order.restart_by} from the console")
        else:
            continue  # already draining: the ask stays until this drain's restart is done
        try:
            queue.orders.restart_done(host, unit.name, order.restart_at)
        except QueueError as exc:
            log.debug("the restart ask could not be marked done: %s", exc)
