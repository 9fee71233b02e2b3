"""The SQLite dialect's own statements that need more than one line of SQL: a submit's batch insert (numbered
here, so its spec rows need no round trip), the claim, lease expiry, a fenced write, webhook deliveries held, and
prune.
Plain functions of a connection inside a transaction that ``SQLiteDb`` (sqlite.py: the file, its
connection and its locks) has begun; the SQL text is ``sql/sqlite.sql``'s.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from comfysup.queue import queries, values
from comfysup.queue.base import NewJob
from comfysup.queue.db import ClaimAsk, note_passed_over
from comfysup.queue.specs import SpecCache, dumps_plain
from comfysup.queue.tenants import tenant_of
from comfysup.workflows import model_key

if TYPE_CHECKING:
    from comfysup.queue.run_values import PruneBatch

SQL = queries.load("sqlite")
PRUNED = ("prune_jobs", "prune_specs", "prune_refusals", "prune_attempts", "prune_deliveries", "prune_announcements",
          "prune_output_assets", "prune_previews")
"""What a prune batch deletes, by the batch's seqs or ids (its parameters ``seqs`` and ``ids``)."""
SUBMIT_CACHE_KIB = -16384
"""PRAGMA cache_size during a submit: 16 MiB (negative: KiB), the id index of about 200,000 jobs."""


def id_list(ids: Sequence[str]) -> str:
    """Ids as one JSON array parameter (``json_each`` in the SQL)."""
    return json.dumps(list(ids))


def model_key_of_text(text: str | None) -> str | None:
    """SQL's ``comfysup_model_key(workflow text)``: the model a workflow loads (comfysup.workflows.model_key)."""
    try:
        return model_key(json.loads(text)) if text else None
    except ValueError:
        return None


@contextlib.contextmanager
def bulk(conn: sqlite3.Connection) -> Iterator[None]:
    """A larger page cache while a submit inserts: job ids are random, so each insert lands on a random
    page of the id index, and with the default 2 MB cache a 100,000-job submit spent a fifth of its
    time writing out and reading back those pages. Given back after, so a long-lived process keeps the
    default."""
    size = conn.execute("PRAGMA cache_size").fetchone()[0]
    conn.execute(f"PRAGMA cache_size = {SUBMIT_CACHE_KIB}")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA cache_size = {int(size)}")


def insert_batch(conn: sqlite3.Connection, batch: list[NewJob], at: float | None,
                 conflicts: list[str], cache: SpecCache) -> tuple[int, int]:
    """Every row of a chunk numbered here (seq), so its spec row needs no round trip per job."""
    known = {r["id"]: r["spec_hash"] for r in conn.execute(SQL["known_ids"], {"ids": id_list([j.id for j in batch])})}
    fresh = []
    specs = []
    seq = conn.execute(SQL["last_seq"]).fetchone()["seq"]
    for job in batch:
        if job.id in known:
            if known[job.id] != job.spec_hash:
                conflicts.append(job.id)
            continue
        known[job.id] = job.spec_hash  # a repeat later in this same chunk is judged like one in the table
        seq += 1
        text, digest = cache.template(job)
        workflow_id = cache.ids.get(digest)
        if workflow_id is None:
            if len(cache.ids) >= 4096:
                cache.ids.clear()
            row = conn.execute(SQL["workflow_id"], {"hash": digest}).fetchone()
            workflow_id = cache.ids[digest] = row["id"] if row else conn.execute(
                SQL["insert_workflow"], {"hash": digest, "workflow": text}).lastrowid
        fresh.append({"seq": seq, "id": job.id, "priority": job.priority, "now": at, "spec_hash": job.spec_hash,
                      "workflow_name": job.workflow_name, "callback_url": job.callback_url or None,
                      "model_key": cache.model_key(job), "tenant": tenant_of(job.tenant)})
        specs.append({"seq": seq, "workflow_id": workflow_id, "extra_data": dumps_plain(job.extra_data),
                      "meta": dumps_plain(job.meta), "params": dumps_plain(job.params)})
    conn.executemany(SQL["insert_job"], fresh)
    conn.executemany(SQL["insert_spec"], specs)
    return len(fresh), len(batch) - len(fresh)


