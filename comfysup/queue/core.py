"""The SQL core: the queue contract (comfysup.queue.base) written once, over a dialect.

huey's BaseSqlStorage is the model: this class knows what each operation means (which statements, in which order,
in one transaction) and reads its SQL by name from comfysup/queue/sql (comfysup.queue.queries); a backend supplies
only its dialect:

- ``_transaction(fn, *args, write=, durable=, named=)``: how a transaction begins, how durable its commit
  is, and how it fails (SQLite: BEGIN IMMEDIATE, synchronous=FULL; PostgreSQL: a retried stale connection).
  ``fn(cur, *args)`` runs inside it; ``named`` asks for rows that name their columns.
- ``_time(now)``: where time comes from when ``now`` is None (SQLite: this machine's clock, read once the
  write lock is held; PostgreSQL: None, so the SQL's ``{now}`` takes the database server's clock).
- ``_claim``, ``_insert_batch``, ``_fenced``, ``claim_deliveries``, ``prune``: the statements whose shape differs
  (PostgreSQL's single statements with SKIP LOCKED against SQLite's several), and ``_notify`` (PostgreSQL's
  NOTIFY), migrations, maintenance and ``wait_for_work``. Hot paths (claim, heartbeat, complete,
  complete_and_claim, submit's batch insert) use statements prepared once at load, positional parameters.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from comfysup.errors import LeaseLost, QueueError
from comfysup.queue import forks, records, values
from comfysup.queue.assets import AssetStore
from comfysup.queue.base import (
    CANCELLED,
    DEAD,
    DONE,
    QUEUED,
    RELEASED,
    RELEASED_UNCOUNTED,
    RETRY,
    RUNNING,
    NewJob,
    SubmitConflict,
    SubmitResult,
    owner_host,
)
from comfysup.queue.endpoints import ApiEndpoints
from comfysup.queue.fleet import Fleet
from comfysup.queue.previews import Previews
from comfysup.queue.queries import load, read
from comfysup.queue.reads import SQLReads, fetch
from comfysup.queue.specs import SpecCache
from comfysup.workflows import apply_params

if TYPE_CHECKING:
    from comfysup.queue.run_values import Claim, Output

T = TypeVar("T")


class SQLQueue(SQLReads, AssetStore, ApiEndpoints, Fleet, Previews):
    """The Queue contract over SQL; subclasses give the dialect (see the module docstring)."""

    DIALECT = ""
    SUBMIT_BATCH = 500
    TEMPLATE_CACHE = 32
    """Parsed workflows kept by id in each process: a runner parses a batch's 10 KB workflow once, not per claim
    (ids are never reused, so a cached id never stands for another workflow)."""
    default_callback_url = ""
    announce = False
    """[rabbitmq] url is set: a job's end also writes a broker announcement (the outbox) in its transaction."""

    SCHEMA = ""
    """The named-SQL file of the schema's steps (``-- name: vN``)."""
    SCHEMA_VERSION = 0
    DURABLE_RENEWALS = False
    """Whether a heartbeat's commit waits for the disk: not SQLite's (only a power cut loses one, and it stops the
    runners too); PostgreSQL's, whose crash loses one while runners live on (see PostgresQueue)."""

    def _setup(self) -> None:
        self.sql = load(self.DIALECT)
        self._lock = threading.RLock()
        self._templates: OrderedDict[int, dict[str, Any]] = OrderedDict()
        forks.register(self)

    # -- the dialect -----------------------------------------------------------------------------------------

    def _notify(self, cur: Any) -> None:
        """Wake idle runners when this transaction commits; a backend that cannot does nothing."""

    def _drop_for_fork(self) -> None:
        """Just before fork, with this queue's lock held."""

    def _abandon(self) -> None:
        """In a forked child: forget the parent's connections without closing them."""

    def _run_after(self, run_after: float, now: float | None) -> tuple[float | None, float]:
        """``retry_later``'s time as (a time given, else a delay from the operation's time). Without ``now`` the delay
        ``run_after`` leaves on the caller's clock is added to the queue's time as the write takes place: a wait for
        the write lock does not eat into the backoff, a skewed machine (PostgreSQL) neither hurries nor holds back."""
        return (run_after, 0.0) if now is not None else (None, run_after - time.time())

    def _claim(self, cur: Any, owner: str, server: str, lease_seconds: float, at: float | None,
               prefer_model: str | None, max_wait_seconds: float, catalogue: int | None = None,
               url: str | None = None) -> tuple[Any, ...] | None:
        """Expire leases and take the next job that ``catalogue`` (the claiming server's) has not refused, its attempt
        row naming ``url``, the server it is taken for (a crash between the POST and ``record_prompt`` still leaves
        where the prompt may run): ``(owner, server, id, attempt, workflow_id, extra_data, params, last_server,
        last_prompt_number, reason, cancel_requested, lease_until, model_key, workflow text or None when cached)``,
        or None."""
        raise NotImplementedError

    def _insert_batch(self, cur: Any, batch: list[NewJob], at: float | None, conflicts: list[str],
                      specs: SpecCache) -> tuple[int, int]:
        raise NotImplementedError

    def _fenced(self, cur: Any, job_sql: str, job_args: Sequence[Any], attempt_sql: str | None = None,
                attempt_args: Sequence[Any] = ()) -> Any:
        """Run a fenced job UPDATE (its args end with the fence) and, only when it held, the attempt row's
        UPDATE; returns the job row's RETURNING row, or None when the fence did not hold."""
        raise NotImplementedError

    def _schema_steps(self, version: int) -> list[tuple[int, str]]:
        """The schema steps a database at ``version`` still needs, in order; a newer one is refused."""
        if version > self.SCHEMA_VERSION:
            raise QueueError(f"{self.where}: schema version {version} is newer than this comfysup "
                             f"({self.SCHEMA_VERSION}); upgrade comfysup")
        sql = read(self.SCHEMA)
        return [(step, sql[f"v{step}"]) for step in range(version + 1, self.SCHEMA_VERSION + 1)]

    def _bulk(self, cur: Any) -> contextlib.AbstractContextManager[Any]:
        """Settings for a large insert (SQLite: a larger page cache)."""
        return contextlib.nullcontext()

    # -- submit ------------------------------------------------------------------------------------------

    def submit(self, jobs: Iterable[NewJob], now: float | None = None) -> SubmitResult:
        """Insert a batch in one transaction; memory is bounded by SUBMIT_BATCH, not by the batch size."""
        return self._transaction(self._submit, jobs, now)

    def _submit(self, cur: Any, jobs: Iterable[NewJob], now: float | None) -> SubmitResult:
        at = self._time(now)
        inserted = existing = 0
        conflicts: list[str] = []
        specs = SpecCache()
        stored: set[str] = set()
        with self._bulk(cur):
            batch: list[NewJob] = []
            for job in jobs:
                batch.append(job)
                if len(batch) >= self.SUBMIT_BATCH:
                    i, e = self._insert_batch(cur, batch, at, conflicts, specs)
                    self._insert_refusals(cur, batch)
                    self._insert_assets(cur, batch, at, stored)
                    inserted, existing, batch = inserted + i, existing + e, []
            if batch:
                i, e = self._insert_batch(cur, batch, at, conflicts, specs)
                self._insert_refusals(cur, batch)
                self._insert_assets(cur, batch, at, stored)
                inserted, existing = inserted + i, existing + e
        if conflicts:
            raise SubmitConflict(conflicts)
        if inserted:
            self._notify(cur)
        return SubmitResult(inserted=inserted, existing=existing)

    # -- the runner's side ---------------------------------------------------------------------------------

    def claim(self, owner: str, server: str, lease_seconds: float, now: float | None = None, *,
              prefer_model: str | None = None, max_wait_seconds: float = 0.0,
              catalogue: int | None = None, url: str | None = None) -> Claim | None:
        return self._claim_from(self._transaction(self._claim_now, owner, server, lease_seconds, now, prefer_model,
                                                  max_wait_seconds, catalogue, url))

    def _claim_now(self, cur: Any, owner: str, server: str, lease_seconds: float, now: float | None,
                   prefer_model: str | None, max_wait_seconds: float, catalogue: int | None,
                   url: str | None) -> tuple[Any, ...] | None:
        return self._claim(cur, owner, server, lease_seconds, self._time(now), prefer_model, max_wait_seconds,
                           catalogue, url)

    def complete_and_claim(self, claim: Claim, outputs: Sequence[Output], owner: str, server: str,
                           lease_seconds: float, now: float | None = None, *, trace: dict[str, Any] | None = None,
                           prefer_model: str | None = None, max_wait_seconds: float = 0.0,
                           catalogue: int | None = None, url: str | None = None) -> Claim | None:
        """One transaction, so one durable commit, for a job done and the next one claimed. A lost fence
        raises LeaseLost before anything is claimed (the transaction is rolled back)."""
        return self._claim_from(self._transaction(self._complete_then_claim, claim, outputs, owner, server,
                                                  lease_seconds, now, trace, prefer_model, max_wait_seconds,
                                                  catalogue, url))

    def _complete_then_claim(self, cur: Any, claim: Claim, outputs: Sequence[Output], owner: str, server: str,
                             lease_seconds: float, now: float | None, trace: dict[str, Any] | None,
                             prefer_model: str | None, max_wait_seconds: float,
                             catalogue: int | None = None, url: str | None = None) -> tuple[Any, ...] | None:
        at = self._time(now)
        self._complete(cur, claim, outputs, at, trace)
        return self._claim(cur, owner, server, lease_seconds, at, prefer_model, max_wait_seconds, catalogue, url)

    def _note_passed_over(self, cur: Any, priority: int, head: int, taken: int, at: float | None) -> None:
        """After an affinity claim, keep the staircase of affinity_skips: taking a job behind the head passes
        over every ready job of its priority before it; taking the head drops the rows that cover only jobs
        before it."""
        if taken != head:
            cur.execute(self.sql["passed_over"], (priority, taken, at, priority, taken))
        else:
            cur.execute(self.sql["head_taken"], (priority, head))

    def _claim_from(self, taken: tuple[Any, ...] | None) -> Claim | None:
        """The Claim, built after the commit: parsing a workflow does not hold the transaction open."""
        if taken is None:
            return None
        (owner, server, job_id, attempt, workflow_id, extra_data, params, last_server, last_prompt_number, reason,
         cancel_requested, lease_until, key, text) = taken
        return values.Claim(id=job_id, attempt=attempt, owner=owner, server=server,
                            workflow=apply_params(self._template(workflow_id, text), json.loads(params)),
                            extra_data=json.loads(extra_data), lease_until=lease_until, last_server=last_server,
                            last_prompt_number=last_prompt_number, last_reason=reason,
                            cancel_requested=bool(cancel_requested), model_key=key)

    def _template(self, workflow_id: int, text: str | None) -> dict[str, Any]:
        """A parsed workflow by id, from this process's small cache."""
        with self._lock:
            template = self._templates.get(workflow_id)
            if template is None:
                if text is None:  # evicted by another thread since the claim read it
                    text = self._transaction(fetch, self.sql["workflow_text"], (workflow_id,), write=False)[0][0]
                template = json.loads(text)  # type: ignore[arg-type]
                self._templates[workflow_id] = template
                if len(self._templates) > self.TEMPLATE_CACHE:
                    self._templates.popitem(last=False)
            else:
                self._templates.move_to_end(workflow_id)
            return template

    def _held(self, cur: Any, claim: Claim, job_sql: str, job_args: Sequence[Any], attempt_sql: str | None = None,
              attempt_args: Sequence[Any] = ()) -> Any:
        """``_fenced``, raising LeaseLost (nothing changed) when the row is no longer this claim's."""
        if (row := self._fenced(cur, job_sql, job_args, attempt_sql, attempt_args)) is None:
            raise LeaseLost(f"job {claim.id}: attempt {claim.attempt} of {claim.owner} no longer holds the job")
        return row

    def _end(self, cur: Any, claim: Claim, job_sql: str, job_args: Sequence[Any], at: float | None, outcome: str,
             reason: str | None, kind: str | None, trace: dict[str, Any] | None) -> Any:
        """A fenced write that ends the claim's attempt with its outcome, reason class and trace (its preview goes)."""
        row = self._held(cur, claim, job_sql, job_args, self.sql["end_attempt"],
                         (at, outcome, reason, kind, records.dumps(trace), claim.id, claim.attempt, claim.owner))
        cur.execute(self.sql["forget_preview"], (claim.id,))
        return row

    def _deliver(self, cur: Any, job_id: str, at: float | None) -> None:
        """A terminal job's webhook, in the transaction that made it terminal: due at once."""
        url = self.default_callback_url
        cur.execute(self.sql["deliver"], (url, at, at, job_id, url))
        if self.announce:
            cur.execute(self.sql["announce"], (at, job_id))

    def set_progress(self, claim: Claim, progress: dict[str, Any] | None) -> None:
        self._transaction(self._set_progress, claim, progress, durable=False)

    def _set_progress(self, cur: Any, claim: Claim, progress: dict[str, Any] | None) -> None:
        self._held(cur, claim, self.sql["set_progress"],
                   (records.dumps(progress), claim.id, claim.attempt, claim.owner))

    def heartbeat(self, claim: Claim, lease_seconds: float, now: float | None = None) -> bool:
        return self._transaction(self._heartbeat, claim, lease_seconds, now, durable=self.DURABLE_RENEWALS)

    def _heartbeat(self, cur: Any, claim: Claim, lease_seconds: float, now: float | None) -> bool:
        row = self._held(cur, claim, self.sql["heartbeat"],
                         (self._time(now), lease_seconds, claim.id, claim.attempt, claim.owner))
        return bool(row[0])

    def record_prompt(self, claim: Claim, server: str, prompt_number: int, url: str | None = None, *,
                      waiting: bool = False, renew: Claim | None = None, lease_seconds: float = 0.0) -> bool | None:
        # Lost, it would leave an earlier attempt's number, which makes catch-up pass over this run's history entry
        # (a success run again): durable then, where a crash of the database leaves the runners running.
        durable = self.DURABLE_RENEWALS and (claim.last_prompt_number is not None or renew is not None)
        return self._transaction(self._record_prompt, claim, server, prompt_number, url, waiting, renew,
                                 lease_seconds, durable=durable)

    def _record_prompt(self, cur: Any, claim: Claim, server: str, prompt_number: int, url: str | None,
                       waiting: bool, renew: Claim | None, lease_seconds: float) -> bool | None:
        self._held(cur, claim, self.sql["record_prompt"],
                   (server, prompt_number, waiting, self._time(None), claim.id, claim.attempt, claim.owner),
                   self.sql["attempt_prompt"], (prompt_number, server, url, claim.id, claim.attempt, claim.owner))
        if renew is None:
            return None
        row = self._fenced(cur, self.sql["heartbeat"], (self._time(None), lease_seconds, renew.id, renew.attempt,
                                                        renew.owner))
        return row is not None and not row[0]

    def set_waiting(self, claim: Claim, waiting: bool) -> None:
        # Not durable, as record_prompt: what is lost in a power cut is only how the job is shown.
        self._transaction(self._set_waiting, claim, waiting, durable=False)

    def _set_waiting(self, cur: Any, claim: Claim, waiting: bool) -> None:
        self._held(cur, claim, self.sql["set_waiting"], (waiting, self._time(None), claim.id, claim.attempt,
                                                         claim.owner))

    def attempt_urls(self, job_id: str, other_than: Claim | None = None) -> list[tuple[str, int | None]]:
        mine = (other_than.attempt, other_than.owner) if other_than is not None else (0, "")
        rows = self._transaction(lambda cur: cur.execute(self.sql["attempt_urls"], (job_id, *mine)).fetchall(),
                                 write=False)
        return [(str(url), None if number is None else int(number)) for url, number in rows]

    def complete(self, claim: Claim, outputs: Sequence[Output], now: float | None = None, *,
                 trace: dict[str, Any] | None = None, started: Claim | None = None) -> None:
        self._transaction(self._complete_now, claim, outputs, now, trace, started)

    def _complete_now(self, cur: Any, claim: Claim, outputs: Sequence[Output], now: float | None,
                      trace: dict[str, Any] | None, started: Claim | None) -> None:
        self._complete(cur, claim, outputs, self._time(now), trace)
        if started is not None:  # the job queued behind this one executes: one statement more, no transaction
            cur.execute(self.sql["executing"], (started.id, started.attempt, started.owner))

    def _complete(self, cur: Any, claim: Claim, outputs: Sequence[Output], at: float | None,
                  trace: dict[str, Any] | None) -> None:
        import uuid  # here: a runner's outputs only; uuid loads platform, which every submit and status paid

        outputs = [o if o.id else replace(o, id=str(uuid.uuid4())) for o in outputs]  # outputs are assets
        files = json.dumps([o.__dict__ for o in outputs], separators=(",", ":"))
        self._end(cur, claim, self.sql["complete"],
                  (files, at, owner_host(claim.owner), claim.id, claim.attempt, claim.owner), at, DONE, None, None,
                  trace)
        cur.execute(self.sql["forget_output_assets"], (claim.id,))
        cur.executemany(self.sql["add_output_asset"], [(o.id, claim.id) for o in outputs])
        self._deliver(cur, claim.id, at)

    def retry_later(self, claim: Claim, run_after: float, reason: str, now: float | None = None, *,
                    kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        given, delay = self._run_after(run_after, now)
        self._transaction(self._retry_later, claim, given, delay, reason, now, kind, trace)

    def _retry_later(self, cur: Any, claim: Claim, given: float | None, delay: float, reason: str,
                     now: float | None, kind: str | None, trace: dict[str, Any] | None) -> None:
        # The attempt judged its prompt: the next one must not adopt that run's failure again, so the
        # number is forgotten (a live prompt is still followed, and a success still adopted, by id).
        at = self._time(now)
        (due,) = self._end(cur, claim, self.sql["retry_later"],
                           (given, at, delay, reason, claim.id, claim.attempt, claim.owner, at), at, RETRY, reason,
                           kind, trace)
        if due:
            self._notify(cur)

    def dead(self, claim: Claim, reason: str, now: float | None = None, *, kind: str | None = None,
             trace: dict[str, Any] | None = None) -> None:
        self._transaction(self._finish, claim, DEAD, reason, now, kind, trace)

    def cancelled(self, claim: Claim, reason: str, now: float | None = None, *,
                  trace: dict[str, Any] | None = None) -> None:
        self._transaction(self._finish, claim, CANCELLED, reason, now, "cancelled", trace)

    def _finish(self, cur: Any, claim: Claim, state: str, reason: str, now: float | None, kind: str | None,
                trace: dict[str, Any] | None) -> None:
        at = self._time(now)
        self._end(cur, claim, self.sql["finish"], (state, reason, at, claim.id, claim.attempt, claim.owner), at, state,
                  reason, kind, trace)
        self._deliver(cur, claim.id, at)

    def release(self, claim: Claim, reason: str, count_attempt: bool = True, now: float | None = None, *,
                kind: str | None = None, trace: dict[str, Any] | None = None) -> None:
        self._transaction(self._release, claim, reason, count_attempt, now, kind, trace)

    def _release(self, cur: Any, claim: Claim, reason: str, count_attempt: bool, now: float | None,
                 kind: str | None, trace: dict[str, Any] | None) -> None:
        # A runner releases only a prompt it interrupted itself: forget the number, as for a retry.
        at = self._time(now)
        self._end(cur, claim, self.sql["release"], (reason, 0 if count_attempt else 1, claim.id, claim.attempt,
                                                    claim.owner),
                  at, RELEASED if count_attempt else RELEASED_UNCOUNTED, reason, kind, trace)
        self._notify(cur)

    def release_owner(self, owner: str, reason: str, count_attempt: bool = True,
                      now: float | None = None) -> list[str]:
        return self._transaction(self._release_owner, owner, reason, count_attempt, now)

    def _release_owner(self, cur: Any, owner: str, reason: str, count_attempt: bool, now: float | None) -> list[str]:
        at = self._time(now)
        uncount = 0 if count_attempt else 1
        rows = cur.execute(self.sql["release_owner"], (reason, uncount, owner, uncount)).fetchall()
        if rows:
            outcome = RELEASED if count_attempt else RELEASED_UNCOUNTED
            kind = "runner_died" if count_attempt else "shutdown"
            cur.executemany(self.sql["end_owner_attempt"], [(at, outcome, reason, kind, r[0], r[1], owner)
                                                            for r in rows])
            self._notify(cur)
        return [r[0] for r in rows]

    # -- the people's side -------------------------------------------------------------------------------

    def cancel(self, ids: Sequence[str], now: float | None = None) -> dict[str, str]:
        return self._transaction(self._cancel, ids, now)

    def _cancel(self, cur: Any, ids: Sequence[str], now: float | None) -> dict[str, str]:
        at = self._time(now)
        out: dict[str, str] = {}
        for job_id in ids:
            row = cur.execute(self.sql["job_state"], (job_id,)).fetchone()
            if row is None:
                out[job_id] = "unknown"
            elif row[0] == QUEUED:
                cur.execute(self.sql["cancel_queued"], (at, job_id))
                self._deliver(cur, job_id, at)
                out[job_id] = "cancelled"
            elif row[0] == RUNNING:
                cur.execute(self.sql["cancel_running"], (job_id,))
                out[job_id] = "cancelling"
            else:
                out[job_id] = f"already {row[0]}"
        return out

    def requeue_dead(self, ids: Sequence[str] | None, now: float | None = None) -> dict[str, str]:
        return self._transaction(self._requeue, ids)

    def _requeue(self, cur: Any, ids: Sequence[str] | None) -> dict[str, str]:
        out: dict[str, str] = {}
        if ids is None:
            out = {r[0]: "requeued" for r in cur.execute(self.sql["requeue_all"]).fetchall()}
        else:
            for job_id in ids:
                row = cur.execute(self.sql["job_state"], (job_id,)).fetchone()
                if row is None:
                    out[job_id] = "unknown"
                elif row[0] != DEAD:
                    out[job_id] = f"not dead ({row[0]})"
                else:
                    cur.execute(self.sql["requeue_one"], (job_id,))
                    out[job_id] = "requeued"
        if "requeued" in out.values():
            self._notify(cur)
        return out

    # -- webhook deliveries ------------------------------------------------------------------------------

    def delivery_result(self, delivery_id: int, *, delivered: bool, status: int | None, error: str | None,
                        next_at: float | None, now: float | None = None) -> None:
        self._transaction(self._delivery_result, delivery_id, delivered, status, error, next_at, now)

    def _delivery_result(self, cur: Any, delivery_id: int, delivered: bool, status: int | None, error: str | None,
                         next_at: float | None, now: float | None) -> None:
        cur.execute(self.sql["delivery_result"], (status, error, delivered, self._time(now),
                                                  None if delivered else next_at, delivery_id))

    def mark_announced(self, ids: Sequence[int], now: float | None = None) -> None:
        if ids:
            self._transaction(self._mark_announced, ids, now, durable=False)

    def _mark_announced(self, cur: Any, ids: Sequence[int], now: float | None) -> None:
        # Not durable: an announcement whose mark is lost in a power cut is published again (at least once).
        at = self._time(now)
        for row_id in ids:
            cur.execute(self.sql["announced"], (at, row_id))
