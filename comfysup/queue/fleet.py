"""What the queue knows of the servers and machines that run its jobs: each server's node catalogue,
the jobs a catalogue refused, and each supervisor's row in the machine registry.

A role of the queue over its database (comfysup.queue.db): a job it strands or refuses ends through
comfysup.queue.ends, as a runner's own end does. The SQL is in sql/queries.sql.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from comfysup.queue import ends, records
from comfysup.queue.base import DEAD, CatalogueRecord, Machine, NewJob
from comfysup.queue.db import Role, in_transaction
from comfysup.workflows import canonical

if TYPE_CHECKING:
    from comfysup.queue.db import SQLDb
    from comfysup.queue.run_values import Claim


def insert_refusals(db: SQLDb, cur: Any, batch: Sequence[NewJob]) -> None:
    """The refusals a submit's jobs bring (comfysup.jobs.catalogue), in its transaction."""
    rows = [{"catalogue_id": catalogue_id, "reason": reason, "job_id": job.id}
            for job in batch for catalogue_id, reason in job.refused]
    if rows:
        cur.executemany(db.sql["insert_refusal"], rows)


class Fleet(Role):
    """Node catalogues, refusals and the machine registry (see the module docstring)."""

    # -- node catalogues -----------------------------------------------------------------------------------

    def record_catalogue(self, runner: str, machine: str, info: dict[str, Any], now: float | None = None) -> int:
        """Store a server's /object_info once per distinct text and say that (runner, machine) has it now; its
        id is what the runner's claims pass as ``catalogue``."""
        text = canonical(info)
        digest = hashlib.sha256(text.encode()).hexdigest()
        # Durable: the transaction may make stranded jobs dead and queue their webhooks, an end (one per server start).
        return self.db.transaction(self._record_catalogue, runner, machine, text, digest, now)

    def _record_catalogue(self, cur: Any, runner: str, machine: str, text: str, digest: str,
                          now: float | None) -> int:
        sql, at = self.db.sql, self.db.time(now)
        cur.execute(sql["insert_catalogue"], {"hash": digest, "info": text, "now": at})
        catalogue_id = cur.execute(sql["catalogue_id"], {"hash": digest}).fetchone()["id"]
        cur.execute(sql["server_catalogue"], {"runner": runner, "machine": machine, "catalogue_id": catalogue_id,
                                              "now": at})
        # A changed catalogue may leave jobs that every current one refused: no claim would ever take them.
        for job_id in [r["id"] for r in cur.execute(sql["stranded_jobs"]).fetchall()]:
            why = "; ".join(dict.fromkeys(r["reason"] for r in cur.execute(sql["refusals_of"], {"id": job_id})))
            cur.execute(sql["dead_queued"], {"now": at, "reason": f"no server can run it: {why}", "id": job_id})
            ends.deliver(self.db, cur, job_id, at)
        return int(catalogue_id)

    @in_transaction(write=False)
    def catalogues(self, cur: Any) -> list[CatalogueRecord]:
        """The catalogues some server has now (by id), each with the servers (``runner@machine``) that have it."""
        rows = cur.execute(self.db.sql["current_catalogues"]).fetchall()
        found: dict[int, CatalogueRecord] = {}
        for r in rows:
            record = found.get(r["id"])
            if record is None:
                record = found[r["id"]] = CatalogueRecord(int(r["id"]), json.loads(r["info"]), [])
            record.servers.append(f"{r['runner']}@{r['machine']}")
        return list(found.values())

    @in_transaction()
    def refuse(self, cur: Any, claim: Claim, catalogue: int, reason: str, now: float | None = None) -> bool:
        """The claiming server's catalogue cannot run the job: recorded, so no claim of that catalogue takes it
        again, and the job released without counting the attempt; dead-lettered instead when no server's
        current catalogue can run it. True when it was dead-lettered."""
        sql = self.db.sql
        cur.execute(sql["insert_refusal"], {"catalogue_id": catalogue, "reason": reason, "job_id": claim.id})
        able = cur.execute(sql["able_servers"], {"id": claim.id}).fetchone()["n"]
        if able:
            ends.release(self.db, cur, claim, f"this server cannot run it ({reason}); left for a server that can",
                         False, now, "catalogue", None)
            return False
        refusals = cur.execute(sql["refusals_of"], {"id": claim.id}).fetchall()
        why = "; ".join(dict.fromkeys(r["reason"] for r in refusals))
        ends.finish(self.db, cur, claim, DEAD, f"no server can run it: {why}", now, "catalogue", None)
        return True

    # -- machines ------------------------------------------------------------------------------------------

    def register_machine(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                         now: float | None = None) -> None:
        """A supervisor starts: its row replaces earlier rows of the same host (a host runs one supervisor
        per queue)."""
        self.db.transaction(self._machine, host, pid, slots, now, True)

    def machine_heartbeat(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                          now: float | None = None, *, wait_seconds: float | None = None) -> None:
        """Refresh the heartbeat and the slots (recreating the row if it was removed). ``wait_seconds``: wait at
        most this long for a write lock another process holds (SQLite), else DatabaseLocked."""
        self.db.transaction(self._machine, host, pid, slots, now, False, busy_seconds=wait_seconds)

    def _machine(self, cur: Any, host: str, pid: int, slots: Sequence[dict[str, Any]], now: float | None,
                 fresh: bool) -> None:
        """A supervisor's row; ``fresh`` (it starts): earlier rows of its host go first."""
        at = self.db.time(now)
        if fresh:
            cur.execute(self.db.sql["forget_machine"], {"host": host})
        cur.execute(self.db.sql["machine_heartbeat"],
                    {"host": host, "pid": pid, "slots": json.dumps(list(slots)), "now": at})

    @in_transaction(write=False)
    def machines(self, cur: Any, now: float | None = None) -> list[Machine]:
        """The supervisors sharing the queue, with how long ago each was heard from."""
        rows = cur.execute(self.db.sql["machines"], {"now": self.db.time(now)}).fetchall()
        return [records.machine(r) for r in rows]
