"""The queue interface: what every backend promises, and the records it hands out.

The contract (tested once in tests/queue_contract.py and run against every backend):

- ``submit`` inserts a batch in one transaction, or nothing. An id already present with the same
  ``spec_hash`` is counted as already submitted; with a different one the whole batch is refused
  (``SubmitConflict`` names the ids).
- ``claim`` takes the next job whose ``run_after`` has passed, highest ``priority`` first, then in
  submission order; it increments ``attempt``, sets ``owner``/``server`` and a lease, and opens an
  attempt row. A running job whose lease has expired is claimable again. One job is never held by two
  owners at once: the claimed row is the lock.
- Model affinity (issue 7): a claim may name the model key its server ran last (``prefer_model``). It
  then takes the first ready job with that key among those of the head's priority (priority always wins
  over affinity), unless the head — the job strict order would hand out — has been passed over for
  ``max_wait_seconds``: from then on strict order holds until every job passed over that long is out.
  A job is passed over when a job behind it in strict order is claimed while it is ready; the queue keeps
  when that first happened (a staircase of (priority, seq bound, time) rows). Once a job has been passed
  over for ``max_wait_seconds``, claims return to strict order until it and every job ahead of it are out,
  so affinity delays a job by at most ``max_wait_seconds`` (plus the wait for the next claim, which strict
  order has too) beyond what strict order would have made it wait (bench/affinity.py measures it).
- ``complete_and_claim`` records done and claims the next job in one transaction (one fsync per job).
- Posted (issue 32): a running job whose prompt waits in its server's queue behind another
  (``record_prompt(..., waiting=True)``, or ``set_waiting``) is shown as ``posted`` (``status`` counts,
  ``states``, ``JobRecord.shown_state``) until its execution starts (``set_waiting(claim, False)``, or
  ``complete(..., started=claim)`` in the transaction of the job ahead of it); a claim starts it afresh.
- Each distinct workflow text is stored once, addressed by its hash; a job keeps its ``set``
  (``params``) and ``extra_data``, and ``Claim.workflow`` / ``JobRecord.workflow`` are rebuilt from both
  (comfysup.workflows.apply_params) exactly as submit applied them.
- ``prune`` removes old terminal jobs in short batches.
- Every write after the claim is fenced by id + attempt + owner: when the row is no longer this
  claim's, the call raises ``LeaseLost`` and changes nothing.
- ``release`` puts a claimed job back without waiting for its lease; with ``count_attempt=False`` the
  attempt does not count (a graceful stop). ``release_owner`` does that for every claim of one owner,
  which the supervisor calls when a runner's pid has died.
- Terminal states are ``done``, ``dead`` and ``cancelled``; a job reaches one of them exactly once.
- ``complete`` records the machine that did the work (the host part of the owner), so a result store on
  each machine's own disk can still be found: ``JobRecord.machine`` plus each ``Output.path``.
- ``wait_for_work`` returns when a job may have become claimable (PostgreSQL: a NOTIFY from ``submit``,
  ``requeue_dead``, ``release`` or a ``retry_later`` due now) or after its timeout; a backend that cannot
  be woken just sleeps. It is only a hint: callers claim again after it, whatever woke them.
- Machines (supervisors) register and heartbeat with their slots, so ``status`` shows every machine that
  shares the queue and how long ago each was heard from.
- What people see (issue 8): every write that ends an attempt may carry its reason class (``kind``) and
  its trace (phases, node times, cached nodes); ``set_progress`` is a fenced write of a running job's
  progress. A job that reaches a terminal state with a webhook (its own ``callback_url``, else the
  backend's ``default_callback_url``) gets a delivery row in the same transaction, so a job is never
  terminal without it; deliverers take due rows with ``claim_deliveries`` (held, so two deliverers do
  not send one row at once) and record each try with ``delivery_result``.
- ``ended_since`` hands metrics the attempts that ended from a time on (index-backed, not a scan), with
  the numbers metrics need of each trace (nodes run and cached, counted in SQL) rather than the trace;
  ``ended_count`` and ``ended_keys`` let metrics find a write that committed late without reading
  the whole look-back window again each time.
- Time: methods take ``now`` (UTC epoch seconds) for tests. When it is None a backend uses one clock for
  every machine: SQLite the local one (one machine), PostgreSQL the database server's, so clock skew
  between machines cannot expire a live lease early.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

from comfysup.errors import QueueError
from comfysup.queue.values import (  # noqa: F401  (re-exported: callers import the records from here)
    ApiEndpoint,
    Attempt,
    CatalogueRecord,
    Claim,
    Delivery,
    EndedAttempt,
    JobPulse,
    JobRecord,
    Machine,
    NewAsset,
    NewJob,
    Output,
    Preview,
    PruneBatch,
    RunningJob,
    Status,
    SubmitResult,
)


class State(StrEnum):
    """Every state a job or an attempt can be in: a job is queued, running, or ended (done, dead, cancelled);
    an attempt ends with one of those or with what put its job back (retry, released, lease expired).
    A StrEnum, so each member is the text stored in the database and compares equal to it; ``posted`` is the one
    that is only shown, never stored (see ``JobRecord.shown_state``)."""

    QUEUED = "queued"
    POSTED = "posted"
    """Shown, not stored (issue 32): a running job (claimed, leased, fenced as any) that waits for its server,
    posted behind the prompt that runs there ([runner] queue_ahead), until its execution starts."""
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"
    RETRY = "retry"
    RELEASED = "released"
    RELEASED_UNCOUNTED = "released_uncounted"
    LEASE_EXPIRED = "lease_expired"


QUEUED, RUNNING, DONE, DEAD, CANCELLED = State.QUEUED, State.RUNNING, State.DONE, State.DEAD, State.CANCELLED
POSTED = State.POSTED
RETRY, RELEASED, RELEASED_UNCOUNTED, LEASE_EXPIRED = (State.RETRY, State.RELEASED, State.RELEASED_UNCOUNTED,
                                                      State.LEASE_EXPIRED)
TERMINAL = frozenset({DONE, DEAD, CANCELLED})
STATES = (QUEUED, POSTED, RUNNING, DONE, DEAD, CANCELLED)
"""A job's states as people see them, in the order status shows them (a posted job is counted as posted, not
running: the running ones execute, at most one a server)."""


class SubmitConflict(QueueError):
    """Some ids are already in the queue with different content; nothing was inserted."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = list(ids)
        super().__init__(f"{len(self.ids)} id(s) already in the queue with different content: "
                         + ", ".join(self.ids[:5]) + (" …" if len(self.ids) > 5 else ""))


