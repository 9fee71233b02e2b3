"""The queue interface: what every backend promises, and the records it hands out.

A queue is roles over one database (``Queue``): ``leases`` (claim, renew, end an attempt), ``intake`` (submit,
cancel, requeue, prune), ``reads``, ``deliveries`` (webhooks, the broker outbox), ``fleet`` (catalogues, the
machine registry), ``endpoints`` (the API registry), ``assets``, ``previews``, ``uploads`` (storing jobs),
``search`` and ``orders`` (the console's); comfysup.queue.roles says what each offers. The methods named below are
the roles' (``claim`` is ``queue.leases.claim``).

The contract (tested once in tests/queue_contract.py and run against every backend):

- ``submit`` inserts a batch in one transaction, or nothing. An id already present with the same
  ``spec_hash`` is counted as already submitted; with a different one the whole batch is refused
  (``SubmitConflict`` names the ids).
- ``claim`` takes the next job whose ``run_after`` has passed, highest ``priority`` first, then in
  submission order; it increments ``attempt``, sets ``owner``/``server`` and a lease, and opens an
  attempt row. A running job whose lease has expired is claimable again. One job is never held by two
  owners at once: the claimed row is the lock.
- Model affinity: a claim may name the model key its server ran last (``prefer_model``). It
  then takes the first ready job with that key among those of the head's priority (priority always wins
  over affinity), unless the head — the job strict order would hand out — has been passed over for
  ``max_wait_seconds``: from then on strict order holds until every job passed over that long is out.
  A job is passed over when a job behind it in strict order is claimed while it is ready; the queue keeps
  when that first happened (a staircase of (priority, seq bound, time) rows). Once a job has been passed
  over for ``max_wait_seconds``, claims return to strict order until it and every job ahead of it are out,
  so affinity delays a job by at most ``max_wait_seconds`` (plus the wait for the next claim, which strict
  order has too) beyond what strict order would have made it wait (bench/affinity.py measures it).
- ``complete_and_claim`` records done and claims the next job in one transaction (one fsync per job).
- Posted: a running job whose prompt waits in its server's queue behind another
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
- Storing (uploads through an outbox, ``[store] url``): ``complete(..., staged_in=folder)`` records the job
  ``storing`` instead of ``done``: its outputs (hashed, fsynced) wait in ``folder`` on the machine of its owner,
  the row has no owner and no lease (no claim takes it, no lease expires, every stale attempt's fenced write finds
  it no longer running). The ``uploads`` role hands each machine its own storing jobs; ``stored`` makes one done
  with the confirmed objects (webhook and announcement as any done), ``give_up`` dead; both are fenced by id +
  attempt + state, so a job cancelled (``cancel`` ends a storing job at once) or requeued (``requeue_dead`` takes a
  storing job named by id: its machine is gone) meanwhile is left as it is.
- ``complete`` records the machine that did the work (the host part of the owner), so a result store on
  each machine's own disk can still be found: ``JobRecord.machine`` plus each ``Output.path``.
- ``wait_for_work`` returns when a job may have become claimable (PostgreSQL: a NOTIFY from ``submit``,
  ``requeue_dead``, ``release`` or a ``retry_later`` due now) or after its timeout; a backend that cannot
  be woken just sleeps. It is only a hint: callers claim again after it, whatever woke them.
- Machines (supervisors) register and heartbeat with their slots, so ``status`` shows every machine that
  shares the queue and how long ago each was heard from.
- What people see: every write that ends an attempt may carry its reason class (``kind``) and
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
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

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
    OutboxLevel,
    Output,
    Preview,
    PromptRecord,
    PruneBatch,
    RunningJob,
    StagedJob,
    Status,
    SubmitResult,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from comfysup.queue import roles
    from comfysup.queue.tenants import TenantLimits


class State(StrEnum):
    """Every state a job or an attempt can be in: a job is queued, running, or ended (done, dead, cancelled);
    an attempt ends with one of those or with what put its job back (retry, released, lease expired).
    A StrEnum, so each member is the text stored in the database and compares equal to it; ``posted`` is the one
    that is only shown, never stored (see ``JobRecord.shown_state``)."""

    QUEUED = "queued"
    POSTED = "posted"
    """Shown, not stored: a running job (claimed, leased, fenced as any) that waits for its server,
    posted behind the prompt that runs there ([runner] queue_ahead), until its execution starts."""
    RUNNING = "running"
    STORING = "storing"
    """Its outputs are staged on the machine that ran it, waiting for the bucket ([store] url): no runner holds it,
    no lease expires; that machine's uploader makes it done (or dead past [store] upload_give_up_hours). Also an
    attempt's outcome: the attempt ended with every output staged."""
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"
    RETRY = "retry"
    RELEASED = "released"
    RELEASED_UNCOUNTED = "released_uncounted"
    LEASE_EXPIRED = "lease_expired"


QUEUED, RUNNING, DONE, DEAD, CANCELLED = State.QUEUED, State.RUNNING, State.DONE, State.DEAD, State.CANCELLED
POSTED, STORING = State.POSTED, State.STORING
RETRY, RELEASED, RELEASED_UNCOUNTED, LEASE_EXPIRED = (State.RETRY, State.RELEASED, State.RELEASED_UNCOUNTED,
                                                      State.LEASE_EXPIRED)
TERMINAL = frozenset({DONE, DEAD, CANCELLED})
STATES = (QUEUED, POSTED, RUNNING, STORING, DONE, DEAD, CANCELLED)
"""A job's states as people see them, in the order status shows them (a posted job is counted as posted, not
running: the running ones execute, at most one a server; a storing one has run, its files wait for the bucket)."""


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
    means something to people. A ``/`` would break the owner token, so it is replaced. The system's name is
    uname's node name, what ``socket.gethostname`` answers on every POSIX system (without loading socket).
    """
    return (os.environ.get(HOSTNAME_VARIABLE) or os.uname().nodename).replace("/", "-")


def owner_host(owner: str) -> str:
    """The machine in an owner token (``host/pid/server/token``, see comfysup.runner.loop.make_owner)."""
    return owner.split("/", 1)[0]


class Queue(Protocol):
    """A durable job queue: its roles, each over the one database, and that database's upkeep. Methods take
    ``now`` (UTC epoch seconds) where time matters, for tests."""

    where: str
    """Where the database is, for messages (a path, or a PostgreSQL URL without its password)."""
    announce: bool
    tenants: Mapping[str, TenantLimits]
    """The declared tenants' weights and limits (comfysup.queue.tenants), as the config's [tenants.NAME] say."""
    leases: roles.Leases
    intake: roles.Intake
    reads: roles.Reads
    deliveries: roles.Deliveries
    fleet: roles.Fleet
    endpoints: roles.Endpoints
    assets: roles.Assets
    previews: roles.Previews
    uploads: roles.Uploads
    search: roles.Search
    orders: roles.Orders

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
