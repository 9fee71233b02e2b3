"""PostgreSQL's own statements that need more than one line of SQL: a submit's batch insert, the claim (one
statement with SKIP LOCKED), and prune. Plain functions of a cursor inside a transaction that ``PostgresDb``
(postgres.py: the connections) has begun; the SQL text is ``sql/postgres.sql``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from comfysup.queue import queries
from comfysup.queue.db import ClaimAsk
from comfysup.queue.specs import SpecCache, dumps_plain
from comfysup.queue.tenants import CLAIM_LOCK, tenant_of
from comfysup.queue.values import NewJob, PruneBatch

SQL = queries.load("postgres")


def workflow_ids(cur: psycopg.Cursor[Any], texts: dict[str, str], cache: SpecCache) -> None:
    """Each workflow's id by hash, inserted when new. The upsert locks an existing row until this transaction
    ends, so a ``prune`` running now cannot delete a workflow that this submit is about to reference (its
    delete waits, then the foreign key keeps the row)."""
    missing = {h: t for h, t in texts.items() if h not in cache.ids}
    if not missing:
        return
    if len(cache.ids) >= 4096:
        cache.ids.clear()
    rows = cur.execute(SQL["insert_workflows"], {"hashes": list(missing), "texts": list(missing.values())}).fetchall()
    cache.ids.update({r["hash"]: r["id"] for r in rows})


def insert_batch(cur: psycopg.Cursor[Any], batch: list[NewJob], now: float | None, conflicts: list[str],
                 specs: SpecCache) -> tuple[int, int]:
    """Insert what is new (ON CONFLICT DO NOTHING: a concurrent submit of the same id cannot fail), then judge
    every row that was not inserted by its spec_hash."""
    stored = [specs.template(j) for j in batch]
    workflow_ids(cur, {h: t for t, h in stored}, specs)
    cur.execute(SQL["insert_jobs"], {"now": now, **_columns(batch, [specs.ids[h] for _t, h in stored], specs)})
    fresh = {r["id"] for r in cur.fetchall()}
    rest = _not_inserted(batch, fresh)
    known: dict[str, str] = {}
    if rest:
        rows = cur.execute(SQL["known_ids"], {"ids": list({j.id for j in rest})}).fetchall()
        known = {r["id"]: r["spec_hash"] for r in rows}
    refused = [job.id for job in rest if known.get(job.id) != job.spec_hash]
    conflicts.extend(refused)
    return len(fresh), len(rest) - len(refused)


COLUMNS = ("ids", "priorities", "spec_hashes", "workflow_names", "workflow_ids", "extra_datas", "metas", "paramses",
           "callback_urls", "model_keys", "tenants")
"""The array parameters of ``insert_jobs``, one a column."""


def _columns(batch: list[NewJob], workflow_ids: list[int], specs: SpecCache) -> dict[str, list[Any]]:
    """The batch as ``insert_jobs`` takes it: one array per column, by its parameter's name (COLUMNS)."""
    rows = [(j.id, j.priority, j.spec_hash, j.workflow_name, workflow_id, dumps_plain(j.extra_data),
             dumps_plain(j.meta), dumps_plain(j.params), j.callback_url or None, specs.model_key(j),
             tenant_of(j.tenant))
            for j, workflow_id in zip(batch, workflow_ids, strict=True)]
    return {name: list(column) for name, column in zip(COLUMNS, zip(*rows, strict=True), strict=True)}


def _not_inserted(batch: list[NewJob], fresh: set[str]) -> list[NewJob]:
    """The jobs of a batch that its insert did not add: an id that appears twice in the batch is inserted once,
    and its other copies are judged like rows already in the table."""
    rest = [j for j in batch if j.id not in fresh]
    seen: set[str] = set()
    for job in batch:
        if job.id in fresh and job.id not in seen:
            seen.add(job.id)
        elif job.id in fresh:
            rest.append(job)
    return rest


def take(cur: psycopg.Cursor[Any], ask: ClaimAsk, now: float | None, cached: Mapping[int, Any], capped: bool = False
         ) -> dict[str, Any] | None:
    """Expired leases go back to the queue, then the next ready job is taken in one statement (planned as
    claim_plan says): the claim's row by name, with ``head``, ``priority`` and ``tenant`` for the affinity's
    staircase. ``capped``: a tenant has a max_running, so the claim first takes the claim lock
    (comfysup.queue.tenants)."""
    cur.execute(SQL["claim_plan"])
    cur.execute(SQL["expire"], {"now": now})
    if capped:
        cur.execute(SQL["lock_claims"], {"key": CLAIM_LOCK})
    taken = cur.execute(
        SQL["claim_affine" if ask.affinity else "claim_strict"],
        {"owner": ask.owner, "server": ask.server, "lease": ask.lease_seconds, "now": now, "key": ask.prefer_model,
         "wait": ask.max_wait_seconds, "cached": list(cached), "cat": ask.catalogue, "url": ask.url})
    row = taken.fetchone()
    if row is None:
        return None
    return {**row, "owner": ask.owner, "server": ask.server}


def prune(cur: psycopg.Cursor[Any], finished_before: float, limit: int) -> PruneBatch:
    """A batch of old terminal jobs and the workflows no job uses any more (see ``PostgresDb.prune``)."""
    rows = cur.execute(SQL["prune_batch"], {"before": finished_before, "limit": limit}).fetchall()
    removed = 0
    for workflow_id in sorted({r["workflow_id"] for r in rows}):
        cur.execute("SAVEPOINT prune_workflow")
        try:
            removed += cur.execute(SQL["prune_workflow"], {"id": workflow_id}).rowcount
            cur.execute("RELEASE SAVEPOINT prune_workflow")
        except psycopg.errors.ForeignKeyViolation:
            cur.execute("ROLLBACK TO SAVEPOINT prune_workflow")
    return PruneBatch(removed=[(r["id"], r["machine"]) for r in rows], workflows_removed=removed)
