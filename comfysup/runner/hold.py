"""An attempt's hold on its leases while the queue does not answer (comfysup.errors.QueueUnavailable: a database
restarted, unreachable, or locked by a backup).

The lease in the queue runs from the last renewal that held; by this machine's clock it cannot run out before the
moment that renewal was sent plus ``lease_seconds`` (the database stamps it later than that). So a renewal that
fails is no reason to stop the prompt: the attempt goes on following it and tries again every RETRY_SECONDS, and
the first renewal that holds takes the job on as if nothing happened. Only when the lease's end comes within the
attempt's reserve (a heartbeat, and twice the longest a call waits for the database, so the interrupt is over
before the lease could hand the job to another runner) does it give up: the prompt is interrupted and nothing is
written, as for a lease lost. ``LeaseHold`` is the pure rule; ``Keeper`` carries it out around the attempt's calls.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from comfysup.errors import QueueUnavailable

log = logging.getLogger("comfysup.runner")
T = TypeVar("T")
RETRY_SECONDS = 1.0
"""How often a renewal (or a write the attempt cannot go on without) is tried again while the queue does not answer."""


class Verdict(enum.Enum):
    """What a failed renewal leaves the attempt to do."""

    KEEP = "keep"  # the lease holds a while yet: follow the prompt on, try again soon
    GIVE_UP = "give_up"  # the lease's end is within the reserve: interrupt the prompt, write nothing


def reserve_seconds(heartbeat_seconds: float, queue_wait_seconds: float) -> float:
    """How long before the lease's end an attempt whose queue does not answer gives up: a heartbeat, and twice the
    longest one call waits for the database (the failing one, and the interrupt's own margin)."""
    return heartbeat_seconds + 2 * queue_wait_seconds


@dataclass
class LeaseHold:
    """When the leases an attempt holds run out by its own clock, and what a failed renewal leaves it to do."""

    lease_seconds: float
    reserve_seconds: float
    renewed_at: float
    """The clock's time before the last renewal of this attempt's own lease that held (or before its claim)."""
    failing_since: float | None = None
    """When the first renewal that failed since the last one that held was tried; None while renewals hold."""

    def held_until(self, oldest: float) -> float:
        """The earliest end of a lease the attempt holds (``oldest``: the oldest renewal of a job taken ahead)."""
        return min(self.renewed_at, oldest) + self.lease_seconds

    def failed(self, now: float, oldest: float) -> Verdict:
        if self.failing_since is None:
            self.failing_since = now
        return Verdict.GIVE_UP if now + self.reserve_seconds >= self.held_until(oldest) else Verdict.KEEP

    def renewed(self, sent_at: float) -> float | None:
        """A renewal sent at ``sent_at`` held; how long calls had failed before it (None: they had not)."""
        self.renewed_at = max(self.renewed_at, sent_at)
        return self.answered(sent_at)

    def answered(self, now: float) -> float | None:
        """A call that renews nothing held at ``now``; how long calls had failed before it (None: they had not)."""
        since, self.failing_since = self.failing_since, None
        return None if since is None else now - since


class Keeper:
    """Carries out ``LeaseHold`` for one attempt: its clock, its heartbeat (a failed renewal is tried again
    RETRY_SECONDS later), the oldest renewal of the jobs it took ahead (``oldest``), its job's id (the log) and
    the runner's sign of life (``alive``)."""

    def __init__(self, hold: LeaseHold, clock: Callable[[], float], retry_at: Callable[[float], None],
                 oldest: Callable[[], float], job_id: str, alive: Callable[[], None] = lambda: None) -> None:
        self.hold = hold
        self.alive = alive
        """The runner's sign of life to its supervisor, given while a write waits for the queue."""
        self.clock = clock
        self.retry_at = retry_at
        self.oldest = oldest
        self.job_id = job_id

    @property
    def failing(self) -> bool:
        """Renewals fail: writes that can wait (progress, previews) are not tried meanwhile."""
        return self.hold.failing_since is not None

    def renew(self, renewal: Callable[[], T]) -> T | None:
        """``renewal()``'s answer when it held; None when it failed within the lease (tried again soon); raises the
        failure once the lease's end is within the reserve."""
        sent_at = self.clock()
        try:
            answer = renewal()
        except QueueUnavailable as exc:
            self._failed(exc)
            self.retry_at(self.clock() + RETRY_SECONDS)
            return None
        self._renewed(sent_at)
        return answer

    def persist(self, write: Callable[[], T]) -> T:
        """``write()``, tried again every RETRY_SECONDS while the queue does not answer and the lease holds (a write
        the attempt cannot go on without: a prompt's number, its outcome); raises the failure once the lease's end
        is within the reserve."""
        while True:
            try:
                answer = write()
            except QueueUnavailable as exc:
                self._failed(exc)
                self.alive()
                time.sleep(RETRY_SECONDS)
                continue
            self._answered(self.hold.answered(self.clock()), "")
            return answer

    def _failed(self, exc: QueueUnavailable) -> None:
        first = self.hold.failing_since is None
        now = self.clock()
        verdict = self.hold.failed(now, self.oldest())
        left = self.hold.held_until(self.oldest()) - now
        if verdict is Verdict.GIVE_UP:
            raise type(exc)(f"{exc}; the lease's end is {max(left, 0.0):.0f} s away, too close to go on",
                            maybe_stored=exc.maybe_stored) from exc
        if first:
            log.warning("job %s: the queue does not answer (%s); following the prompt on, renewing when it answers "
                        "(the lease holds %.0f s more)", self.job_id, exc, left, extra={"event": "queue_down"})

    def _renewed(self, sent_at: float) -> None:
        self._answered(self.hold.renewed(sent_at), "; lease renewed")

    def _answered(self, failed_for: float | None, what: str) -> None:
        if failed_for is not None:
            log.info("job %s: the queue answers again after %.1f s%s", self.job_id, failed_for, what,
                     extra={"event": "queue_up"})