def take(conn: sqlite3.Connection, ask: ClaimAsk, at: float, cached: Mapping[int, Any]) -> dict[str, Any] | None:
    """Several statements, under the write lock: the head (or the affine pick: one statement, three index
    seeks), the job's row, its spec, its workflow unless cached, its attempt row, and the seconds its tenant is
    expected to hold added to the tenant's share."""
    expire_leases(conn, at)
    picked = _pick(conn, ask, at)
    if picked is None:
        return None
    seq, head = picked
    lease_until = at + ask.lease_seconds
    job = conn.execute(SQL["take"], {"owner": ask.owner, "server": ask.server, "lease_until": lease_until,
                                     "now": at, "seq": seq}).fetchone()
    spec = conn.execute(SQL["spec"], {"seq": seq}).fetchone()
    text = None
    if spec["workflow_id"] not in cached:
        text = conn.execute(SQL["workflow_text"], {"id": spec["workflow_id"]}).fetchone()["workflow"]
    conn.execute(SQL["open_attempt"], {"job_id": job["id"], "attempt": job["attempt"], "owner": ask.owner,
                                       "server": ask.server, "now": at, "url": ask.url,
                                       "expected": head["expected"]})
    if head["expected"]:
        conn.execute(SQL["hold_share"], {"tenant": head["tenant"], "expected": head["expected"]})
    return {**dict(job), **dict(spec), "owner": ask.owner, "server": ask.server, "lease_until": lease_until,
            "workflow": text}


def _pick(conn: sqlite3.Connection, ask: ClaimAsk, at: float) -> tuple[int, sqlite3.Row] | None:
    """The seq of the job to take, the head (or with affinity the affine pick, noting the head passed over), and
    the head's row (its ``tenant`` and ``expected`` seconds)."""
    if not ask.affinity:
        row = conn.execute(SQL["head"], {"now": at, "cat": ask.catalogue}).fetchone()
        return None if row is None else (row["seq"], row)
    row = conn.execute(SQL["pick"], {"now": at, "wait": ask.max_wait_seconds, "key": ask.prefer_model,
                                     "cat": ask.catalogue}).fetchone()
    if row is None:
        return None
    seq = row["affine"] if row["affine"] is not None else row["head"]
    note_passed_over(SQL, conn, row, seq, at)
    return seq, row


def expire_leases(conn: sqlite3.Connection, at: float) -> None:
    """Running jobs whose lease passed are queued again; their attempt stays counted."""
    if conn.execute(SQL["any_expired"], {"now": at}).fetchone() is None:
        return
    for r in conn.execute(SQL["expire"], {"now": at}).fetchall():
        conn.execute(SQL["end_expired"], {"now": at, "job_id": r["id"], "attempt": r["attempt"]})


def fenced(conn: sqlite3.Connection, job_sql: str, job_args: Mapping[str, Any], attempt_sql: str | None = None,
           attempt_args: Mapping[str, Any] | None = None) -> Any:
    rows = conn.execute(job_sql, job_args).fetchall()
    if not rows:
        return None
    if attempt_sql is not None:
        conn.execute(attempt_sql, attempt_args or {})
    return rows[0]


def hold_deliveries(conn: sqlite3.Connection, at: float, limit: int, until: float) -> list[sqlite3.Row]:
    rows = conn.execute(SQL["due_deliveries"], {"now": at, "limit": limit}).fetchall()
    conn.executemany(SQL["hold_delivery"], [{"until": until, "id": r["id"]} for r in rows])
    return rows


def prune(conn: sqlite3.Connection, finished_before: float, limit: int) -> PruneBatch:
    rows = conn.execute(SQL["prune_batch"], {"before": finished_before, "limit": limit}).fetchall()
    if not rows:
        return values.PruneBatch(removed=[])
    batch = {"seqs": json.dumps([r["seq"] for r in rows]), "ids": id_list([r["id"] for r in rows])}
    used = [r["workflow_id"] for r in conn.execute(SQL["prune_workflows_of"], batch)]
    for name in PRUNED:
        conn.execute(SQL[name], batch)
    gone = sum(conn.execute(SQL["prune_workflow"], {"id": w}).rowcount for w in used)
    return values.PruneBatch(removed=[(r["id"], r["machine"]) for r in rows], workflows_removed=gone)
