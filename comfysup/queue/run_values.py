"""The queue's records that a runner, the API, the monitor, webhooks, show and prune make and read (and submit, for
a job with input files); comfysup.queue.values re-exports them beside the records every command makes.

Named tuples, not dataclasses: every command that opens a queue imports them all, and a named tuple is defined
without the ``exec`` of each generated method that makes a frozen dataclass slow to import. They are immutable and
compare by value alike; ``_replace`` makes a changed copy, ``_asdict`` the fields by name. A record is a tuple:
code that tells it from another tuple asks for the record's class, never for ``tuple``. The annotations are
evaluated here (no ``from __future__ import annotations``): typing.NamedTuple compiles each postponed one to check
it, which made these classes a third slower to define.
"""

from typing import Any, NamedTuple


class Claim(NamedTuple):
    """A job held by one runner: the fence (id, attempt, owner) and what is needed to run it."""

    id: str
    attempt: int
    owner: str
    server: str
    workflow: dict[str, Any]
    extra_data: dict[str, Any]
    lease_until: float
    last_server: str | None = None
    last_prompt_number: int | None = None
    last_reason: str | None = None
    cancel_requested: bool = False
    model_key: str | None = None
    """What the job's loader nodes load: a runner passes it to its next claim as ``prefer_model``."""
    waiting: bool = False
    """Marked waiting for its server by the runner that claimed it ahead (``Queue.set_waiting``): its attempt says
    when that ends (a claim from the queue is never waiting)."""


class Output(NamedTuple):
    """A file in the result store: its name in the job's folder, size and sha256, and the output node that made
    it (the key of the history's ``outputs``; "" when a run adopted from disk cannot tell, or for a record of
    an earlier version)."""

    name: str
    size: int
    sha256: str
    path: str = ""
    node_id: str = ""
    id: str = ""
    """Its asset UUID (the Comfy API v2's output ``id``), given by the queue when the job is done; "" for a record
    of an earlier version, whose API id is ``<job id>.<n>``."""


class PromptRecord(NamedTuple):
    """The prompt a claimed job was posted as, to be recorded (``Leases.record_prompt``'s arguments): ``number`` on
    ``server`` (at ``url``), ``waiting`` behind another prompt that runs there."""

    claim: Claim
    server: str
    number: int
    url: str | None = None
    waiting: bool = False


class Preview(NamedTuple):
    """A running job's latest preview image (comfysup.queue.previews): ``n`` counts its replacements."""

    n: int
    node_id: str | None
    content_type: str
    data: bytes


class Attempt(NamedTuple):
    """One attempt of a job as recorded: who ran it where, when, how it ended and why, and its trace."""

    attempt: int
    owner: str
    server: str
    started_at: float
    ended_at: float | None
    outcome: str | None
    reason: str | None
    prompt_number: int | None
    kind: str | None = None
    """The reason class of the outcome (oom, timeout, http_5xx, lease_expired, …); None for a success."""
    trace: dict[str, Any] | None = None
    """What the attempt saw: phases with times, each node's time, cached nodes, last progress."""


class JobPulse(NamedTuple):
    """What changes while a job runs, read without its workflow (the API's event streams watch this)."""

    id: str
    state: str
    attempt: int
    cancel_requested: bool
    progress: dict[str, Any] | None
    waiting_since: float | None = None
    """Running, but waiting in its server's queue (posted): since when."""


class RunningJob(NamedTuple):
    """A running job; with ``waiting_since``, one that waits in its server's queue (shown as posted)."""

    id: str
    owner: str
    server: str
    attempt: int
    started_at: float
    lease_until: float
    progress: dict[str, Any] | None = None
    waiting_since: float | None = None

    @property
    def posted(self) -> bool:
        return self.waiting_since is not None


