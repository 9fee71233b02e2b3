"""What an attempt returns, and what it asks the runner: plain values handed from one attempt to the next.

An attempt ends in one :class:`Outcome`, of one :class:`Ending`. A job *taken ahead* is one an attempt claims
before its own job is recorded, so that its server never waits between two prompts: queued ahead behind the
running prompt, posted at the hand-off the moment that prompt ends, or claimed with the done. Each is an
:class:`Ahead` entry (its claim, and its post when it was posted); the attempt returns them, in the order the
server runs them, in its :class:`AttemptResult`, and the runner hands them to the next attempt.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from comfysup.comfy import ComfyError
from comfysup.queue.base import Claim, Output


class Ending(enum.StrEnum):
    """How an attempt ends: the outcome it records (the queue's state of that name), or LOST (nothing written)."""

    DONE = "done"  # its files stored; recorded done
    RETRY = "retry"  # failed, transiently: recorded, tried again after a backoff
    DEAD = "dead"  # failed for good (permanently, or out of attempts): recorded dead
    CANCELLED = "cancelled"  # a user's cancel: its prompt interrupted, recorded cancelled
    RELEASED = "released"  # given back without counting the attempt (a stop, an OOM's release, a lost server)
    LOST = "lost"  # its lease or its queue is gone: nothing written; the job comes back when the lease expires


@dataclass
class Outcome:
    """What an attempt ended in, as recorded."""

    state: Ending
    reason: str = ""
    kind: str = ""
    outputs: list[Output] = field(default_factory=list)
    delay_seconds: float = 0.0
    adopted: bool = False
    adopted_from_disk: bool = False
    """Adopted from the job's files in the server's output folder: its history had died with the server."""
    server_free: bool = False
    """The server's own broadcast said its queue was empty once this prompt left it: the runner may claim
    the next job without asking GET /queue (see Runner._hand_off_claim)."""

    def __post_init__(self) -> None:
        self.state = Ending(self.state)  # given as its text too ("done"): always the enum, compared by identity


@dataclass(frozen=True)
class ClaimArgs:
    """The arguments of a claim of a job taken ahead for this server (Queue.claim, Queue.complete_and_claim)."""

    owner: str
    server: str
    lease_seconds: float
    prefer_model: str | None
    max_wait_seconds: float
    catalogue: int | None = None
    """The server's node catalogue: the claim passes over jobs it refused (comfysup.runner.catalogue)."""
    runnable: Callable[[Claim], bool] = lambda claim: True
    """Whether the server's catalogue can run a claimed job: only one that it can is posted ahead."""


AskHandOff = Callable[[Claim, Outcome], ClaimArgs | None]
"""The runner, asked whether a job may be taken ahead now that this one is over on the server: the claim to
make, or None. Asked once the prompt succeeded and the server said its queue is empty (the hand-off, with
``server_free``), and again, unless a job was taken then, just before the done is recorded (the claim then
rides in the done's transaction). The runner counts the attempt when first asked."""

AskQueueAhead = Callable[[Claim, int | None, int], ClaimArgs | None]
"""The runner, asked whether a job may be queued ahead in its server behind ``claim``'s prompt, which has just
started executing there (given the server's last broadcast ``queue_remaining``, and how many of its jobs on
the server are not counted yet: 1, or 2 when the attempt before ``claim``'s asks): the claim to make, or None.
Asked at most twice an attempt (behind its own prompt, and behind the next job's once its own has ended), and
never counts the attempt."""


@dataclass(frozen=True)
class AheadAsks:
    """What an attempt asks its runner before it takes a job ahead (None: never; the runner stops after this
    job, or [runner] queue_ahead is off)."""

    hand_off: AskHandOff | None = None
    queue_ahead: AskQueueAhead | None = None


class AheadPhase(enum.StrEnum):
    """Where a job taken ahead is."""

    CLAIMED = "claimed"  # claimed, not posted here: its own attempt posts it (or looks for an earlier run first)
    POSTED = "posted"  # posted (or its post failed: ``error``), its execution_start not read
    STARTED = "started"  # its execution_start read here, or its server showed it ran: it runs


_CLAIMED, _STARTED = AheadPhase.CLAIMED, AheadPhase.STARTED
"""The members as module names, for the code that runs at every message or wake-up: in Python 3.11 reading
``AheadPhase.X`` goes through the enum's metaclass's ``__getattr__`` hook (a call and an allocation each time),
reading a module name does not."""


@dataclass(slots=True)
class Ahead:
    """A job taken ahead: its claim, and what became of its post. Held (and its lease renewed) by the attempt
    that took it until that attempt ends, then handed to the attempt of that job, which starts where it is
    instead of posting it (``error``: what its post raised, that attempt's failure)."""

    claim: Claim
    claimed_at: float
    renewed_at: float
    """When its lease was last renewed (the attempt's clock)."""
    phase: AheadPhase = AheadPhase.CLAIMED
    posted_at: float = 0.0
    number: int | None = None
    error: ComfyError | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    """Its messages read from the shared socket by the attempt that took it: replayed to its own attempt."""
    waiting: bool = False
    """Posted behind a prompt that ran on the server then (queued ahead): the queue shows the job as posted until
    its execution start is recorded, by the end of the attempt ahead of it (``Queue.complete(started=)``) when
    that attempt read the start, else by its own attempt (``Queue.set_waiting``)."""
    unrecorded: bool = False
    """Posted, its number not recorded yet: the end of the attempt it was handed to records it."""
    behind_lost: bool = False
    """The prompt it was queued behind was lost by the server (gone without a history entry: a death or a
    restart) before it was seen to end, and this one was not seen to start: ComfyUI runs one prompt at a time,
    so if this one is gone too, it never ran (its attempt is released, not counted)."""

    @property
    def posted(self) -> bool:
        """Posted here (or its post tried): its attempt follows it instead of posting."""
        return self.phase is not _CLAIMED

    @property
    def started(self) -> bool:
        return self.phase is _STARTED


@dataclass(frozen=True)
class AttemptResult:
    """What an attempt did: its outcome (recorded, unless LOST) and the jobs it took ahead, in the order the
    server runs them (the first is the runner's next job)."""

    outcome: Outcome
    ahead: tuple[Ahead, ...] = ()

    @property
    def next_claim(self) -> Claim | None:
        """The runner's next job, taken ahead by this attempt (None: none)."""
        return self.ahead[0].claim if self.ahead else None
