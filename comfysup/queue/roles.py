"""What each of the queue's users needs of it: one Protocol per role (comfysup.queue.base's ``Queue`` composes
them). A runner holds the lease role, a status page the read role, a deliverer the delivery role; the methods'
contract is comfysup.queue.base's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from comfysup.queue.values import (
    ApiAsset,
    ApiEndpoint,
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
    StagedJob,
    Status,
    SubmitResult,
    TenantCount,
)

if TYPE_CHECKING:
    from comfysup.queue.asset_bucket import AssetBucket
    from comfysup.queue.orders import SlotOrder
    from comfysup.queue.search import JobPage, JobSearch


class Leases(Protocol):
    """The lease role: what a runner does with the jobs it holds (comfysup.queue.leases)."""

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
                           catalogue: int | None = None, url: str | None = None,
                           staged_in: str | None = None, started: Claim | None = None,
                           prompt: PromptRecord | None = None) -> tuple[Claim | None, bool]:
        """``complete`` (with its ``started`` and ``prompt``) and then ``claim`` in one transaction: one durable
        commit (one fsync) per job for a runner that goes on. Returns the claim (or None) and whether the
        ``prompt``'s record held, as ``complete`` returns it. Raises LeaseLost, claiming nothing, when ``claim`` is
        no longer held."""
        ...

    def heartbeat(self, claim: Claim, lease_seconds: float, now: float | None = None) -> bool:
        """Renew the lease; returns whether a cancel was requested. Raises LeaseLost."""
        ...

    def record_prompt(self, claim: Claim, server: str, prompt_number: int, url: str | None = None, *,
                      waiting: bool = False) -> None:
        """The prompt the claim's job runs as on ``server`` (at ``url``), fenced (raises LeaseLost). ``waiting``:
        it was posted behind another prompt that runs there ([runner] queue_ahead), so the job is shown as
        posted until ``set_waiting(claim, False)`` or ``complete(..., started=claim)`` says it executes."""
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
                 trace: dict[str, Any] | None = None, started: Claim | None = None,
                 staged_in: str | None = None, prompt: PromptRecord | None = None) -> bool:
        """Record done (fenced). ``started``: the job queued behind this one, whose execution_start was read
        before this end; in the same transaction it stops waiting (nothing if its claim no longer holds).
        ``staged_in``: the outputs are staged there on the owner's machine, for the bucket: the job is recorded
        storing (no owner, no lease), and its machine's uploader makes it done (``Uploads.stored``).
        ``prompt``: another job's prompt, recorded in the same transaction as ``record_prompt`` records it
        (the job queued behind the next one: one transaction a job fewer). Returns whether that record held
        (True without ``prompt``); nothing is raised for it: its claim lost is its attempt's to find."""
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


class Uploads(Protocol):
    """The upload role: storing jobs, whose outputs wait in a machine's staging folder (comfysup.queue.uploads)."""

    def staged(self, machine: str, limit: int = 100) -> list[StagedJob]:
        """``machine``'s storing jobs, oldest first (at most ``limit``)."""
        ...

    def staging_bytes(self, machine: str) -> int:
        """What ``machine``'s storing jobs hold in its staging folder (the [store] staging_max_gb bound)."""
        ...

    def by_machine(self, now: float | None = None) -> dict[str, OutboxLevel]:
        """The storing jobs of each machine whose staging folder holds their files (a machine gone for good shows
        here, its jobs for an operator to retry)."""
        ...

    def stored(self, job: StagedJob, outputs: Sequence[Output], now: float | None = None) -> bool:
        """Every object confirmed: the job is done with ``outputs`` (their s3:// paths), its webhook and
        announcement in the same transaction. False, changing nothing, when it is no longer storing these files
        (cancelled, requeued, ended by another uploader)."""
        ...

    def give_up(self, job: StagedJob, reason: str, now: float | None = None) -> bool:
        """The job is dead with ``reason`` ([store] upload_give_up_hours passed); False as ``stored``."""
        ...

    def upload_failed(self, job: StagedJob, reason: str) -> None:
        """Why its last upload failed, shown by status and show while it is storing (not durable)."""
        ...


