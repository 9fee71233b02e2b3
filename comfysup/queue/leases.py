"""The lease role: what a runner does with the jobs it holds, from the claim to the attempt's end.

Every write after the claim is fenced by id + attempt + owner (comfysup.queue.ends): when the row is no longer
this claim's, the call raises ``LeaseLost`` and changes nothing. The hot path (claim, heartbeat, record_prompt,
complete_and_claim) is one transaction each, with statements prepared once at load.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from comfysup.queue import ends, records, values
from comfysup.queue.base import CANCELLED, DEAD, DONE, RELEASED, RELEASED_UNCOUNTED, RETRY, STORING, owner_host
from comfysup.queue.db import ClaimAsk, Role, SQLDb, in_transaction
from comfysup.queue.ends import fence
from comfysup.queue.values import Claim, Output, PromptRecord
from comfysup.workflows import apply_params

TEMPLATE_CACHE = 32
"""Parsed workflows kept by id in each process: a runner parses a batch's 10 KB workflow once, not per claim (ids
are never reused, so a cached id never stands for another workflow)."""


def _renewals(leases: Leases, *args: Any, **kwargs: Any) -> bool:
    return leases.db.DURABLE_RENEWALS


def _prompt_durable(leases: Leases, claim: Claim, *args: Any, **kwargs: Any) -> bool:
    """A prompt number lost would leave an earlier attempt's, which makes catch-up pass over this run's history
    entry (a success run again): durable then, where a crash of the database leaves the runners running."""
    return leases.db.DURABLE_RENEWALS and claim.last_prompt_number is not None


class Leases(Role):
    """Claims, renewals and ends of attempts (see comfysup.queue.base for the contract)."""

    def __init__(self, db: SQLDb) -> None:
        super().__init__(db)
        self._lock = threading.Lock()
        self._templates: OrderedDict[int, dict[str, Any]] = OrderedDict()

    # -- the claim -------------------------------------------------------------------------------------------

    def claim(self, owner: str, server: str, lease_seconds: float, now: float | None = None, *,
              prefer_model: str | None = None, max_wait_seconds: float = 0.0,
              catalogue: int | None = None, url: str | None = None) -> Claim | None:
        ask = ClaimAsk(owner, server, lease_seconds, prefer_model, max_wait_seconds, catalogue, url)
        return self._claim_from(self.db.transaction(lambda cur: self._take(cur, ask, self.db.time(now))))

    def complete_and_claim(self, claim: Claim, outputs: Sequence[Output], owner: str, server: str,
                           lease_seconds: float, now: float | None = None, *, trace: dict[str, Any] | None = None,
                           prefer_model: str | None = None, max_wait_seconds: float = 0.0,
                           catalogue: int | None = None, url: str | None = None,
                           staged_in: str | None = None, started: Claim | None = None,
                           prompt: PromptRecord | None = None) -> tuple[Claim | None, bool]:
        """One transaction, so one durable commit, for a job done and the next one claimed. A lost fence
        raises LeaseLost before anything is claimed (the transaction is rolled back)."""
        ask = ClaimAsk(owner, server, lease_seconds, prefer_model, max_wait_seconds, catalogue, url)

        def done_then_take(cur: Any) -> tuple[Mapping[str, Any] | None, bool]:
            at = self.db.time(now)
            held = self._done(cur, claim, outputs, at, trace, staged_in, started, prompt)
            return self._take(cur, ask, at), held

        row, held = self.db.transaction(done_then_take)
        return self._claim_from(row), held

    def _take(self, cur: Any, ask: ClaimAsk, at: float | None) -> Mapping[str, Any] | None:
        self.db.tenants.write(self.db, cur)
        return self.db.take(cur, ask, at, self._templates)

    def _claim_from(self, row: Mapping[str, Any] | None) -> Claim | None:
        """The Claim, built after the commit: parsing a workflow does not hold the transaction open."""
        if row is None:
            return None
        template = self._template(row["workflow_id"], row["workflow"])
        return values.Claim(id=row["id"], attempt=row["attempt"], owner=row["owner"], server=row["server"],
                            workflow=apply_params(template, json.loads(row["params"])),
                            extra_data=json.loads(row["extra_data"]), lease_until=row["lease_until"],
                            last_server=row["last_server"], last_prompt_number=row["last_prompt_number"],
                            last_reason=row["reason"], cancel_requested=bool(row["cancel_requested"]),
                            model_key=row["model_key"])

    def _template(self, workflow_id: int, text: str | None) -> dict[str, Any]:
        """A parsed workflow by id, from this process's small cache."""
        with self._lock:
            template = self._templates.get(workflow_id)
            if template is None:
                if text is None:  # evicted by another thread since the claim read it
                    text = self.db.transaction(lambda cur: cur.execute(self.db.sql["workflow_text"],
                                                                       {"id": workflow_id}).fetchone()["workflow"],
                                               write=False)
                template = json.loads(text)  # type: ignore[arg-type]
                self._templates[workflow_id] = template
                if len(self._templates) > TEMPLATE_CACHE:
                    self._templates.popitem(last=False)
            else:
                self._templates.move_to_end(workflow_id)
            return template

    # -- while it runs ---------------------------------------------------------------------------------------

    @in_transaction(durable=False)
    def set_progress(self, cur: Any, claim: Claim, progress: dict[str, Any] | None) -> None:
        ends.held(self.db, cur, claim, self.db.sql["set_progress"],
                  {"progress": records.dumps(progress), **fence(claim)})

    @in_transaction(durable=_renewals)
    def heartbeat(self, cur: Any, claim: Claim, lease_seconds: float, now: float | None = None) -> bool:
        row = ends.held(self.db, cur, claim, self.db.sql["heartbeat"],
                        {"now": self.db.time(now), "lease": lease_seconds, **fence(claim)})
        return bool(row["cancel_requested"])

    @in_transaction(durable=_prompt_durable)
    def record_prompt(self, cur: Any, claim: Claim, server: str, prompt_number: int, url: str | None = None, *,
                      waiting: bool = False) -> None:
        if self._record_prompt(cur, PromptRecord(claim, server, prompt_number, url, waiting)) is None:
            raise ends.lost(claim)

    def _record_prompt(self, cur: Any, prompt: PromptRecord) -> Any:
        """The prompt's statements, fenced: the job row's RETURNING row, None when the fence did not hold."""
        sql, on = self.db.sql, fence(prompt.claim)
        return self.db.fenced(cur, sql["record_prompt"],
                              {"server": prompt.server, "number": prompt.number, "waiting": prompt.waiting,
                               "now": self.db.time(None), **on},
                              sql["attempt_prompt"], {"number": prompt.number, "server": prompt.server,
                                                      "url": prompt.url, **on})

    @in_transaction(durable=False)
    def set_waiting(self, cur: Any, claim: Claim, waiting: bool) -> None:
        # Not durable, as record_prompt: what is lost in a power cut is only how the job is shown.
        ends.held(self.db, cur, claim, self.db.sql["set_waiting"],
                  {"waiting": waiting, "now": self.db.time(None), **fence(claim)})

    @in_transaction(write=False)
    def attempt_urls(self, cur: Any, job_id: str, other_than: Claim | None = None) -> list[tuple[str, int | None]]:
        mine = {"attempt": other_than.attempt, "owner": other_than.owner} if other_than is not None else \
            {"attempt": 0, "owner": ""}
        rows = cur.execute(self.db.sql["attempt_urls"], {"job_id": job_id, **mine}).fetchall()
        return [(str(r["url"]), None if r["prompt_number"] is None else int(r["prompt_number"])) for r in rows]

    # -- the attempt's end -----------------------------------------------------------------------------------

    @in_transaction()
    def complete(self, cur: Any, claim: Claim, outputs: Sequence[Output], now: float | None = None, *,
                 trace: dict[str, Any] | None = None, started: Claim | None = None,
                 staged_in: str | None = None, prompt: PromptRecord | None = None) -> bool:
        return self._done(cur, claim, outputs, self.db.time(now), trace, staged_in, started, prompt)

    def _done(self, cur: Any, claim: Claim, outputs: Sequence[Output], at: float | None,
              trace: dict[str, Any] | None, staged_in: str | None, started: Claim | None,
              prompt: PromptRecord | None) -> bool:
        """The end of a done attempt, with what it also says of the jobs taken ahead (see ``complete``)."""
        self._complete(cur, claim, outputs, at, trace, staged_in)
        held = prompt is None or self._record_prompt(cur, prompt) is not None
        if started is not None:  # the job queued behind this one executes: one statement more, no transaction
            cur.execute(self.db.sql["executing"], fence(started))  # after the prompt's record: it may be that job's
        return held

    def _complete(self, cur: Any, claim: Claim, outputs: Sequence[Output], at: float | None,
                  trace: dict[str, Any] | None, staged_in: str | None) -> None:
        sql = self.db.sql
        if staged_in is not None:  # storing: the machine's uploader makes it done (comfysup.queue.uploads)
            ends.end(self.db, cur, claim, sql["stage"],
                     {"outputs": ends.outputs_text(outputs), "machine": owner_host(claim.owner),
                      "staged_in": staged_in, "staged_bytes": sum(o.size for o in outputs)}, at, STORING, None, None,
                     trace)
            return
        outputs = ends.with_ids(outputs)
        ends.end(self.db, cur, claim, sql["complete"],
                 {"outputs": ends.outputs_text(outputs), "machine": owner_host(claim.owner)}, at, DONE, None, None,
                 trace)
        ends.made_done(self.db, cur, claim.id, outputs, at)

    def retry_later(self, claim: Claim, run_after: float, reason: str, now: float | None = None, *,
                    kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        """Back to the queue until ``run_after``. Without ``now`` the delay ``run_after`` leaves on the caller's
        clock is added to the queue's time as the write takes place: a wait for the write lock does not eat into
        the backoff, a skewed machine (PostgreSQL) neither hurries nor holds back."""
        given, delay = (run_after, 0.0) if now is not None else (None, run_after - time.time())

        def retry(cur: Any) -> None:
            # The attempt judged its prompt: the next one must not adopt that run's failure again, so the
            # number is forgotten (a live prompt is still followed, and a success still adopted, by id).
            at = self.db.time(now)
            row = ends.end(self.db, cur, claim, self.db.sql["retry_later"],
                           {"given": given, "delay": delay, "reason": reason}, at, RETRY, reason, kind, trace)
            if row["due"]:
                self.db.notify(cur)

        self.db.transaction(retry)

    @in_transaction()
    def dead(self, cur: Any, claim: Claim, reason: str, now: float | None = None, *, kind: str | None = None,
             trace: dict[str, Any] | None = None) -> None:
        ends.finish(self.db, cur, claim, DEAD, reason, now, kind, trace)

    @in_transaction()
    def cancelled(self, cur: Any, claim: Claim, reason: str, now: float | None = None, *,
                  trace: dict[str, Any] | None = None) -> None:
        ends.finish(self.db, cur, claim, CANCELLED, reason, now, "cancelled", trace)

    @in_transaction()
    def release(self, cur: Any, claim: Claim, reason: str, count_attempt: bool = True, now: float | None = None, *,
                kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        ends.release(self.db, cur, claim, reason, count_attempt, now, kind, trace)

    @in_transaction()
    def release_owner(self, cur: Any, owner: str, reason: str, count_attempt: bool = True,
                      now: float | None = None) -> list[str]:
        at = self.db.time(now)
        uncount = 0 if count_attempt else 1
        rows = cur.execute(self.db.sql["release_owner"],
                           {"reason": reason, "uncount": uncount, "owner": owner}).fetchall()
        if rows:
            outcome = RELEASED if count_attempt else RELEASED_UNCOUNTED
            kind = "runner_died" if count_attempt else "shutdown"
            cur.executemany(self.db.sql["end_owner_attempt"],
                            [{"now": at, "outcome": outcome, "reason": reason, "kind": kind, "job_id": r["id"],
                              "attempt": r["attempt"], "owner": owner} for r in rows])
            self.db.notify(cur)
        return [r["id"] for r in rows]
