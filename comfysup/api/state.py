"""What the API's handlers share (``request.app[STATE_KEY]``): the config, the queue and the one worker thread
that every queue call runs in, the threads that fetch inputs by URL, the intake, the checks of Host and Origin,
and the node catalogues read from the queue."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from comfysup.api import outputs
from comfysup.api.intake import Intake
from comfysup.api.security import Cors, HostCheck
from comfysup.api.tenancy import Tenancy
from comfysup.config import Config
from comfysup.jobs.catalogue import Catalogue
from comfysup.queue.watch import EXIT_DATABASE_REPLACED, QueueWatch, lost_line
from comfysup.storage.links import Links

log = logging.getLogger("comfysup.api")
T = TypeVar("T")
CATALOGUE_SECONDS = 5.0
"""How long the node catalogues read from the queue are reused before they are read again."""
FETCH_THREADS = 4
"""Inputs by URL downloaded at once, in threads of their own: a slow one may take [inputs] max_seconds, and in the
loop's default executor a few would hold the threads that uploads and the queue file's watch need. More wait."""


class State:
    """What the handlers share: the config, the queue, its one worker thread, the intake and the catalogues."""

    def __init__(self, config: Config, queue: Any) -> None:
        self.config = config
        self.queue = queue
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="comfysup-api-queue")
        self.fetcher = concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="comfysup-api-fetch")
        self.intake = Intake(config.resolve("."), config)
        self.store = config.resolve(config.store.dir)
        self.cors = Cors(config.api.allowed_origins)
        self.links = Links(config.store)
        """Presigned URLs of outputs in a bucket ([store] url)."""
        self.hosts = HostCheck(config.api.listen.rpartition(":")[0], config.api.public_url, config.api.allowed_hosts)
        self.tenancy = Tenancy(config)
        """Which tenant a request's token acts as (comfysup.api.tenancy)."""
        self.inputs = outputs.Inputs(self)
        """What a workflow's core/ASSET reference names: an upload, or an output (comfysup.api.outputs)."""
        self._catalogues: list[Catalogue] = []
        self._catalogues_at = float("-inf")
        self.watch = QueueWatch(queue, on_lost=lambda why: log.error("%s; the API answers 503 and stops (exit code "
                                                                     "%d)", lost_line(why), EXIT_DATABASE_REPLACED))
        """The queue's file (comfysup.queue.watch): lost, every answer is 503 and the process stops (serve.py)."""

    async def lost(self, write: bool) -> str | None:
        """Why the queue's file is lost, else None; looked at again just before a request that writes."""
        if write and self.watch.lost is None:
            await self.call(lambda: self.watch.check(force=True))
        return None if self.watch.lost is None else lost_line(self.watch.lost)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.worker, lambda: fn(*args))

    def catalogues(self) -> list[Catalogue]:
        """In the worker thread: the catalogues the servers have now, read at most every few seconds."""
        now = time.monotonic()
        if now - self._catalogues_at > CATALOGUE_SECONDS:
            self._catalogues = [Catalogue(r.id, r.info, tuple(r.servers)) for r in self.queue.fleet.catalogues()]
            self._catalogues_at = now
        return self._catalogues
