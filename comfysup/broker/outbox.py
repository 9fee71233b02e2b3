"""The broker outbox's publisher: each pending announcement to its exchange, confirmed, then marked sent.

The queue wrote the row in the transaction that ended the job (comfysup.queue, ``announce``), so a job is
never terminal without one. A row is marked sent only after the broker confirmed the message (publisher
confirms: the broker has it on disk for a durable queue behind the exchange), so a crash or a lost
connection between the two publishes it again: at least once. A consumer deduplicates by ``message_id``,
the job id. The body is the webhook's (comfysup.observability.webhooks.record_body), secrets masked.

Every result is published ``mandatory``: an exchange with no queue bound returns it instead of dropping it.
A returned row stays pending in the outbox, counted (``returned``) and held back (``unroutable``, shown by
``status``, the page and /metrics), and its exchange is tried again every ``UNROUTABLE_RETRY_SECONDS``
until a queue is bound; rows for the other exchange go on being published meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from comfysup.broker.connection import persistent
from comfysup.config import RabbitMQConfig
from comfysup.observability.webhooks import encode, record_body
from comfysup.queue.base import DONE, TERMINAL, JobRecord, Queue
from comfysup.storage.links import no_links

log = logging.getLogger("comfysup.broker.outbox")

BATCH = 100
MAX_READ = 5000
"""Rows read in one pass at most, held-back rows included (so rows behind them still go out)."""
STATE_HEADER = "x-comfysup-state"
UNROUTABLE_RETRY_SECONDS = 5.0


class Announcer:
    """Publishes the outbox of one queue on a confirming channel; ``flush`` is one pass."""

    def __init__(self, queue: Queue, settings: RabbitMQConfig, clock: Callable[[], float] = time.monotonic,
                 links: Callable[[str], dict[str, Any]] = no_links) -> None:
        self.queue = queue
        self.links = links
        """Presigned URLs of outputs in a bucket (comfysup.storage.links), made as each result is published."""
        self.settings = settings
        self.clock = clock
        self.published = 0
        self.returned = 0
        """Publishes the broker returned as unroutable (counted at each try)."""
        self.held: dict[str, int] = {}
        """Rows held back at the last pass, by exchange: their exchange has no queue bound."""
        self._retry_at: dict[str, float] = {}

    def exchange(self, state: str) -> str:
        return self.settings.done_exchange if state == DONE else self.settings.dead_exchange

    @property
    def unroutable(self) -> int:
        return sum(self.held.values())

    def flush(self, channel: BlockingChannel, limit: int = BATCH) -> int:
        """Up to ``limit`` pending rows beyond those held back; returns how many were published. Broker errors
        propagate (the caller reconnects); rows already confirmed in this pass are marked first."""
        rows = self.queue.deliveries.pending_announcements(min(MAX_READ, limit + self.unroutable))
        if not rows:
            self.held = {}
            return 0
        jobs = {j.id: j for j in self.queue.reads.get_many(list({job_id for _, job_id, _ in rows}))}
        sent: list[int] = []
        held: dict[str, int] = {}
        published = 0
        try:
            for row_id, job_id, state in rows:
                exchange = self.exchange(state)
                if self._retry_at.get(exchange, 0.0) > self.clock():
                    held[exchange] = held.get(exchange, 0) + 1  # its exchange returned one moments ago: wait
                    continue
                job = jobs.get(job_id)
                if job is not None and job.state == state and state in TERMINAL:
                    if not self._publish(channel, exchange, job, job_id):
                        held[exchange] = held.get(exchange, 0) + 1
                        continue
                    published += 1
                # A job requeued since (or pruned) is not announced by this row: its next end writes its own.
                sent.append(row_id)
                if len(sent) >= limit:
                    break
        finally:
            self.queue.deliveries.mark_announced(sent)
            self.held = held
        return published

    def _publish(self, channel: BlockingChannel, exchange: str, job: JobRecord, job_id: str) -> bool:
        """True once the broker confirmed it; False when it returned it (no queue bound to the exchange)."""
        try:
            # basic_publish on a confirming channel returns once the broker acked it (NackError if not).
            channel.basic_publish(exchange, job.state, encode(record_body(job, self.links)),
                                  properties=persistent(job_id, {STATE_HEADER: job.state}), mandatory=True)
        except pika.exceptions.UnroutableError:
            self.returned += 1
            if exchange not in self._retry_at:
                log.warning("rabbitmq: exchange %r has no queue bound, so the broker returned job %s's result; "
                            "it stays in the outbox (with every result for this exchange) and is published once "
                            "a queue is bound to the exchange", exchange, job_id)
            self._retry_at[exchange] = self.clock() + UNROUTABLE_RETRY_SECONDS
            return False
        if self._retry_at.pop(exchange, None) is not None:
            log.info("rabbitmq: exchange %r routes again; publishing the results held for it", exchange)
        self.published += 1
        return True
