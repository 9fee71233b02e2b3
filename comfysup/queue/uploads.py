"""The upload role: jobs whose outputs wait in a machine's staging folder for the bucket (state ``storing``).

A runner records a job storing in the transaction that ends its attempt (``Leases.complete(..., staged_in=)``): the
row then has no owner and no lease, so no claim takes it and no lease expires under it. Only the uploader of the
machine that staged the files (``jobs.machine``) takes it here; its writes are fenced by id + attempt + the time
it was staged + state storing, so a job cancelled or requeued meanwhile is left as it is, and two uploaders of one
machine (a restart that overlapped) end it once: the objects' keys are the job's and the file's names, so an
upload repeated overwrites the same object with the same bytes.

A storing job holds no slot: its tenant's ``max_running`` and ``max_queued`` count it neither running nor queued
(comfysup.queue.tenants). Its attempt's seconds are charged to its tenant as the attempt ends storing; it counts
among its tenant's jobs done when ``stored`` makes it done.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from comfysup.queue import ends
from comfysup.queue.db import Role, in_transaction
from comfysup.queue.values import OutboxLevel, Output, StagedJob


class Uploads(Role):
    """Storing jobs, per machine (see the module docstring)."""

    @in_transaction(write=False)
    def staged(self, cur: Any, machine: str, limit: int = 100) -> list[StagedJob]:
        rows = cur.execute(self.db.sql["staged_jobs"], {"machine": machine, "limit": limit}).fetchall()
        return [StagedJob(id=r["id"], attempt=r["attempt"], machine=r["machine"], staged_in=r["staged_in"] or "",
                          staged_at=r["staged_at"], staged_bytes=int(r["staged_bytes"] or 0),
                          outputs=[Output(**o) for o in json.loads(r["outputs"] or "[]")], reason=r["reason"],
                          tenant=r["tenant"])
                for r in rows]

    @in_transaction(write=False)
    def by_machine(self, cur: Any, now: float | None = None) -> dict[str, OutboxLevel]:
        rows = cur.execute(self.db.sql["outbox_uploads_by_machine"], {"now": self.db.time(now)}).fetchall()
        return {str(r["machine"]): OutboxLevel(int(r["n"]), r["age"], int(r["bytes"])) for r in rows}

    @in_transaction(write=False)
    def staging_bytes(self, cur: Any, machine: str) -> int:
        return int(cur.execute(self.db.sql["staging_bytes"], {"machine": machine}).fetchone()["n"])

    @in_transaction()
    def stored(self, cur: Any, job: StagedJob, outputs: Sequence[Output], now: float | None = None) -> bool:
        at = self.db.time(now)
        outputs = ends.with_ids(outputs)
        args = {"outputs": ends.outputs_text(outputs), "now": at, **_fence(job)}
        if cur.execute(self.db.sql["stored"], args).fetchone() is None:
            return False
        ends.made_done(self.db, cur, job.id, outputs, at)
        cur.execute(self.db.sql["stored_for_tenant"], {"tenant": job.tenant})
        return True

    @in_transaction()
    def give_up(self, cur: Any, job: StagedJob, reason: str, now: float | None = None) -> bool:
        at = self.db.time(now)
        args = {"reason": reason, "now": at, **_fence(job)}
        if cur.execute(self.db.sql["storing_dead"], args).fetchone() is None:
            return False
        ends.deliver(self.db, cur, job.id, at)
        return True

    @in_transaction(durable=False)
    def upload_failed(self, cur: Any, job: StagedJob, reason: str) -> None:
        # Not durable: only what status and show say of the last try.
        cur.execute(self.db.sql["upload_failed"], {"reason": reason, **_fence(job)})


def _fence(job: StagedJob) -> dict[str, Any]:
    """The parameters of ``{staged_fence}``: the job still stores the files staged then."""
    return {"id": job.id, "attempt": job.attempt, "staged_at": job.staged_at}
