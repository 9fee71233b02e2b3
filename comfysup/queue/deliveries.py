"""The delivery role: what a terminal job owes the outside, written in the transaction that ended it
(comfysup.queue.ends ``deliver``): a webhook delivery row, and with [rabbitmq] url a broker announcement (the
outbox). Deliverers take due rows held (two deliverers never send one row at once) and record each try; the
broker's publisher marks the announcements its broker confirmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comfysup.queue import records
from comfysup.queue.db import Role, in_transaction
from comfysup.queue.values import Delivery, OutboxLevel


class Deliveries(Role):
    """Webhook deliveries and the broker outbox (see the module docstring)."""

    def _rows(self, name: str, args: Mapping[str, Any] | None = None) -> list[Any]:
        """A read by query name; rows name their columns."""
        return self.db.transaction(lambda cur: cur.execute(self.db.sql[name], args or {}).fetchall(), write=False,
                                   )

    def deliveries(self, job_id: str) -> list[Delivery]:
        """The webhook deliveries of one job, oldest first."""
        return [records.delivery(r) for r in self._rows("deliveries", {"job_id": job_id})]

    def pending_deliveries(self) -> int:
        return int(self._rows("pending_deliveries")[0]["n"])

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """Due deliveries, each held for ``hold_seconds`` (its ``next_at`` pushed ahead) so that another
        deliverer does not send it meanwhile; a deliverer that dies leaves it due again after the hold."""
        return self.db.claim_deliveries(limit, hold_seconds, now)

    @in_transaction()
    def delivery_result(self, cur: Any, delivery_id: int, *, delivered: bool, status: int | None, error: str | None,
                        next_at: float | None, now: float | None = None) -> None:
        """One try of a delivery: counted; delivered, due again at ``next_at``, or given up (None)."""
        cur.execute(self.db.sql["delivery_result"], {"status": status, "error": error, "delivered": delivered,
                                                     "now": self.db.time(now),
                                                     "next_at": None if delivered else next_at, "id": delivery_id})

    def pending_announcements(self, limit: int) -> list[tuple[int, str, str]]:
        """The broker outbox's oldest unconfirmed rows: ``(row id, job id, terminal state)``."""
        return [(r["id"], r["job_id"], r["state"]) for r in self._rows("pending_announcements", {"limit": limit})]

    def mark_announced(self, ids: Sequence[int], now: float | None = None) -> None:
        """The broker confirmed these rows; a row marked twice stays sent."""
        if ids:
            self._mark(ids, now)

    @in_transaction(durable=False)
    def _mark(self, cur: Any, ids: Sequence[int], now: float | None) -> None:
        # Not durable: an announcement whose mark is lost in a power cut is published again (at least once).
        at = self.db.time(now)
        for row_id in ids:
            cur.execute(self.db.sql["announced"], {"now": at, "id": row_id})

    def announcement_backlog(self) -> int:
        """Broker announcements not yet confirmed (the outbox backlog)."""
        return int(self._rows("announcement_backlog")[0]["n"])

    def announcements(self, job_id: str) -> list[dict[str, Any]]:
        """One job's broker announcements (id, state, created_at, sent_at), oldest first."""
        return [dict(r) for r in self._rows("announcements_of", {"job_id": job_id})]

    @in_transaction(write=False)
    def outboxes(self, cur: Any, now: float | None = None) -> dict[str, OutboxLevel]:
        """What each outbox holds now, with its oldest's age (see comfysup.queue.roles)."""
        at = {"now": self.db.time(now)}
        uploads = cur.execute(self.db.sql["outbox_uploads"], at).fetchone()
        out = {"uploads": OutboxLevel(int(uploads["n"]), uploads["age"], int(uploads["bytes"]))}
        for name, query in (("webhooks", "outbox_webhooks"), ("broker", "outbox_broker")):
            row = cur.execute(self.db.sql[query], at).fetchone()
            out[name] = OutboxLevel(int(row["n"]), row["age"])
        return out
