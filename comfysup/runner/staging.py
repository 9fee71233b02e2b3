"""The staging folder's bound ([store] staging_max_gb): what the jobs waiting for the bucket hold on this machine.

While the bucket does not answer, every job that ends adds its outputs to the staging folder. Nothing staged is
ever dropped, so the bound is kept by taking no new work: when this machine's storing jobs hold
``staging_max_gb``, its supervisor (or ``comfysup work``) tells every runner not to claim, ``comfysup status``
and /ready say why, and claims resume once the uploader has freed room. A job already running when the bound is
reached still stages its files (the bound may be passed by what the running jobs make).
"""

from __future__ import annotations

import logging
from typing import Any

from comfysup.config import Config
from comfysup.errors import QueueError
from comfysup.queue.base import Queue, host_name

log = logging.getLogger("comfysup.staging")

LOOK_SECONDS = 1.0
"""How often the staged bytes are read (one indexed sum over this machine's storing rows)."""


class StagingBound:
    """Whether this machine's staging folder is full, looked up at most every LOOK_SECONDS (monotonic ``now``)."""

    def __init__(self, config: Config, machine: str | None = None) -> None:
        self.max_bytes = int(config.store.staging_max_gb * 2**30) if config.store.url else 0
        self.machine = machine or host_name()
        self.bytes = 0
        self.full = False
        self._next = 0.0

    def look(self, queue: Queue | None, now: float) -> bool:
        """Read the staged bytes when due; whether the folder is full now. A queue that does not answer keeps
        the last answer (its own outage is said elsewhere)."""
        if not self.max_bytes or queue is None or now < self._next:
            return self.full
        self._next = now + LOOK_SECONDS
        try:
            self.bytes = queue.uploads.staging_bytes(self.machine)
        except QueueError:
            return self.full
        full = self.bytes >= self.max_bytes
        if full != self.full:
            if full:
                log.warning("%s; no new job is claimed until uploads free room", self.reason())
            else:
                log.info("the staging folder has room again (%s): jobs are claimed again", self._amount())
        self.full = full
        return full

    def reason(self) -> str:
        return f"the staging folder is full ({self._amount()}, [store] staging_max_gb): outputs wait for the bucket"

    def snapshot(self) -> dict[str, Any] | None:
        """What status and /ready read (None: no bound)."""
        if not self.max_bytes:
            return None
        return {"bytes": self.bytes, "max_bytes": self.max_bytes, "full": self.full,
                "reason": self.reason() if self.full else ""}

    def _amount(self) -> str:
        return f"{self.bytes / 2**30:.2f} of {self.max_bytes / 2**30:g} GiB"