class Intake(Protocol):
    """The intake role: submit, cancel, requeue, prune (comfysup.queue.intake)."""

    def submit(self, jobs: Iterable[NewJob], now: float | None = None) -> SubmitResult: ...

    def cancel(self, ids: Sequence[str], now: float | None = None) -> dict[str, str]:
        """Cancel queued and storing jobs (a storing job's staged files are then dropped by its uploader), mark
        running ones; returns id -> what happened (or 'unknown')."""
        ...

    def requeue_dead(self, ids: Sequence[str] | None, now: float | None = None) -> dict[str, str]:
        """Dead jobs back to the queue with attempts reset (``None``: all dead jobs). A storing job named by id is
        requeued too (its machine is gone with the staged files: the job runs again, elsewhere)."""
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


class Reads(Protocol):
    """The read role: what people and metrics read of jobs (comfysup.queue.reads)."""

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

    def pulses(self, ids: Sequence[str]) -> dict[str, JobPulse]:
        """id -> JobPulse, without reading workflows (the API's event watcher); unknown ids are left out."""
        ...

    def tenant_counts(self) -> list[TenantCount]:
        """Every tenant the queue knows, by name: queued, running, done and seconds used (comfysup.queue.tenants)."""
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

    def running_owners(self) -> list[str]: ...

    def active_count(self) -> int:
        """Jobs a runner may still take or holds (queued, waiting to retry, running): zero means the queue is drained
        for the runners (storing jobs wait for their machine's uploader, not for a runner)."""
        ...


class Deliveries(Protocol):
    """The delivery role: webhooks and the broker outbox (comfysup.queue.deliveries)."""

    def deliveries(self, job_id: str) -> list[Delivery]:
        """The webhook deliveries of one job, oldest first."""
        ...

    def pending_deliveries(self) -> int: ...

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """Due deliveries, each held for ``hold_seconds`` (its ``next_at`` pushed ahead) so that another
        deliverer does not send it meanwhile; a deliverer that dies leaves it due again after the hold."""
        ...

    def delivery_result(self, delivery_id: int, *, delivered: bool, status: int | None, error: str | None,
                        next_at: float | None, now: float | None = None) -> None:
        """One try of a delivery: counted; delivered, due again at ``next_at``, or given up (None)."""
        ...

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

    def outboxes(self, now: float | None = None) -> dict[str, OutboxLevel]:
        """What each outbox holds now: ``uploads`` (storing jobs, their staged bytes), ``webhooks`` (deliveries
        not yet sent or given up) and ``broker`` (announcements not yet confirmed), each with its oldest's age."""
        ...


class Fleet(Protocol):
    """The fleet role: node catalogues, refusals, the machine registry (comfysup.queue.fleet)."""

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


class Endpoints(Protocol):
    """The API registry: where each machine's API is reached (comfysup.queue.endpoints)."""

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


class Search(Protocol):
    """The search role: the operator's console finds jobs, a keyset page at a time (comfysup.queue.search)."""

    def search(self, search: JobSearch) -> JobPage:
        """One page of the jobs ``search`` matches, and the cursor of the next (None: the last)."""
        ...

    def count(self, search: JobSearch, bound: int = ...) -> int:
        """How many jobs ``search`` matches, counted up to ``bound`` (``bound`` + 1: more)."""
        ...

    def ids(self, search: JobSearch, bound: int = ...) -> list[str]:
        """The ids of up to ``bound`` jobs ``search`` matches, oldest first."""
        ...


