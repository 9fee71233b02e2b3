"""What the queue knows of the servers and machines that run its jobs: each server's node catalogue (issue 15),
the jobs a catalogue refused, and each supervisor's row in the machine registry.

A mixin of comfysup.queue.core.SQLQueue, like the asset store and the API registry: it writes through the
core's ``_transaction`` and ends jobs through its ``_release``, ``_finish`` and ``_deliver``. The SQL is in
sql/queries.sql.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from comfysup.queue.base import DEAD, CatalogueRecord, NewJob
from comfysup.queue.reads import fetch
from comfysup.workflows import canonical

if TYPE_CHECKING:
    from comfysup.queue.run_values import Claim


class Fleet:
    """Node catalogues, refusals and the machine registry of SQLQueue (see the module docstring)."""

    sql: dict[str, str]

    def _transaction(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _time(self, now: float | None) -> float | None:
        raise NotImplementedError

    def _deliver(self, cur: Any, job_id: str, at: float | None) -> None:
        raise NotImplementedError

    def _release(self, cur: Any, claim: Claim, reason: str, count_attempt: bool, now: float | None,
                 kind: str | None, trace: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def _finish(self, cur: Any, claim: Claim, state: str, reason: str, now: float | None, kind: str | None,
                trace: dict[str, Any] | None) -> None:
        raise NotImplementedError

    # -- node catalogues -----------------------------------------------------------------------------------

    def record_catalogue(self, runner: str, machine: str, info: dict[str, Any], now: float | None = None) -> int:
        """Store a server's /object_info once per distinct text and say that (runner, machine) has it now; its
        id is what the runner's claims pass as ``catalogue``."""
        text = canonical(info)
        import hashlib  # here: only a runner records a catalogue, and every command imports this module

        digest = hashlib.sha256(text.encode()).hexdigest()
        # Durable: the transaction may make stranded jobs dead and queue their webhooks, an end (one per server start).
        return self._transaction(self._record_catalogue, runner, machine, text, digest, now)

    def _record_catalogue(self, cur: Any, runner: str, machine: str, text: str, digest: str,
                          now: float | None) -> int:
        at = self._time(now)
        cur.execute(self.sql["insert_catalogue"], (digest, text, at))
        (catalogue_id,) = cur.execute(self.sql["catalogue_id"], (digest,)).fetchone()
        cur.execute(self.sql["server_catalogue"], (runner, machine, catalogue_id, at))
        # A changed catalogue may leave jobs that every current one refused: no claim would ever take them.
        for (job_id,) in cur.execute(self.sql["stranded_jobs"]).fetchall():
            why = "; ".join(dict.fromkeys(r[1] for r in cur.execute(self.sql["refusals_of"], (job_id,)).fetchall()))
            cur.execute(self.sql["dead_queued"], (at, f"no server can run it: {why}", job_id))
            self._deliver(cur, job_id, at)
        return int(catalogue_id)

    def catalogues(self) -> list[CatalogueRecord]:
        """The catalogues some server has now (by id), each with the servers (``runner@machine``) that have it."""
        rows = self._transaction(fetch, self.sql["current_catalogues"], (), write=False)
        found: dict[int, CatalogueRecord] = {}
        for catalogue_id, text, runner, machine in rows:
            record = found.get(catalogue_id)
            if record is None:
                record = found[catalogue_id] = CatalogueRecord(int(catalogue_id), json.loads(text), [])
            record.servers.append(f"{runner}@{machine}")
        return list(found.values())

    def _insert_refusals(self, cur: Any, batch: Sequence[NewJob]) -> None:
        rows = [(catalogue_id, reason, job.id) for job in batch for catalogue_id, reason in job.refused]
        if rows:
            cur.executemany(self.sql["insert_refusal"], rows)

    def refuse(self, claim: Claim, catalogue: int, reason: str, now: float | None = None) -> bool:
        """The claiming server's catalogue cannot run the job: recorded, so no claim of that catalogue takes it
        again, and the job released without counting the attempt; dead-lettered instead when no server's
        current catalogue can run it. True when it was dead-lettered."""
        return self._transaction(self._refuse, claim, catalogue, reason, now)

    def _refuse(self, cur: Any, claim: Claim, catalogue: int, reason: str, now: float | None) -> bool:
        cur.execute(self.sql["insert_refusal"], (catalogue, reason, claim.id))
        (able,) = cur.execute(self.sql["able_servers"], (claim.id,)).fetchone()
        if able:
            self._release(cur, claim, f"this server cannot run it ({reason}); left for a server that can", False,
                          now, "catalogue", None)
            return False
        refusals = cur.execute(self.sql["refusals_of"], (claim.id,)).fetchall()
        why = "; ".join(dict.fromkeys(r[1] for r in refusals))
        self._finish(cur, claim, DEAD, f"no server can run it: {why}", now, "catalogue", None)
        return True

    # -- machines ------------------------------------------------------------------------------------------

    def register_machine(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                         now: float | None = None) -> None:
        self._transaction(self._machine, host, pid, slots, now, True)

    def machine_heartbeat(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                          now: float | None = None, *, wait_seconds: float | None = None) -> None:
        self._transaction(self._machine, host, pid, slots, now, False, busy_seconds=wait_seconds)

    def _machine(self, cur: Any, host: str, pid: int, slots: Sequence[dict[str, Any]], now: float | None,
                 fresh: bool) -> None:
        """A supervisor's row; ``fresh`` (it starts): earlier rows of its host go first."""
        at = self._time(now)
        if fresh:
            cur.execute(self.sql["forget_machine"], (host,))
        cur.execute(self.sql["machine_heartbeat"], (host, pid, json.dumps(list(slots)), at, at))
