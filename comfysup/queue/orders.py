"""The order role: what an operator asks of a slot from the console, kept in the queue so that any machine's
console reaches any machine's supervisor (``slot_orders``, one row per host and slot).

- Held: the slot's runner finishes the job it runs and claims no other until the slot is put back (the
  supervisor reads its host's orders at each housekeeping pass and keeps the runner's ``may_claim`` at 0).
- A restart asked at a time: the supervisor drains the slot (its job finishes), restarts its server, and marks
  the ask done (``restart_done``, only when no newer ask came meanwhile).

Written once for both backends; a person's order is durable (it must outlive a supervisor's restart).
"""

from __future__ import annotations

from typing import Any

from comfysup.queue.db import Role, in_transaction
from comfysup.queue.search import spell
from comfysup.records import Record

UPSERT = ("INSERT INTO slot_orders (host, slot, held_by, restart_at, restart_by, changed_at) "
          "VALUES (:host, :slot, :held_by, NULL, NULL, {now}) ON CONFLICT (host, slot) DO UPDATE SET ")


class SlotOrder(Record):
    host: str
    slot: str
    held_by: str | None
    """Who holds the slot (None: not held)."""
    restart_at: float | None
    """When a restart of its server was asked (None: none pending)."""
    restart_by: str | None


class Orders(Role):
    """Operators' orders to slots (see the module's docstring)."""

    def _run(self, cur: Any, sql: str, args: dict[str, Any]) -> Any:
        return cur.execute(spell(self.db.DIALECT, sql.replace("{now}", self.db.sql["now"])), args)

    @in_transaction()
    def hold_slot(self, cur: Any, host: str, slot: str, by: str | None, now: float | None = None) -> None:
        """Hold the slot for ``by`` (its runner claims nothing more), or put it back (``by`` None)."""
        self._run(cur, UPSERT + "held_by = excluded.held_by, changed_at = excluded.changed_at",
                  {"host": host, "slot": slot, "held_by": by, "now": self.db.time(now)})

    @in_transaction()
    def ask_restart(self, cur: Any, host: str, slot: str, by: str, now: float | None = None) -> None:
        """Ask the slot's supervisor to restart its server once its job is over."""
        at = self.db.time(now)
        self._run(cur, UPSERT + "changed_at = excluded.changed_at", {"host": host, "slot": slot, "held_by": None,
                                                                      "now": at})
        self._run(cur, "UPDATE slot_orders SET restart_at = {now}, restart_by = :by WHERE host = :host AND "
                  "slot = :slot", {"host": host, "slot": slot, "by": by, "now": at})

    @in_transaction()
    def restart_done(self, cur: Any, host: str, slot: str, asked_at: float) -> None:
        """The restart asked at ``asked_at`` began: that ask is done (a newer one stays)."""
        self._run(cur, "UPDATE slot_orders SET restart_at = NULL, restart_by = NULL WHERE host = :host AND "
                  "slot = :slot AND restart_at = :asked", {"host": host, "slot": slot, "asked": asked_at})

    @in_transaction(write=False)
    def slot_orders(self, cur: Any, host: str | None = None) -> list[SlotOrder]:
        """The orders of ``host``'s slots (None: every host's) that say something: held, or a restart pending."""
        where = "(held_by IS NOT NULL OR restart_at IS NOT NULL)" + (" AND host = :host" if host is not None else "")
        rows = self._run(cur, f"SELECT host, slot, held_by, restart_at, restart_by FROM slot_orders WHERE {where} "
                         "ORDER BY host, slot", {"host": host}).fetchall()
        return [SlotOrder(r["host"], r["slot"], r["held_by"], r["restart_at"], r["restart_by"]) for r in rows]
