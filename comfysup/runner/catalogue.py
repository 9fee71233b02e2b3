"""A runner's node catalogue: its server's /object_info, recorded in the queue once per server start, and the
check of a claimed job against it before anything is posted.

The queue keeps each distinct /object_info once and which one each server (runner name, machine) has now
(``Queue.record_catalogue``); submit checks jobs against those, and the claim passes over jobs that this
server's catalogue refused. A job that this catalogue meets for the first time (a catalogue that changed
since the submit: a custom node removed, a model file gone) is checked here; if it cannot run, the runner
records the refusal and leaves the job without counting an attempt (``Queue.refuse``), or the queue
dead-letters it when no server's catalogue can run it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from comfysup.comfy import ComfyClient, ComfyError, MalformedAnswer, deadline
from comfysup.errors import QueueError
from comfysup.jobs.catalogue import first_issue
from comfysup.queue.base import Claim, Queue, host_name

log = logging.getLogger("comfysup.runner")

RETRY_SECONDS = 5.0
"""After a malformed /object_info, the next read waits this long: the read runs before each claim while the
catalogue is stale, and a server whose catalogue cannot be read would be asked again and again for an answer
that can be tens of MiB. A server that does not answer (starting, down) is asked again at the next claim."""


class ServerCatalogue:
    """What this runner's server can run, as recorded in the queue: ``id`` is None until it is known."""

    def __init__(self, queue: Queue, client: ComfyClient, server: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queue, self.client, self.server, self.clock = queue, client, server, clock
        self.retry_at = 0.0
        self.id: int | None = None
        self.info: dict[str, Any] = {}
        self.stale = True
        """Record on the next chance: at the start, and after the server was seen down (a restart may bring
        other custom nodes or model files)."""

    def server_down(self) -> None:
        self.stale = True
        self.retry_at = 0.0  # a server back from down is read at once: it may have other nodes now

    def refresh(self) -> None:
        """Read /object_info and record it, when stale; a server or queue that fails leaves it stale (the
        claim then goes on with the catalogue last recorded, or unfiltered before the first)."""
        if not self.stale or self.clock() < self.retry_at:
            return
        try:
            info = self.client.object_info()
            catalogue_id = self.queue.fleet.record_catalogue(self.server, host_name(), info)
        except MalformedAnswer as exc:  # it answers, with a catalogue that cannot be read: worth a person's look
            self.retry_at = self.clock() + RETRY_SECONDS
            log.warning("%s: /object_info not recorded (tried again in %g s): %s", self.server, RETRY_SECONDS, exc)
            return
        except (ComfyError, QueueError, deadline.DeadlineExceeded) as exc:  # starting, down, or the queue: soon
            log.debug("%s: /object_info not recorded yet: %s", self.server, exc)
            return
        if catalogue_id != self.id:
            log.info("%s: node catalogue recorded (%d node classes, catalogue %d)", self.server, len(info),
                     catalogue_id, extra={"event": "catalogue"})
        # The check reads each class's inputs only (comfysup.jobs.catalogue): its descriptions, outputs and
        # categories (a third of a real /object_info) are not kept for the runner's life. A class without inputs
        # keeps none (the wire lets one through; the check reads it as having no inputs).
        inputs = {name: {"input": c.get("input")} for name, c in info.items()}
        self.id, self.info, self.stale = catalogue_id, inputs, False

    def refusal(self, claim: Claim) -> str | None:
        """Why this server cannot run the claimed job (as ComfyUI's validation would say), or None."""
        if self.id is None:
            return None
        issue = first_issue(claim.workflow, self.info)
        if issue is None:
            return None
        return f"node {issue.node_id} ({issue.class_type}): {issue.text}"

    def runnable(self, claim: Claim) -> bool:
        return self.refusal(claim) is None