class EndedAttempt(NamedTuple):
    """An attempt that ended, with what metrics need of its job (observed once each, as it ends).

    Never its trace (several KB of JSON): only the two numbers metrics take from it, counted by the
    database, so reading the attempts that ended costs the same whatever their traces hold."""

    job_id: str
    attempt: int
    outcome: str
    kind: str | None
    started_at: float
    ended_at: float
    nodes_run: int
    """Nodes in the trace's ``nodes`` list (run by ComfyUI); 0 without a trace."""
    nodes_cached: int
    """Nodes in the trace's ``cached`` list (served from ComfyUI's cache); 0 without a trace."""
    workflow_name: str
    submitted_at: float
    first_started_at: float
    """When the job's first attempt started: queue wait is this minus ``submitted_at``."""
    comfyui_wait_s: float | None = None
    """Seconds the attempt's prompt waited in ComfyUI's queue (behind the prompt ahead of it); None: no trace."""
    run_s: float | None = None
    """Seconds of the attempt that were not that wait (comfysup.runner.trace.figures); None: no trace."""
    first_comfyui_wait_s: float | None = None
    """Of a job's last attempt (one that ended it): the seconds its first attempt waited in ComfyUI's queue, which
    the job's metrics count as queueing, not as its duration."""


class Delivery(NamedTuple):
    """One webhook of one terminal job: pending while ``next_at`` is set, else delivered or given up."""

    id: int
    job_id: str
    url: str
    attempts: int
    created_at: float
    next_at: float | None
    last_status: int | None
    last_error: str | None
    delivered_at: float | None

    @property
    def state(self) -> str:
        if self.delivered_at is not None:
            return "delivered"
        return "pending" if self.next_at is not None else "failed"


class PruneBatch(NamedTuple):
    """One transaction of ``prune``: the jobs removed (with the machine that holds their files)."""

    removed: list[tuple[str, str | None]]
    workflows_removed: int = 0


class ApiEndpoint(NamedTuple):
    """A machine's Comfy API v2 as the other machines reach it (``[api] public_url``), and how fresh that is."""

    host: str
    url: str
    age_seconds: float
    """Seconds since its API's last heartbeat, on the clock that stamped it (the database's for PostgreSQL)."""


class NewAsset(NamedTuple):
    """An input file a job needs: stored by its hash at submit. ``path`` is the file to read; None for an asset
    the job names by its hash alone (an API v2 reference), which must be in the store already."""

    hash: str
    size: int
    name: str
    path: str | None = None


class JobRecord(NamedTuple):
    """A job as the queue holds it: its state, its workflow and parameters, its attempts and its outputs."""

    id: str
    state: str
    priority: int
    attempt: int
    workflow: dict[str, Any]
    extra_data: dict[str, Any]
    meta: dict[str, Any]
    params: dict[str, Any]
    workflow_name: str
    submitted_at: float
    run_after: float
    owner: str | None
    server: str | None
    lease_until: float | None
    started_at: float | None
    finished_at: float | None
    reason: str | None
    outputs: list[Output]
    cancel_requested: bool
    attempts: list[Attempt] = []  # noqa: RUF012  (never changed in place: a record is immutable)
    machine: str | None = None
    """The host whose runner completed the job: where its files are when ``store.dir`` is not shared."""
    spec_hash: str = ""
    last_server: str | None = None
    last_prompt_number: int | None = None
    progress: dict[str, Any] | None = None
    """The running attempt's progress (node k of n, step i of m), as last written."""
    callback_url: str | None = None
    model_key: str | None = None
    template: dict[str, Any] | None = None
    """The stored workflow before ``params`` (shared by every job of a batch); what a migration copies."""
    waiting_since: float | None = None
    """A running job that waits in its server's queue (posted behind the prompt that runs there): since when."""
    staged_at: float | None = None
    """A storing job: since when its outputs wait for the bucket in ``staged_in`` on ``machine``."""
    staged_in: str | None = None
    """A storing job: the staging folder on ``machine`` that holds its outputs (``Output.path`` of each)."""
    tenant: str = "default"
    """Who the job belongs to (comfysup.queue.tenants)."""

    @property
    def shown_state(self) -> str:
        """The state as people see it: ``posted`` for a running job that waits in its server's queue."""
        return "posted" if self.state == "running" and self.waiting_since is not None else self.state


class ApiAsset(NamedTuple):
    """An asset uploaded through the API: the record a client's ``core/ASSET`` reference names by ``id``."""

    id: str
    hash: str
    size: int
    file_path: str
    content_type: str
    created_at: float
    expires_at: float
    tenant: str = "default"
    """Whose upload it is (comfysup.queue.tenants): only that tenant's token, or the admin's, sees it."""
