"""The broker outbox's publisher: each pending announcement to its exchange, confirmed, then marked sent.

The queue wrote the row in the transaction that ended the job (comfysup.queue, ``announce``), so a job is
never terminal without one. A row is marked sent only after the broker confirmed the message (publisher
confirms: the broker has it on disk for a durable queue behind the exchange), so a crash or a lost
connection between the two publishes it again: at least once. A consumer deduplicates by ``message_id``,
the job id. The body is the webhook's (comfysup.observability.webhooks.record_body), secrets masked.
"""

from __future__ import annotations

import logging

from pika.adapters.blocking_connection import BlockingChannel

from comfysup.broker.connection import persistent
from comfysup.config import RabbitMQConfig
from comfysup.observability.webhooks import encode, record_body
from comfysup.queue.base import DONE, TERMINAL, Queue

log = logging.getLogger("comfysup.broker.outbox")

BATCH = 100
STATE_HEADER = "x-comfysup-state"


class Announcer:
    """Publishes the outbox of one queue on a confirming channel; ``flush`` is one pass."""

    def __init__(self, queue: Queue, settings: RabbitMQConfig) -> None:
        self.queue = queue
        self.settings = settings
        self.published = 0

    def exchange(self, state: str) -> str:
        return self.settings.done_exchange if state == DONE else self.settings.dead_exchange

    def flush(self, channel: BlockingChannel, limit: int = BATCH) -> int:
        """Up to ``limit`` pending rows; returns how many were published. Broker errors propagate (the
        caller reconnects); rows already confirmed in this pass are marked first."""
        rows = self.queue.pending_announcements(limit)
        if not rows:
            return 0
        jobs = {j.id: j for j in self.queue.get_many(list({job_id for _, job_id, _ in rows}))}
        sent: list[int] = []
        try:
            for row_id, job_id, state in rows:
                job = jobs.get(job_id)
                if job is not None and job.state == state and state in TERMINAL:
                    # basic_publish on a confirming channel returns once the broker acked it (NackError if not).
                    channel.basic_publish(self.exchange(state), job.state, encode(record_body(job)),
                                          properties=persistent(job_id, {STATE_HEADER: job.state}))
                    self.published += 1
                # A job requeued since (or pruned) is not announced by this row: its next end writes its own.
                sent.append(row_id)
        finally:
            self.queue.mark_announced(sent)
        return len(rows)