HOSTNAME_VARIABLE = "COMFYSUP_HOSTNAME"


def host_name() -> str:
    """This machine's name in the queue (owners, the machine registry, done records).

    ``$COMFYSUP_HOSTNAME`` overrides the system's host name: two supervisors on one host can then act as
    two machines (the two-machine tests), and a container's random host name can be replaced by one that
    means something to people. A ``/`` would break the owner token, so it is replaced.
    """
    import socket  # here: every command imports this module, few ask the host name (socket is 5-15 ms)

    return (os.environ.get(HOSTNAME_VARIABLE) or socket.gethostname()).replace("/", "-")


def owner_host(owner: str) -> str:
    """The machine in an owner token (``host/pid/server/token``, see comfysup.runner.loop.make_owner)."""
    return owner.split("/", 1)[0]


class Queue(Protocol):
    """A durable job queue. Methods take ``now`` (UTC epoch seconds) where time matters, for tests."""

    def submit(self, jobs: Iterable[NewJob], now: float | None = None) -> SubmitResult: ...

    def claim(self, owner: str, server: str, lease_seconds: float, now: float | None = None, *,
              prefer_model: str | None = None, max_wait_seconds: float = 0.0,
              catalogue: int | None = None, url: str | None = None) -> Claim | None:
        """The next job (see the module docstring); with ``prefer_model`` and ``max_wait_seconds`` > 0, model
        affinity: the first job of the head's priority whose model key is ``prefer_model``, unless the head
        (the job strict order would hand out) has been passed over for ``max_wait_seconds``. A job that
        ``catalogue`` (the claiming server's node catalogue) refused is passed over."""
        ...

    def complete_and_claim(self, claim: Claim, outputs: Sequence[Output], owner: str, server: str,
                           lease_seconds: float, now: float | None = None, *, trace: dict[str, Any] | None = None,
                           prefer_model: str | None = None, max_wait_seconds: float = 0.0,
                           catalogue: int | None = None, url: str | None = None) -> Claim | None:
        """``complete`` and then ``claim`` in one transaction: one durable commit (one fsync) per job for a
        runner that goes on. Raises LeaseLost, claiming nothing, when ``claim`` is no longer held."""
        ...

    def heartbeat(self, claim: Claim, lease_seconds: float, now: float | None = None) -> bool:
        """Renew the lease; returns whether a cancel was requested. Raises LeaseLost."""
        ...

    def record_prompt(self, claim: Claim, server: str, prompt_number: int, url: str | None = None, *,
                      waiting: bool = False, renew: Claim | None = None, lease_seconds: float = 0.0) -> bool | None:
        """The prompt the claim's job runs as on ``server`` (at ``url``), fenced (raises LeaseLost). ``waiting``:
        it was posted behind another prompt that runs there ([runner] queue_ahead), so the job is shown as
        posted until ``set_waiting(claim, False)`` or ``complete(..., started=claim)`` says it executes.

        ``renew``: another claim of the same runner, whose lease is renewed for ``lease_seconds`` in the same
        transaction, fenced as ``heartbeat`` (one transaction a job instead of two: the attempt about to store
        that claim's files, comfysup.runner.nextjob). Returns whether that renewal held with no cancel asked (None
        without ``renew``); nothing is raised for it: a claim lost is left as it was, a cancel asked of it is the
        caller's own heartbeat's to find."""
        ...

    def set_waiting(self, claim: Claim, waiting: bool) -> None:
        """The claim's job waits for its server (claimed ahead), or no longer does (its execution started);
        fenced (raises LeaseLost)."""
        ...

    def attempt_urls(self, job_id: str, other_than: Claim | None = None) -> list[tuple[str, int | None]]:
        """Where the job's attempts ran it or were to run it, newest first (at most 100): each attempt's server
        URL, named at its claim, and the prompt number it recorded there (None: none). ``other_than``'s own
        attempt is left out. Every URL counts: an attempt that never posted (refused, stopped, killed before its
        POST) must not hide an earlier one whose prompt may still run on another machine's server."""
        ...

    def set_progress(self, claim: Claim, progress: dict[str, Any] | None) -> None:
        """The running job's progress, for status and the status page; fenced (raises LeaseLost)."""
        ...

    def complete(self, claim: Claim, outputs: Sequence[Output], now: float | None = None, *,
                 trace: dict[str, Any] | None = None, started: Claim | None = None) -> None:
        """Record done (fenced). ``started``: the job queued behind this one, whose execution_start was read
        before this end; in the same transaction it stops waiting (nothing if its claim no longer holds)."""
        ...

    def retry_later(self, claim: Claim, run_after: float, reason: str, now: float | None = None, *,
                    kind: str | None = None, trace: dict[str, Any] | None = None) -> None: ...

    def dead(self, claim: Claim, reason: str, now: float | None = None, *, kind: str | None = None,
             trace: dict[str, Any] | None = None) -> None: ...

    def cancelled(self, claim: Claim, reason: str, now: float | None = None, *,
                  trace: dict[str, Any] | None = None) -> None: ...

    def release(self, claim: Claim, reason: str, count_attempt: bool = True,
                now: float | None = None, *, kind: str | None = None,
                trace: dict[str, Any] | None = None) -> None: ...

    def release_owner(self, owner: str, reason: str, count_attempt: bool = True,
                      now: float | None = None) -> list[str]: ...

    def cancel(self, ids: Sequence[str], now: float | None = None) -> dict[str, str]:
        """Cancel queued jobs, mark running ones; returns id -> what happened (or 'unknown')."""
        ...

    def requeue_dead(self, ids: Sequence[str] | None, now: float | None = None) -> dict[str, str]:
        """Dead jobs back to the queue with attempts reset (``None``: all dead jobs)."""
        ...

    def get(self, job_id: str) -> JobRecord: ...

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]: ...

    def get_many(self, ids: Sequence[str]) -> list[JobRecord]: ...

    def iter_jobs(self, states: Sequence[str] | None = None) -> Iterator[JobRecord]: ...

    def newest(self, before: int | None = None, limit: int = 50) -> tuple[int | None, list[JobRecord]]:
        """A page of jobs, newest first, below ``before``; and the ``before`` of the next page (None: the last)."""
        ...

    def status(self, now: float | None = None, dead_limit: int = 5, done_limit: int = 0) -> Status: ...

    def queue_position(self, job_id: str) -> int | None:
        """A waiting job's place in line, 1 first: a posted job's among those posted to its server before it, a
        queued job's behind every posted job and the ready queued jobs claimed before it that a server able to
        run it could run; None for a job that executes, has ended, or is unknown."""
        ...

    def states(self, ids: Sequence[str]) -> dict[str, str]:
        """id -> state as shown (``posted`` for a running job that waits in its server's queue), without reading
        workflows (what ``submit --wait`` polls); unknown ids are left out."""
        ...

    def output_asset(self, asset_id: str) -> tuple[JobRecord, int] | None:
        """The done job whose output has this asset id (Output.id), and the output's place in its list."""
        ...

    def set_preview(self, claim: Claim, node_id: str | None, content_type: str, data: bytes) -> None:
        """The running job's latest preview image, replacing the one before (fenced; not durable)."""
        ...

    def previews(self, ids: Sequence[str], known: Mapping[str, int]) -> dict[str, Preview]:
        """The latest previews of ``ids`` whose number moved from ``known`` (the API's event watcher)."""
        ...

    def pulses(self, ids: Sequence[str]) -> dict[str, JobPulse]:
        """id -> JobPulse, without reading workflows (the API's event watcher); unknown ids are left out."""
        ...

    def finished_counts(self, since: float, now: float | None = None) -> dict[str, int]:
        """Jobs that reached each terminal state at or after ``since`` (jobs per minute)."""
        ...

    def ended_since(self, since: float, limit: int = 10000) -> list[EndedAttempt]:
        """Attempts whose end is at or after ``since``, oldest end first (metrics observe each once)."""
        ...

    def ended_count(self, since: float, until: float) -> int:
        """How many attempts ended in ``[since, until]`` (an index range, counted without reading rows)."""
        ...

    def ended_keys(self, since: float, until: float) -> list[tuple[str, int, float, float]]:
        """``(job_id, attempt, started_at, ended_at)`` of the attempts that ended in ``[since, until]``, oldest
        end first: what metrics compare with what they counted when ``ended_count`` says a write landed late."""
        ...

    def deliveries(self, job_id: str) -> list[Delivery]:
        """The webhook deliveries of one job, oldest first."""
        ...

    def pending_deliveries(self) -> int: ...

    def pending_announcements(self, limit: int) -> list[tuple[int, str, str]]:
        """The broker outbox's oldest unconfirmed rows: ``(row id, job id, terminal state)``."""
        ...

    def mark_announced(self, ids: Sequence[int], now: float | None = None) -> None:
        """The broker confirmed these rows; a row marked twice stays sent."""
        ...

    def announcement_backlog(self) -> int:
        """Broker announcements not yet confirmed (the outbox backlog)."""
        ...

    def announcements(self, job_id: str) -> list[dict[str, Any]]:
        """One job's broker announcements (id, state, created_at, sent_at), oldest first."""
        ...

    def record_catalogue(self, runner: str, machine: str, info: dict[str, Any], now: float | None = None) -> int:
        """Store a server's /object_info once per distinct content; (runner, machine) has it now. Its id."""
        ...

    def catalogues(self) -> list[CatalogueRecord]:
        """The node catalogues some server has now, with the servers that have each."""
        ...

    def refuse(self, claim: Claim, catalogue: int, reason: str, now: float | None = None) -> bool:
        """``catalogue`` cannot run the claimed job: no claim of it takes the job again; released uncounted,
        or dead-lettered (True) when no server's current catalogue can run it."""
        ...

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """Due deliveries, each held for ``hold_seconds`` (its ``next_at`` pushed ahead) so that another
        deliverer does not send it meanwhile; a deliverer that dies leaves it due again after the hold."""
        ...

    def delivery_result(self, delivery_id: int, *, delivered: bool, status: int | None, error: str | None,
                        next_at: float | None, now: float | None = None) -> None:
        """One try of a delivery: counted; delivered, due again at ``next_at``, or given up (None)."""
        ...

    def running_owners(self) -> list[str]: ...

    def active_count(self) -> int:
        """Jobs not yet terminal (queued, waiting to retry, running): zero means the queue is drained."""
        ...

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """Remove up to ``limit`` terminal jobs that finished before ``finished_before`` (their attempts,
        deliveries and workflows no other job uses) in one short transaction; callers repeat until a batch
        comes back empty, so runners wait at most one batch for the write lock."""
        ...

    def prunable(self, finished_before: float) -> int:
        """How many terminal jobs finished before ``finished_before`` (what ``prune`` would remove, less any
        whose webhook is still pending): the progress total of ``comfysup prune``."""
        ...

    def maintenance(self) -> None:
        """Periodic upkeep (a WAL checkpoint for SQLite); cheap to call often."""
        ...

    def checkpoint_in_background(self) -> None:
        """A process whose commits must not wait (a runner): upkeep that a commit would otherwise do in line
        (SQLite's WAL checkpoint) moves to a thread of its own until ``close``. Nothing for PostgreSQL."""
        ...

    def wait_for_work(self, timeout_seconds: float) -> None:
        """Block until a job may be claimable, or ``timeout_seconds`` passed; never raises for a lost link."""
        ...

    def register_machine(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                         now: float | None = None) -> None:
        """A supervisor starts: its row replaces earlier rows of the same host (a host runs one supervisor
        per queue)."""
        ...

    def machine_heartbeat(self, host: str, pid: int, slots: Sequence[dict[str, Any]],
                          now: float | None = None, *, wait_seconds: float | None = None) -> None:
        """Refresh the heartbeat and the slots (recreating the row if it was removed). ``wait_seconds``: wait at
        most this long for a write lock another process holds (SQLite), else DatabaseLocked."""
        ...

    def machines(self, now: float | None = None) -> list[Machine]: ...

    def advertise_api(self, host: str, url: str, pid: int, now: float | None = None) -> None:
        """``host``'s Comfy API v2 is reached by the other machines at ``url``: inserted or refreshed (its
        heartbeat), one row per host."""
        ...

    def withdraw_api(self, host: str, pid: int) -> None:
        """``host``'s API stops: its row goes, unless another process (``pid`` differs) wrote it since."""
        ...

    def api_endpoint(self, host: str, now: float | None = None) -> ApiEndpoint | None:
        """``host``'s advertised API with the age of its heartbeat; None when it advertises none."""
        ...

    def replaced(self) -> str | None:
        """None while the database this process has open is still the one its path names; otherwise what
        happened to it (SQLite: the file deleted or replaced under a running process). A server database
        (PostgreSQL) cannot be swapped under an open connection: always None."""
        ...

    def integrity(self, deep: bool = False) -> str | None:
        """None while the database's file looks sound; else what is wrong with it (SQLite: its header and size on
        disk, and with ``deep`` a ``PRAGMA quick_check``). Always None for PostgreSQL (comfysup.queue.watch)."""
        ...

    def close(self) -> None: ...