class Orders(Protocol):
    """The order role: an operator's hold and restart of a slot, read by its supervisor (comfysup.queue.orders)."""

    def hold_slot(self, host: str, slot: str, by: str | None, now: float | None = None) -> None:
        """Hold the slot for ``by`` (its runner claims nothing more), or put it back (``by`` None)."""
        ...

    def ask_restart(self, host: str, slot: str, by: str, now: float | None = None) -> None:
        """Ask the slot's supervisor to restart its server once its job is over."""
        ...

    def restart_done(self, host: str, slot: str, asked_at: float) -> None:
        """The restart asked at ``asked_at`` began (a newer ask stays)."""
        ...

    def slot_orders(self, host: str | None = None) -> list[SlotOrder]:
        """The orders that say something (held, a restart pending) of ``host``'s slots (None: every host's)."""
        ...


class Previews(Protocol):
    """The preview role: each running job's latest preview image (comfysup.queue.previews)."""

    def set_preview(self, claim: Claim, node_id: str | None, content_type: str, data: bytes) -> None:
        """The running job's latest preview image, replacing the one before (fenced; not durable)."""
        ...

    def previews(self, ids: Sequence[str], known: Mapping[str, int]) -> dict[str, Preview]:
        """The latest previews of ``ids`` whose number moved from ``known`` (the API's event watcher)."""
        ...


class Assets(Protocol):
    """The asset role: input files, their uploads to servers, the API's asset records (comfysup.queue.assets)."""

    assets_dir: Path | None
    asset_bucket: AssetBucket | None

    def read_asset(self, digest: str) -> bytes:
        """An input file's bytes (the runner uploads them)."""
        ...

    def assets_needed(self) -> set[str]:
        """The hashes of the input files that queued and running jobs need."""
        ...

    def server_assets(self, server: str) -> dict[str, tuple[str, int, float]]:
        """What ``server`` (machine/runner) was given: hash → (name there, size, last used)."""
        ...

    def record_upload(self, server: str, digest: str, name: str, size: int, now: float) -> None: ...

    def touch_upload(self, server: str, digest: str, now: float) -> None: ...

    def forget_upload(self, server: str, digest: str) -> None: ...

    def asset_totals(self) -> dict[str, int]:
        """Input files stored, their bytes, and uploads to servers (status and metrics)."""
        ...

    def add_api_asset(self, asset: NewAsset, content_type: str, retention_seconds: float, key: str | None = None,
                      now: float | None = None) -> tuple[ApiAsset, bool]:
        """Store ``asset`` (its bytes at ``asset.path``, hashed again while copied) unless its content is already
        stored, and mint a record over it, in one durable transaction: ``(record, created_new)``. ``key`` (the
        upload's Idempotency-Key) is single-use, held by the record's unique ``idem_key``: one seen before, or
        committed by another upload while this one ran, is UploadConflict and nothing is stored."""
        ...

    def mint_api_asset(self, digest: str, file_path: str, content_type: str, retention_seconds: float,
                       now: float | None = None) -> tuple[ApiAsset, bool] | None:
        """A record over content already stored (``POST /assets/from-hash``): ``(record, minted)``; a live record
        of the same content and name is answered instead of a new one (its deadline extended, never shortened).
        None when the content is not stored."""
        ...

    def api_asset(self, asset_id: str) -> ApiAsset | None:
        """The record (expired or not: the caller decides) or None."""
        ...

    def has_asset(self, digest: str) -> bool: ...

    def asset_size(self, digest: str) -> int | None:
        """The stored content's size, or None when the store does not hold it."""
        ...

    def delete_api_asset(self, asset_id: str) -> bool:
        """Remove the record; its content too when no job and no other record needs it. False: no such record."""
        ...

    def asset_file(self, digest: str) -> Path | None:
        """Where a stored content's bytes are on this machine; None when they are chunks in the database."""
        ...

    def asset_chunk(self, digest: str, n: int) -> bytes:
        """Chunk ``n`` (CHUNK_BYTES each but the last) of a content kept in the database or the bucket; b"" past
        its end."""
        ...

    def prune_assets(self, now: float | None = None) -> tuple[int, int]:
        """Remove API upload records past their retention, then the input files no remaining job needs and no
        record keeps: (how many files, their bytes). Rows first, then files."""
        ...
