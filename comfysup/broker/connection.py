"""pika connections: open, declare what comfysup owns, and wait between reconnections.

Every broker object is used as it is when it exists (a passive declare first), and created only when it
does not: the jobs queue as a durable quorum queue (replicated, and it keeps a message's delivery count),
the invalid-jobs queue as a durable queue, the done and dead exchanges as durable fanout exchanges. An
operator's own queue with other arguments is therefore never refused with PRECONDITION_FAILED.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from comfysup.backoff import RetryPolicy
from comfysup.config import RabbitMQConfig
from comfysup.redact import display_url

log = logging.getLogger("comfysup.broker")
logging.getLogger("pika.channel").setLevel(logging.ERROR)
"""pika warns of every channel the broker closes, and a passive declare of a missing queue closes one by design."""

HEARTBEAT_SECONDS = 30
SOCKET_TIMEOUT_SECONDS = 5.0
BLOCKED_TIMEOUT_SECONDS = 60.0
"""A broker that blocks publishers (memory or disk alarm) for this long closes the connection: reconnect."""
RECONNECT_BASE_SECONDS = 0.5

BrokerError = pika.exceptions.AMQPError
"""What a lost connection, a closed channel or a refused publish raise: reconnect and start again."""


def connect(url: str) -> pika.BlockingConnection:
    """One connection attempt (the caller's loop owns retrying), with heartbeats so a dead peer is noticed."""
    params = pika.URLParameters(url)
    params.heartbeat = HEARTBEAT_SECONDS
    params.socket_timeout = SOCKET_TIMEOUT_SECONDS
    params.blocked_connection_timeout = BLOCKED_TIMEOUT_SECONDS
    params.connection_attempts = 1
    params.client_properties = {"connection_name": "comfysup"}
    return pika.BlockingConnection(params)


def where(url: str) -> str:
    """The broker's URL as logs may show it: no password."""
    return display_url(url)


def ensure_queue(connection: pika.BlockingConnection, name: str, *, quorum: bool) -> BlockingChannel:
    """The queue as it is, or created (durable; quorum when asked); returns a usable channel."""
    channel = connection.channel()
    try:
        channel.queue_declare(name, passive=True)
        return channel
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
    channel = connection.channel()
    arguments = {"x-queue-type": "quorum"} if quorum else None
    channel.queue_declare(name, durable=True, arguments=arguments)
    log.info("rabbitmq: declared %s queue %r", "quorum" if quorum else "durable", name)
    return channel


def ensure_exchange(connection: pika.BlockingConnection, name: str) -> None:
    channel = connection.channel()
    try:
        channel.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
        channel = connection.channel()
        channel.exchange_declare(name, exchange_type="fanout", durable=True)
        log.info("rabbitmq: declared fanout exchange %r", name)
    channel.close()


def declare_all(connection: pika.BlockingConnection, settings: RabbitMQConfig) -> None:
    """Everything comfysup's consumer and publisher use; each left as it is when it exists."""
    ensure_queue(connection, settings.queue, quorum=True).close()
    ensure_queue(connection, settings.invalid_queue, quorum=False).close()
    for name in (settings.done_exchange, settings.dead_exchange):
        ensure_exchange(connection, name)


def persistent(message_id: str, headers: dict[str, Any] | None = None) -> pika.BasicProperties:
    """A message that survives a broker restart, deduplicable by ``message_id`` (the job id)."""
    return pika.BasicProperties(message_id=message_id, delivery_mode=pika.DeliveryMode.Persistent,
                                content_type="application/json", headers=headers)


class Reconnect:
    """Full-jitter waits after failures in a row (comfysup.backoff), reset by a connection that worked."""

    def __init__(self, max_delay_seconds: float, rand: Callable[[], float] = random.random) -> None:
        self.policy = RetryPolicy(attempts=1_000_000, base_delay_seconds=RECONNECT_BASE_SECONDS,
                                  max_delay_seconds=max_delay_seconds, jitter=True)
        self.failures = 0
        self.rand = rand

    def failed(self) -> float:
        """The wait before the next try."""
        self.failures += 1
        return self.policy.backoff(min(self.failures, 60), self.rand)

    def worked(self) -> None:
        self.failures = 0
