"""Where each machine's Comfy API v2 is reached by the others (issue 18): one ``api_endpoints`` row per machine.

Several machines share a PostgreSQL queue but not always a result store: a job's files are on the disk of the
machine that ran it (``JobRecord.machine``). Each API process writes here the URL at which the other machines
reach it and refreshes it with a heartbeat; an API asked for an output it does not hold streams it from the
machine that does while that machine's heartbeat is fresh (comfysup.api.remote). Ages are measured on the clock
that stamped the heartbeat (the database's on PostgreSQL), as for the machine registry.

Whoever can write the queue can point a machine's row elsewhere; that is no new power (the same writer can change
every job), and an API sends there only the fleet's own token, which the queue's writers are trusted with.

A mixin of comfysup.queue.core.SQLQueue; the SQL is in sql/queries.sql (``advertise_api``, ``withdraw_api``,
``api_endpoint``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from comfysup.queue import values

if TYPE_CHECKING:
    from comfysup.queue.run_values import ApiEndpoint


class ApiEndpoints:
    """The API registry of SQLQueue (see the module docstring)."""

    sql: dict[str, str]

    def _transaction(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _time(self, now: float | None) -> float | None:
        raise NotImplementedError

    def advertise_api(self, host: str, url: str, pid: int, now: float | None = None) -> None:
        """Insert or refresh ``host``'s API at ``url`` (not durable: a heartbeat lost in a power cut is the next
        one's to write)."""
        self._transaction(self._advertise, host, url, pid, now, durable=False)

    def _advertise(self, cur: Any, host: str, url: str, pid: int, now: float | None) -> None:
        at = self._time(now)
        cur.execute(self.sql["advertise_api"], (host, url, pid, at, at))

    def withdraw_api(self, host: str, pid: int) -> None:
        """Remove ``host``'s row if process ``pid`` wrote it last (a newer process's row stays)."""
        self._transaction(self._withdraw, host, pid, durable=False)

    def _withdraw(self, cur: Any, host: str, pid: int) -> None:
        cur.execute(self.sql["withdraw_api"], (host, pid))

    def api_endpoint(self, host: str, now: float | None = None) -> ApiEndpoint | None:
        """``host``'s advertised API and the age of its heartbeat; None when it advertises none."""
        return self._transaction(self._endpoint, host, now, write=False)

    def _endpoint(self, cur: Any, host: str, now: float | None) -> ApiEndpoint | None:
        row = cur.execute(self.sql["api_endpoint"], (self._time(now), host)).fetchone()
        return None if row is None else values.ApiEndpoint(host, str(row[0]), max(0.0, float(row[1])))
