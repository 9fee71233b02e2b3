"""Where each machine's Comfy API v2 is reached by the others: one ``api_endpoints`` row per machine.

Several machines share a PostgreSQL queue but not always a result store: a job's files are on the disk of the
machine that ran it (``JobRecord.machine``). Each API process writes here the URL at which the other machines
reach it and refreshes it with a heartbeat; an API asked for an output it does not hold streams it from the
machine that does while that machine's heartbeat is fresh (comfysup.api.remote). Ages are measured on the clock
that stamped the heartbeat (the database's on PostgreSQL), as for the machine registry.

Whoever can write the queue can point a machine's row elsewhere; that is no new power (the same writer can change
every job), and an API sends there only the fleet's own token, which the queue's writers are trusted with.

A role of the queue over its database (comfysup.queue.db); the SQL is in sql/queries.sql (``advertise_api``,
``withdraw_api``, ``api_endpoint``).
"""

from __future__ import annotations

from typing import Any

from comfysup.queue import values
from comfysup.queue.db import Role, in_transaction
from comfysup.queue.values import ApiEndpoint


class Endpoints(Role):
    """The API registry (see the module docstring)."""

    @in_transaction(durable=False)
    def advertise_api(self, cur: Any, host: str, url: str, pid: int, now: float | None = None) -> None:
        """Insert or refresh ``host``'s API at ``url`` (not durable: a heartbeat lost in a power cut is the next
        one's to write)."""
        at = self.db.time(now)
        cur.execute(self.db.sql["advertise_api"], {"host": host, "url": url, "pid": pid, "now": at})

    @in_transaction(durable=False)
    def withdraw_api(self, cur: Any, host: str, pid: int) -> None:
        """Remove ``host``'s row if process ``pid`` wrote it last (a newer process's row stays)."""
        cur.execute(self.db.sql["withdraw_api"], {"host": host, "pid": pid})

    @in_transaction(write=False)
    def api_endpoint(self, cur: Any, host: str, now: float | None = None) -> ApiEndpoint | None:
        """``host``'s advertised API and the age of its heartbeat; None when it advertises none."""
        row = cur.execute(self.db.sql["api_endpoint"], {"now": self.db.time(now), "host": host}).fetchone()
        return None if row is None else values.ApiEndpoint(host, str(row["url"]), max(0.0, float(row["age"])))
