"""The small things an attempt is made of: what its steps read (``Context``), its heartbeat clock, the prompt it
follows (``Run``), how it stops early (``Stop``), its shielded queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from comfysup.comfy import ComfyClient, EventStream, deadline
from comfysup.queue.base import Claim, Queue
from comfysup.redact import Redactor
from comfysup.runner import outputs as job_outputs
from comfysup.runner.machine import Phase, RunMachine
from comfysup.runner.result import Outcome

if TYPE_CHECKING:
    from comfysup.runner.station import AttemptSettings, Station
    from comfysup.runner.trace import Trace


_REDACTORS: dict[int, tuple[Claim, Redactor]] = {}


def redactor_of(claim: Claim) -> Redactor:
    """The claim's Redactor, collected once: the loop's log context, its attempt, and the attempt that claimed
    it as its next job each need it (three walks of the job's data a job, in the runner's profile). Kept by
    the claim object itself, held here, so another job (or a test's job of the same id) never gets it."""
    entry = _REDACTORS.get(id(claim))  # while held here, no other object can have the claim's id
    if entry is None:
        if len(_REDACTORS) >= 8:  # a runner holds at most three jobs at once
            _REDACTORS.clear()
        entry = _REDACTORS[id(claim)] = (claim, Redactor.for_job(claim.workflow, claim.extra_data))
    return entry[1]


@dataclass(frozen=True)
class Context:
    """What every step of one attempt reads, made once for that attempt: the runner's station and settings, the
    claim, the queue (shielded), the runner's own client, the clocks and the attempt's trace. A step is given
    it, and whatever else it needs, as arguments; none of it is swapped during the attempt (the trace records,
    the queue writes)."""

    station: Station
    s: AttemptSettings
    claim: Claim
    queue: Queue
    client: ComfyClient
    clock: Callable[[], float]
    wall: Callable[[], float]
    trace: Trace


@dataclass
class Heartbeat:
    """When the attempt next renews its lease (and those of the jobs it took ahead): one clock, read by the
    follow loop, the wait for an interrupted prompt to leave and the download (which asks for one at once)."""

    interval: float
    next: float

    def due(self, now: float) -> bool:
        """Whether a heartbeat is due at ``now``; when it is, the next one is set an interval later."""
        if now < self.next:
            return False
        self.next = now + self.interval
        return True

    def now(self, now: float) -> None:
        """The next check makes one, whenever the last was."""
        self.next = now


class ShieldedQueue:
    """The queue, with every call shielded from the attempt's alarm: a transaction is never cut in the middle
    (the alarm falls as the call returns instead)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._queue, name)
        if not callable(method):  # a role of the queue (its leases, assets, ...): its calls are shielded too
            role = ShieldedQueue(method)
            setattr(self, name, role)  # a queue's roles are fixed: the next lookup finds this one directly
            return role

        def shielded(*args: Any, **kwargs: Any) -> Any:
            with deadline.deferred():
                return method(*args, **kwargs)

        return shielded


class Stop(Exception):
    """The attempt must end now with this outcome (raised from deep in the follow loop)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


@dataclass
class Run:
    """The prompt being followed: where, which number, and its protocol state (``m``, a pure
    :class:`comfysup.runner.machine.RunMachine`)."""

    client: ComfyClient
    server: str
    number: int | None
    stream: EventStream | None = None
    adopted_entry: dict[str, Any] | None = None
    """A finished run's history entry found at catch-up: nothing to follow."""
    from_disk: list[job_outputs.Found] | None = None
    """A finished run whose history died with its server, adopted from the job's folder in the server's
    output folder (``adopted_entry`` is then empty): its files are read from there, not through /view."""
    behind_lost: bool = False
    """Queued behind a prompt its server lost before that one ended (see ``Ahead.behind_lost``)."""
    preview: tuple[str | None, str, bytes] | None = None
    """The newest preview frame of this run not yet written to the queue (node, content type, image): each
    frame replaces the one before, so however fast ComfyUI sends them, one is held."""
    started: InitVar[bool] = False
    """Its execution_start was read (by the attempt that posted it), or the server shows it running."""
    m: RunMachine = field(init=False)

    def __post_init__(self, started: bool) -> None:
        self.m = RunMachine(Phase.EXECUTING if started else Phase.QUEUED)
