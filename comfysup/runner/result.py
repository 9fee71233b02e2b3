"""What an attempt returns, and what it asks the runner: plain values handed from one attempt to the next.

An attempt ends in one :class:`Outcome`. When the runner goes on, the attempt also claims the runner's next
job (the claim's arguments, a :class:`NextClaim`, come from the runner's ``NextJob``) and, at the hand-off,
posts its prompt (:class:`Posted`); all three come back in an :class:`AttemptResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from comfysup.comfy import ComfyError
from comfysup.queue.base import Claim, Output


@dataclass
class Outcome:
    """What an attempt ended in, as recorded: done, retry, dead, cancelled, released, or lost."""

    state: str
    reason: str = ""
    kind: str = ""
    outputs: list[Output] = field(default_factory=list)
    delay_seconds: float = 0.0
    adopted: bool = False
    adopted_from_disk: bool = False
    """Adopted from the job's files in the server's output folder: its history had died with the server."""
    server_free: bool = False
    """The server's own broadcast said its queue was empty once this prompt left it: the runner may claim
    the next job without asking GET /queue (see Runner._next_job)."""


@dataclass(frozen=True)
class NextClaim:
    """The arguments of a claim of the next job for this server (Queue.claim, Queue.complete_and_claim)."""

    owner: str
    server: str
    lease_seconds: float
    prefer_model: str | None
    max_wait_seconds: float
    catalogue: int | None = None
    """The server's node catalogue: the claim passes over jobs it refused (comfysup.runner.catalogue)."""
    runnable: Callable[[Claim], bool] = lambda claim: True
    """Whether the server's catalogue can run a claimed job: a hand-off posts only one that it can."""


NextJob = Callable[[Claim, Outcome], NextClaim | None]
"""The runner, asked whether the next job may be claimed now that this one is over on the server: the
claim to make, or None. Asked once the prompt succeeded and the server said its queue is empty (the
hand-off, with ``server_free``), and again, unless a job was claimed then, just before the done is recorded
(the claim then rides in the done's transaction). The runner counts the attempt when first asked."""

AheadJob = Callable[[Claim, int | None, int], NextClaim | None]
"""The runner, asked whether a job may be queued in its server behind ``claim``'s prompt, which has just
started executing there (given the server's last broadcast ``queue_remaining``, and how many of its jobs on
the server are not counted yet: 1, or 2 when the attempt before ``claim``'s asks): the claim to make, or None.
Asked at most twice an attempt (behind its own prompt, and behind the next job's once its own has ended), and
never counts the attempt."""


@dataclass(frozen=True)
class Posted:
    """The next job's prompt, posted by the previous attempt while its own run executed (queued ahead behind
    it, [runner] queue_ahead) or the moment it ended: where the next attempt starts instead of posting
    (``error``: what the post raised, the next attempt's failure)."""

    claim_id: str
    claimed_at: float
    posted_at: float
    number: int | None = None
    error: ComfyError | None = None
    started: bool = False
    """Its execution_start was read by the attempt that posted it (queued ahead, it starts when that one's
    run ends): the next attempt knows it runs, although the message is no longer in the socket."""
    events: tuple[dict[str, Any], ...] = ()
    """Its messages that the attempt which posted it read from the shared socket: replayed to its attempt."""
    waiting: bool = False
    """Posted behind a prompt that ran on the server then (queued ahead): the queue shows the job as posted until
    its execution start is recorded, by the end of the attempt that posted it (``Queue.complete(started=)``) when
    that attempt read the start, else by its own attempt (``Queue.set_waiting``)."""
    behind_lost: bool = False
    """The prompt it was queued behind was lost by the server (gone without a history entry: a death or a
    restart) before it was seen to end, and this one was not seen to start: ComfyUI runs one prompt at a time,
    so if this one is gone too, it never ran (its attempt is released, not counted)."""


@dataclass(frozen=True)
class Early:
    """A job claimed early (and maybe posted) by an attempt for the one after its next: queued behind the next
    job once this attempt's run ended. The next attempt holds it as its own next job."""

    claim: Claim
    posted: Posted | None


@dataclass(frozen=True)
class AttemptResult:
    """What an attempt did: its outcome (recorded, unless ``lost``) and the next job it claimed, if any."""

    outcome: Outcome
    next_claim: Claim | None = None
    """Claimed for this server by this attempt, at its hand-off or with its done: the runner's next job."""
    posted: Posted | None = None
    """``next_claim``'s prompt, already posted by the hand-off: its attempt follows it instead of posting."""
    behind: Early | None = None
    """A job queued behind ``next_claim``'s prompt (only with ``posted``): that attempt's next job."""
