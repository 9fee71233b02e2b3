"""The intake role: what people do to jobs as a whole: submit them, cancel them, requeue the dead, prune the old.

``submit`` inserts a batch in one transaction, or nothing, with each job's refusals (comfysup.queue.fleet) and
input files (comfysup.queue.assets) in that same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from comfysup.queue import ends
from comfysup.queue.base import DEAD, QUEUED, RUNNING, STORING, NewJob, SubmitConflict, SubmitResult
from comfysup.queue.db import Role, SQLDb, in_transaction
from comfysup.queue.fleet import insert_refusals
from comfysup.queue.specs import SpecCache
from comfysup.queue.tenants import tenant_of

if TYPE_CHECKING:
    from comfysup.queue.assets import Assets
    from comfysup.queue.run_values import PruneBatch

SUBMIT_BATCH = 500
"""Jobs inserted per statement batch: a submit's memory is bounded by it, not by the batch's size."""


class Intake(Role):
    """Submit, cancel, requeue and prune (see comfysup.queue.base for the contract)."""

    def __init__(self, db: SQLDb, assets: Assets) -> None:
        super().__init__(db)
        self.assets = assets

    @in_transaction()
    def submit(self, cur: Any, jobs: Iterable[NewJob], now: float | None = None) -> SubmitResult:
        """Insert a batch in one transaction; memory is bounded by SUBMIT_BATCH, not by the batch size."""
        batches = _Batches(self, cur, self.db.time(now))
        with self.db.bulk(cur):
            batch: list[NewJob] = []
            for job in jobs:
                batch.append(job)
                if len(batch) >= SUBMIT_BATCH:
                    batches.insert(batch)
                    batch = []
            if batch:
                batches.insert(batch)
        if batches.conflicts:
            raise SubmitConflict(batches.conflicts)
        if batches.inserted:
            self.db.notify(cur)
        return SubmitResult(inserted=batches.inserted, existing=batches.existing)

    @in_transaction()
    def cancel(self, cur: Any, ids: Sequence[str], now: float | None = None) -> dict[str, str]:
        """Cancel queued and storing jobs, mark running ones; returns id -> what happened (or 'unknown'). A storing
        job ends at once: a person asked for no result, and its uploader drops the staged files when its end is
        refused (objects already uploaded stay under the job's prefix until ``comfysup prune``)."""
        at = self.db.time(now)
        out: dict[str, str] = {}
        ends_at_once = {QUEUED: "cancel_queued", STORING: "cancel_storing"}
        for job_id in ids:
            row = cur.execute(self.db.sql["job_state"], {"id": job_id}).fetchone()
            if row is None:
                out[job_id] = "unknown"
            elif row["state"] in ends_at_once:
                cur.execute(self.db.sql[ends_at_once[row["state"]]], {"now": at, "id": job_id})
                ends.deliver(self.db, cur, job_id, at)
                out[job_id] = "cancelled"
            elif row["state"] == RUNNING:
                cur.execute(self.db.sql["cancel_running"], {"id": job_id})
                out[job_id] = "cancelling"
            else:
                out[job_id] = f"already {row['state']}"
        return out

    @in_transaction()
    def requeue_dead(self, cur: Any, ids: Sequence[str] | None, now: float | None = None) -> dict[str, str]:
        """Dead jobs back to the queue with attempts reset (``None``: all dead jobs). A storing job named by id too:
        for an operator whose machine is gone with the staged files (``comfysup show`` says which machine and
        folder); its uploader, should it come back, finds the job no longer storing and drops its copy."""
        out: dict[str, str] = {}
        if ids is None:
            out = {r["id"]: "requeued" for r in cur.execute(self.db.sql["requeue_all"]).fetchall()}
        else:
            for job_id in ids:
                out[job_id] = self._requeue_one(cur, job_id)
        if "requeued" in out.values():
            self.db.notify(cur)
        return out

    def _requeue_one(self, cur: Any, job_id: str) -> str:
        row = cur.execute(self.db.sql["job_state"], {"id": job_id}).fetchone()
        if row is None:
            return "unknown"
        if row["state"] not in (DEAD, STORING):
            return f"not dead ({row['state']})"
        cur.execute(self.db.sql["requeue_one"], {"id": job_id})
        return "requeued"

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """Remove up to ``limit`` terminal jobs that finished before ``finished_before`` (their attempts,
        deliveries and workflows no other job uses) in one short transaction; callers repeat until a batch
        comes back empty, so runners wait at most one batch for the write lock. A job whose webhook is still
        being delivered stays until its delivery ends."""
        return self.db.prune(finished_before, limit)

    @in_transaction(write=False)
    def prunable(self, cur: Any, finished_before: float) -> int:
        """How many terminal jobs finished before ``finished_before`` (what ``prune`` would remove, less any
        whose webhook is still pending): the progress total of ``comfysup prune``."""
        return int(cur.execute(self.db.sql["prunable"], {"before": finished_before}).fetchone()["n"])


class _Batches:
    """One submit's chunks as they are inserted: the counts, the conflicts, the caches they share."""

    def __init__(self, intake: Intake, cur: Any, at: float | None) -> None:
        self.intake, self.cur, self.at = intake, cur, at
        self.inserted = self.existing = 0
        self.conflicts: list[str] = []
        self.specs = SpecCache()
        self.stored: set[str] = set()

    def insert(self, batch: list[NewJob]) -> None:
        intake = self.intake
        tenants = [tenant_of(j.tenant) for j in batch]
        intake.db.tenants.arrive(intake.db, self.cur, tenants)
        inserted, existing = intake.db.insert_batch(self.cur, batch, self.at, self.conflicts, self.specs)
        intake.db.tenants.admit(intake.db, self.cur, tenants, intake.db.ADVISORY_LOCKS)
        insert_refusals(intake.db, self.cur, batch)
        intake.assets.insert_assets(self.cur, batch, self.at, self.stored)
        self.inserted += inserted
        self.existing += existing
