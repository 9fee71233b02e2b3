"""The small things an attempt is made of: the prompt it follows, how it stops early, its shielded queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comfysup.queue.base import Queue
from comfysup.runner import deadline
from comfysup.runner import outputs as job_outputs
from comfysup.runner.client import ComfyClient, EventStream
from comfysup.runner.result import Outcome


class ShieldedQueue:
    """The queue, with every call shielded from the attempt's alarm: a transaction is never cut in the middle
    (the alarm falls as the call returns instead)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._queue, name)

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
    """The prompt being followed: where, which number, and what was seen of it."""

    client: ComfyClient
    server: str
    number: int | None
    stream: EventStream | None = None
    adopted_entry: dict[str, Any] | None = None
    """A finished run's history entry found at catch-up: nothing to follow."""
    from_disk: list[job_outputs.Found] | None = None
    """A finished run whose history died with its server, adopted from the job's folder in the server's
    output folder (``adopted_entry`` is then empty): its files are read from there, not through /view."""
    started: bool = False
    success_seen: bool = False
    interrupt_asked: bool = False
    end_seen: bool = False
    """``executing`` with node None for this prompt: ComfyUI sends it after the history is written, and
    after the ``status`` broadcast that follows the prompt leaving its queue."""
    queue_remaining: int | None = None
    """``exec_info.queue_remaining`` of the last ``status`` broadcast read on this run's socket."""
