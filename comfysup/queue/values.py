"""The records the queue takes and hands out (comfysup.queue.base's ``Queue`` protocol speaks in them).

Immutable records (named tuples, and records of comfysup.records where callers copy them with ``replace``), one
per thing a caller holds: a job to submit and its input files, a claim, a job's
record with its attempts and outputs, what status, metrics, webhooks and the machine registry read. The
backends build them from rows (comfysup.queue.records). Those that a plain submit or status never makes are in
comfysup.queue.run_values, re-exported here. The annotations are evaluated, as there (typing.NamedTuple compiles
each postponed one).
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

from comfysup.queue.run_values import (
    ApiAsset,
    ApiEndpoint,
    Attempt,
    Claim,
    Delivery,
    EndedAttempt,
    JobPulse,
    JobRecord,
    NewAsset,
    Output,
    Preview,
    PromptRecord,
    PruneBatch,
    RunningJob,
)
from comfysup.records import Record, new


class NewJob(Record):
    """A validated job, ready to insert. ``workflow`` has ``set`` applied already.

    A queue stores ``template_json`` (else ``workflow_json``, else ``workflow``'s text) and ``params``, and
    reads ``workflow`` only when neither text is given, or for its model key when ``model_key`` is None;
    comfysup submit's read-ahead (comfysup.jobs.JobsFile.jobs_read_ahead) gives both and leaves it empty."""

    id: str
    workflow: Mapping[str, Any]
    spec_hash: str
    priority: int = 0
    extra_data: dict[str, Any] = new(dict)
    meta: dict[str, Any] = new(dict)
    params: dict[str, Any] = new(dict)
    """The job's ``set`` overrides, kept to show and to tabulate results by."""
    workflow_name: str = ""
    workflow_json: str = ""
    """The workflow's canonical text, stored when no ``template_json`` is given (comfysup submit gives one and
    leaves this empty: the text is never built, only hashed into ``spec_hash``)."""
    callback_url: str = ""
    """Where to POST the job's record when it is terminal; empty: the config's [webhooks] url, if any."""
    template_json: str = ""
    """The workflow before ``set`` (canonical text), stored once per distinct text however many jobs share
    it; empty: ``workflow_json`` is stored as it is. ``params`` rebuilds ``workflow`` from it."""
    template_hash: str = ""
    """sha256 of ``template_json`` when the caller has it (computed once per file, not once per line)."""
    model_key: str | None = None
    """The model files the workflow loads (comfysup.workflows.model_key); None: the queue derives it."""
    refused: tuple[tuple[int, str], ...] = ()
    """(catalogue id, reason) of each known node catalogue that cannot run the job (comfysup.jobs.catalogue):
    a server whose catalogue it is never claims the job."""
    assets: tuple[NewAsset, ...] = ()
    """The input files the job's ``set`` names (comfysup.assets): stored with the job, in its transaction."""
    tenant: str = ""
    """Who the job belongs to (comfysup.queue.tenants): its share of the fleet and its limits; empty: ``default``."""


class SubmitResult(NamedTuple):
    """What one submit did: the jobs inserted, and those already in the queue with the same content."""

    inserted: int
    existing: int


class CatalogueRecord(NamedTuple):
    """A node catalogue (a server's /object_info) that some server has now, with those servers
    (``runner@machine``)."""

    id: int
    info: dict[str, Any]
    servers: list[str]


class Status(NamedTuple):
    """What ``comfysup status`` and the status page show: counts by state, the running jobs, the last ended."""

    counts: dict[str, int]
    """By state, with ``waiting`` (queued, waiting to retry) split out of ``queued`` and ``posted`` (running, waiting
    in a server's queue) out of ``running``."""
    oldest_queued_at: float | None
    running: list[RunningJob]
    """The running jobs, the posted ones among them (``RunningJob.posted``)."""
    recent_dead: list[tuple[str, float, str]]
    """(id, finished_at, reason), newest first."""
    recent_done: list[tuple[str, float]]
    """(id, finished_at), newest first: what the status page links the files of."""


class StagedJob(NamedTuple):
    """A storing job as its machine's uploader takes it: the outputs staged in ``staged_in`` (``Output.path``: each
    file there), since ``staged_at``; ``attempt`` fences the uploader's end of it."""

    id: str
    attempt: int
    machine: str
    staged_in: str
    staged_at: float
    staged_bytes: int
    outputs: list[Output]
    reason: str | None
    """Why the last try failed (None: none failed yet)."""
    tenant: str = "default"
    """Whose job it is (comfysup.queue.tenants): its tenant counts it done once it is stored."""


class OutboxLevel(NamedTuple):
    """What one outbox holds (uploads: storing jobs; webhooks: pending deliveries; broker: unconfirmed
    announcements): how many, their bytes where known, and the age of the oldest in seconds (None: empty)."""

    items: int
    oldest_age_seconds: float | None
    bytes: int | None = None


class TenantCount(NamedTuple):
    """One tenant as status, the page and /metrics show it: its jobs queued and running now, its jobs done so far,
    and the seconds its attempts held a slot (what its share is measured in)."""

    tenant: str
    weight: float
    max_running: int | None
    queued: int
    running: int
    done: int
    gpu_seconds: float


class Machine(NamedTuple):
    """A supervisor sharing the queue: one row per host and pid, refreshed by its heartbeat."""

    host: str
    pid: int
    slots: list[dict[str, Any]]
    started_at: float
    heartbeat_at: float
    age_seconds: float
    """Seconds since the last heartbeat, measured on the clock that stamped it (the database's for
    PostgreSQL), so the age is right even when this machine's clock is not."""


__all__ = ["ApiAsset", "ApiEndpoint", "Attempt", "CatalogueRecord", "Claim", "Delivery", "EndedAttempt", "JobPulse",
           "JobRecord", "Machine", "NewAsset", "NewJob", "OutboxLevel", "Output", "Preview", "PromptRecord",
           "PruneBatch", "RunningJob", "StagedJob", "Status", "SubmitResult", "TenantCount"]
