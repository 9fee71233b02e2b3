"""What a runner is given besides its config, server and URL: its :class:`RunnerOptions` (what it is) and its
:class:`RunnerHooks` (how it reaches whoever supervises it: ``comfysup run``'s slot, ``comfysup work``'s child,
or nobody, when every hook does nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from comfysup.queue.base import Claim
from comfysup.runner.memory import MemoryHooks
from comfysup.runner.result import Outcome
from comfysup.runner.stuck import StuckChannel
from comfysup.runner.warmup import WarmUp


@dataclass(frozen=True)
class RunnerOptions:
    """What a runner is."""

    peers: dict[str, str] = field(default_factory=dict)
    """Other servers by name, where an earlier attempt of a job may have run (for catch-up)."""
    until_empty: bool = False
    """Stop once no job is left to do (else: run until stopped)."""
    owner_token: str | None = None
    """The last part of the owner of its claims, picked by its supervisor before the fork (make_owner)."""
    output_dirs: dict[str, Path] | None = None
    """The output folders comfysup can see, by server name (for adoption from disk)."""


@dataclass(frozen=True)
class RunnerHooks:
    """How a runner reaches its supervisor. Each is called from the runner's loop, never from a signal handler."""

    on_alive: Callable[[], None] = lambda: None
    """A sign of life, at every turn of the loop and wake-up of an attempt."""
    may_claim: Callable[[], bool] = lambda: True
    """Whether a job may be claimed now (False: the server is about to be recycled or restarted)."""
    on_job: Callable[[Claim, Outcome | None], None] = lambda claim, outcome: None
    """Called with (claim, None) when an attempt starts and (claim, outcome) when it ends: a supervisor
    learns the current job and counts jobs per server (for recycling) without asking the queue."""
    may_queue_ahead: Callable[[int], bool] = lambda uncounted: True
    """Whether a job may be queued ahead behind the running one, given how many jobs of this runner are on the
    server and not counted yet (False: the server is recycled after those)."""
    on_waiting: Callable[[bool], None] = lambda waiting: None
    """Called with True when this runner found no job (it waits for work), False when it holds a job or its
    server cannot take one (busy with other clients' prompts, out of service): what its peers' peer_waiting
    reads."""
    peer_waiting: Callable[[], bool] = lambda: False
    """Whether another runner of this machine waits for work: then no job waits here behind a running prompt
    (none is queued ahead, and one queued ahead goes back to the queue, uncounted)."""
    on_problem: Callable[[str], None] = lambda reason: None
    """Called with why the server, though it answers, can take no job (its /queue cannot be read), and with ""
    once it answers well again: what status, health and /metrics show."""
    stuck: StuckChannel | None = None
    """How this runner says that a prompt is stuck in its server (comfysup.runner.stuck)."""
    memory: MemoryHooks | None = None
    """Who restarts the server after a lost device, and where memory recoveries are counted."""
    warmup: WarmUp | None = None
    """The warm-up its supervisor asks of each start of its server (comfysup.runner.warmup), run while idle."""
