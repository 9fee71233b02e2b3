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
from typing import Any

from comfysup.errors import QueueError
from comfysup.jobs.catalogue import first_issue
from comfysup.queue.base import Claim, Queue, host_name
from comfysup.runner import deadline
from comfysup.runner.client import ComfyClient, ComfyError

log = logging.getLogger("comfysup.runner")


class ServerCatalogue:
    """What this runner's server can run, as recorded in the queue: ``id`` is None until it is known."""

    def __init__(self, queue: Queue, client: ComfyClient, server: str) -> None:
        self.queue, self.client, self.server = queue, client, server
        self.id: int | None = None
        self.info: dict[str, Any] = {}
        self.stale = True
        """Record on the next chance: at the start, and after the server was seen down (a restart may bring
        other custom nodes or model files)."""

    def server_down(self) -> None:
        self.stale = True

    def refresh(self) -> None:
        """Read /object_info and record it, when stale; a server or queue that fails leaves it stale (the
        claim then goes on with the catalogue last recorded, or unfiltered before the first)."""
        if not self.stale:
            return
        try:
            info = self.client.object_info()
            catalogue_id = self.queue.record_catalogue(self.server, host_name(), info)
        except (ComfyError, QueueError, deadline.DeadlineExceeded) as exc:
            log.debug("%s: /object_info not recorded yet: %s", self.server, exc)
            return
        if catalogue_id != self.id:
            log.info("%s: node catalogue recorded (%d node classes, catalogue %d)", self.server, len(info),
                     catalogue_id, extra={"event": "catalogue"})
        self.id, self.info, self.stale = catalogue_id, info, False

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
