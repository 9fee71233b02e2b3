"""A prompt that stays in its server's queue after /interrupt: a custom node that never checks the flag.

ComfyUI runs one prompt at a time, so such a prompt blocks every later job of that server. The attempt that
interrupted it says so through a :class:`StuckChannel`, and what happens next depends on who owns the server:

- ``comfysup run`` launched it: the supervisor restarts it (SIGTERM, then SIGKILL). The attempt keeps its
  claim and its lease meanwhile and records its outcome (a transient failure of kind ``stuck``, retried or
  dead-lettered by the retry policy) only once the supervisor says the server is gone: the job is handed on
  only after its prompt is gone with the server's pid (invariant 3).
- ``comfysup work`` (servers that are not ours): nothing can restart it. The attempt ends at once, and the
  runner claims nothing for that server (:class:`OutOfService`) until its /queue is empty again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("comfysup.runner")

STUCK_KIND = "stuck"
OUT_OF_SERVICE_POLL_SECONDS = 5.0
"""How often a runner whose server holds a stuck prompt reads its /queue to see whether it emptied."""
RESTART_WAIT_SECONDS = 120.0
"""How long an attempt waits for its supervisor to restart the server before it ends anyway: the restart
takes the supervisor's kill bound (seconds), so this is only reached when the supervisor hangs or stops."""


def stuck_reason(server: str, leave_queue_seconds: float, restarted: bool) -> str:
    """The attempt's reason, as people read it in ``show`` and dead letters."""
    what = f"the prompt did not leave {server}'s queue within {leave_queue_seconds:g} s of /interrupt"
    if restarted:
        return f"{what}; the server was restarted"
    return f"{what}; {server} is out of service until its queue is empty (its server is not comfysup's to restart)"


def out_of_service_reason(prompt_id: str) -> str:
    return f"out of service: prompt {prompt_id} stuck after /interrupt"


@dataclass
class StuckChannel:
    """How a runner tells its parent that its server holds a stuck prompt (``report(prompt_id)``; ``""``
    when the server is in service again) and whether the report is still open (``pending()``: under
    ``run``, until the supervisor has seen the server's pid end). ``restarts``: the parent restarts the
    server (``run``, a launched slot); otherwise the runner takes the server out of service itself."""

    restarts: bool = False
    report: Callable[[str], None] = field(default=lambda prompt_id: None)
    pending: Callable[[], bool] = field(default=lambda: False)


@dataclass
class OutOfService:
    """A runner's own server, out of service since a prompt got stuck in it (``comfysup work``): nothing is
    claimed for it until its /queue is empty, read every ``poll_seconds``. Pure: ``due(now)`` says when to
    read the queue, ``seen(now, queue_length)`` takes the answer and says whether it is back in service."""

    poll_seconds: float = OUT_OF_SERVICE_POLL_SECONDS
    prompt_id: str | None = None
    since: float = 0.0
    next_poll: float = 0.0

    @property
    def active(self) -> bool:
        return self.prompt_id is not None

    @property
    def reason(self) -> str | None:
        return None if self.prompt_id is None else out_of_service_reason(self.prompt_id)

    def begin(self, prompt_id: str, now: float) -> None:
        self.prompt_id, self.since, self.next_poll = prompt_id, now, now + self.poll_seconds

    def due(self, now: float) -> bool:
        return self.active and now >= self.next_poll

    def seen(self, now: float, queue_length: int | None) -> bool:
        """``queue_length``: the server's /queue (running and pending), None when it did not answer. True
        when the server is back in service (its queue is empty)."""
        self.next_poll = now + self.poll_seconds
        if queue_length != 0:
            return False
        self.prompt_id = None
        return True


def report_stuck(channel: StuckChannel, prompt_id: str, own: bool, alive: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> bool:
    """Report a stuck prompt of the runner's own server (``own``; a peer's is left to the attempt that
    follows it there) and, when the parent restarts that server, wait for it, holding the claim and calling
    ``alive`` (lease, sign of life) on the way. True when the server was restarted."""
    if not own:
        return False
    channel.report(prompt_id)
    if not channel.restarts:
        log.error("the server is out of service until its queue is empty: %s", out_of_service_reason(prompt_id))
        return False
    log.error("asking the supervisor to restart the server; the job is handed on once it is gone")
    until = clock() + RESTART_WAIT_SECONDS
    while channel.pending() and clock() < until:
        alive()
        time.sleep(0.05)
    return not channel.pending()
