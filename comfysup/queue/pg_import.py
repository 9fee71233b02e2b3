"""PostgreSQL's ``import_records``: what ``comfysup migrate`` copies a SQLite queue's jobs into it with."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from comfysup import assets
from comfysup.errors import QueueError
from comfysup.queue import pg_statements
from comfysup.queue.assets import Assets
from comfysup.queue.base import QUEUED, JobRecord, NewAsset
from comfysup.queue.db import SQLDb
from comfysup.queue.queries import load
from comfysup.queue.records import dumps
from comfysup.queue.specs import SpecCache, dumps_plain
from comfysup.workflows import canonical, content_hash, model_key

SQL = load("postgres")


@dataclass
class ImportResult:
    """What ``import_records`` did: rows inserted, already there with the same content, and conflicts."""

    inserted: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    attempts: int = 0
    assets: int = 0
    """Input files stored now (each content once; those already here are only linked to their jobs)."""


def import_records(db: SQLDb, store: Assets, records: Sequence[JobRecord], *, with_attempts: bool,
               source_file: Callable[[str], str | None] = lambda digest: None) -> ImportResult:
    """Copy jobs as they are (state, attempts, times) in one transaction: an id already here with the
    same spec_hash is left alone, with another one it is a conflict; attempt rows come only with the
    jobs inserted now, so running this twice copies nothing twice. The input files of the jobs inserted
    are stored in the same transaction (``source_file``: where a content's bytes are to be read) and
    linked to them, so no job arrives without its inputs."""
    result = ImportResult()

    def copy(cur: psycopg.Cursor[Any]) -> None:
        if not records:
            return
        fresh = _fresh(cur, records, result)
        _insert_jobs(cur, fresh)
        attempts = _attempt_rows(fresh) if with_attempts else []
        if attempts:
            cur.executemany(SQL["import_attempt"], attempts)
        cur.executemany(SQL["add_output_asset"],
                        [{"asset_id": o.id, "job_id": r.id} for r in fresh for o in r.outputs if o.id])
        result.assets = _import_inputs(db, store, cur, fresh, source_file)
        result.inserted = [r.id for r in fresh]
        result.attempts = len(attempts)
        if any(r.state == QUEUED for r in fresh):
            db.notify(cur)

    db.transaction(copy)
    return result


def _fresh(cur: Any, records: Sequence[JobRecord], result: ImportResult) -> list[JobRecord]:
    """The records whose id is not here yet; an id already here goes to ``existing`` with the same spec_hash,
    to ``conflicts`` with another one (and a repeated id within ``records`` counts as already here)."""
    rows = cur.execute(SQL["known_ids"], {"ids": [r.id for r in records]}).fetchall()
    known = {row["id"]: row["spec_hash"] for row in rows}
    fresh: list[JobRecord] = []
    for r in records:
        if r.id in known:
            (result.existing if known[r.id] == r.spec_hash else result.conflicts).append(r.id)
            continue
        known[r.id] = r.spec_hash
        fresh.append(r)
    return fresh


def _insert_jobs(cur: Any, fresh: Sequence[JobRecord]) -> None:
    """The jobs' rows; a batch's jobs share one stored template, copied once, not once per job."""
    memo: dict[str, str] = {}
    stored = [_stored_template(r, memo) for r in fresh]
    specs = SpecCache()
    pg_statements.workflow_ids(cur, {h: t for t, h in stored}, specs)
    cur.executemany(SQL["import_job"], [_job_row(r, specs.ids[h]) for r, (_t, h) in zip(fresh, stored, strict=True)])
    cur.executemany(SQL["add_tenant"], [{"name": name} for name in sorted({r.tenant for r in fresh})])  # claimable


def _attempt_rows(fresh: Sequence[JobRecord]) -> list[dict[str, Any]]:
    """The parameters of ``import_attempt``: every attempt of the jobs inserted now, as it was recorded."""
    return [{"job_id": r.id, "attempt": a.attempt, "owner": a.owner, "server": a.server,
             "started_at": a.started_at, "ended_at": a.ended_at, "outcome": a.outcome, "reason": a.reason,
             "prompt_number": a.prompt_number, "kind": a.kind, "trace": dumps(a.trace)}
            for r in fresh for a in r.attempts]


def _import_inputs(db: SQLDb, store: Assets, cur: Any, fresh: Sequence[JobRecord],
                   source_file: Callable[[str], str | None]) -> int:
    stored: set[str] = set()
    for record in fresh:
        refs = {assets.ref_hash(ref): ref for *_where, ref in assets.references(record.workflow)}
        refs.update({assets.ref_hash(ref): ref for ref in assets.in_params(record.params).values()})
        for digest, ref in refs.items():
            if digest not in stored and cur.execute(db.sql["asset_size"], {"hash": digest}).fetchone() is None:
                path = source_file(digest)
                if path is None:
                    raise QueueError(f"job {record.id} needs input {assets.short(ref)}, whose bytes are not in "
                                     "the queue being migrated; nothing of this chunk was copied")
                store.store(cur, NewAsset(digest, os.path.getsize(path), assets.ref_name(ref), path), time.time())
                stored.add(digest)
            cur.execute(db.sql["insert_job_asset"], {"hash": digest, "job_id": record.id})
    return len(stored)


def _job_row(r: JobRecord, workflow_id: int) -> dict[str, Any]:
    """The parameters of ``import_job``: the job as it is in the queue it is copied from."""
    return {"id": r.id, "state": r.state, "priority": r.priority, "run_after": r.run_after, "attempt": r.attempt,
            "owner": r.owner, "server": r.server, "lease_until": r.lease_until, "started_at": r.started_at,
            "cancel_requested": r.cancel_requested, "submitted_at": r.submitted_at, "finished_at": r.finished_at,
            "reason": r.reason, "outputs": json.dumps([o._asdict() for o in r.outputs]) if r.outputs else None,
            "machine": r.machine, "last_server": r.last_server, "last_prompt_number": r.last_prompt_number,
            "spec_hash": r.spec_hash, "workflow_name": r.workflow_name, "workflow_id": workflow_id,
            "extra_data": dumps_plain(r.extra_data), "meta": dumps_plain(r.meta), "params": dumps_plain(r.params),
            "progress": dumps(r.progress), "callback_url": r.callback_url,
            "model_key": r.model_key if r.model_key is not None else model_key(r.workflow),
            "staged_at": r.staged_at, "staged_in": r.staged_in,
            "staged_bytes": sum(o.size for o in r.outputs) if r.state == "storing" else None, "tenant": r.tenant}


def _stored_template(record: JobRecord, memo: dict[str, str]) -> tuple[str, str]:
    """The text and hash to store for a migrated job: its template (shared by its batch), else its workflow.
    ``memo`` remembers recent texts, so a batch's 10 KB template is hashed once rather than once per job."""
    text = canonical(record.template if record.template is not None else record.workflow)
    digest = memo.get(text)
    if digest is None:
        if len(memo) >= 64:
            memo.clear()
        digest = memo[text] = content_hash(text)
    return text, digest
