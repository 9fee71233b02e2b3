"""How an attempt ends, as steps of a transaction another role has begun: the fence, the attempt row's end, the
webhook and broker announcement a terminal job owes. The lease role ends its own attempts with these; the fleet
(a refused job released or dead-lettered) and the intake (a queued job cancelled) end jobs with them too."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from comfysup.errors import LeaseLost
from comfysup.queue import records
from comfysup.queue.asset_ids import new_asset_id
from comfysup.queue.base import RELEASED, RELEASED_UNCOUNTED

if TYPE_CHECKING:
    from comfysup.queue.db import SQLDb
    from comfysup.queue.run_values import Claim, Output


def fence(claim: Claim) -> dict[str, Any]:
    """The parameters of every fenced statement's guard (``{fence}``, ``{attempt_row}``): the row is still this
    claim's."""
    return {"id": claim.id, "attempt": claim.attempt, "owner": claim.owner}


def held(db: SQLDb, cur: Any, claim: Claim, job_sql: str, job_args: Mapping[str, Any],
         attempt_sql: str | None = None, attempt_args: Mapping[str, Any] | None = None) -> Any:
    """``db.fenced``, raising LeaseLost (nothing changed) when the row is no longer this claim's."""
    if (row := db.fenced(cur, job_sql, job_args, attempt_sql, attempt_args)) is None:
        raise lost(claim)
    return row


def lost(claim: Claim) -> LeaseLost:
    """What a fenced write raises when the row is no longer this claim's."""
    return LeaseLost(f"job {claim.id}: attempt {claim.attempt} of {claim.owner} no longer holds the job")


def end(db: SQLDb, cur: Any, claim: Claim, job_sql: str, job_args: Mapping[str, Any], at: float | None,
        outcome: str, reason: str | None, kind: str | None, trace: dict[str, Any] | None) -> Any:
    """A fenced write that ends the claim's attempt with its outcome, reason class and trace (its preview goes).
    ``job_args`` name the job statement's own parameters; the fence and the time are added here."""
    row = held(db, cur, claim, job_sql, {**job_args, **fence(claim), "now": at}, db.sql["end_attempt"],
               {"outcome": outcome, "end_reason": reason, "kind": kind, "trace": records.dumps(trace),
                **fence(claim), "now": at})
    cur.execute(db.sql["forget_preview"], {"job_id": claim.id})
    return row


def deliver(db: SQLDb, cur: Any, job_id: str, at: float | None) -> None:
    """A terminal job's webhook, in the transaction that made it terminal: due at once; and its broker
    announcement when the queue announces."""
    url = db.default_callback_url
    cur.execute(db.sql["deliver"], {"url": url, "now": at, "job_id": job_id})
    if db.announce:
        cur.execute(db.sql["announce"], {"now": at, "job_id": job_id})


def finish(db: SQLDb, cur: Any, claim: Claim, state: str, reason: str, now: float | None, kind: str | None,
           trace: dict[str, Any] | None) -> None:
    """The claim's job ends in a terminal state other than done (dead, cancelled), with its webhook."""
    at = db.time(now)
    end(db, cur, claim, db.sql["finish"], {"state": state, "reason": reason}, at, state, reason, kind, trace)
    deliver(db, cur, claim.id, at)


def release(db: SQLDb, cur: Any, claim: Claim, reason: str, count_attempt: bool, now: float | None,
            kind: str | None, trace: dict[str, Any] | None) -> None:
    """The claim's job back to the queue at once, its attempt counted or not; idle runners are woken."""
    # A runner releases only a prompt it interrupted itself: forget the number, as for a retry.
    at = db.time(now)
    end(db, cur, claim, db.sql["release"], {"reason": reason, "uncount": 0 if count_attempt else 1}, at,
        RELEASED if count_attempt else RELEASED_UNCOUNTED, reason, kind, trace)
    db.notify(cur)


def outputs_text(outputs: Sequence[Output]) -> str:
    """The outputs as the row keeps them (compact JSON)."""
    return json.dumps([o._asdict() for o in outputs], separators=(",", ":"))



def with_ids(outputs: Sequence[Output]) -> list[Output]:
    """Each output with its asset UUID (outputs are assets), given where the job is made done."""
    return [o if o.id else o._replace(id=new_asset_id()) for o in outputs]


def made_done(db: SQLDb, cur: Any, job_id: str, outputs: Sequence[Output], at: float | None) -> None:
    """After the statement that made the job done (its runner's, or its machine's uploader's), in its transaction:
    each output's asset id (``with_ids``), the webhook and the broker announcement."""
    cur.execute(db.sql["forget_output_assets"], {"job_id": job_id})
    cur.executemany(db.sql["add_output_asset"], [{"asset_id": o.id, "job_id": job_id} for o in outputs])
    deliver(db, cur, job_id, at)
