"""pika connections: open, declare what comfysup owns, and wait between reconnections.

Every broker object is used as it is when it exists (a passive declare first), and created only when it
does not, so an operator's own queue with other arguments is never refused with PRECONDITION_FAILED:
- the jobs queue as a durable quorum queue with ``x-delivery-limit`` (``[rabbitmq] delivery_limit``) and an
  at-least-once dead-letter route to ``[rabbitmq] invalid_queue`` (through the default exchange): a message
  that stops or crashes the consumer every time it is handled goes there, with RabbitMQ's ``x-death``
  headers (reason ``delivery_limit``), after ``delivery_limit + 1`` deliveries, instead of being redelivered
  forever (or, on RabbitMQ 4 without a dead-letter route, dropped after its default limit of 20). An
  existing jobs queue is then declared once more with these arguments on a spare channel: when the broker
  answers that they differ, the difference is reported (:func:`declare_all` returns it) and the queue is
  used as it is;
- the invalid-jobs queue as a durable queue, declared first (it is the dead-letter route's target);
- the done and dead exchanges as durable fanout exchanges.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions

from comfysup.backoff import RetryPolicy
from comfysup.config import RabbitMQConfig
from comfysup.redact import bound, display_url

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


def jobs_queue_arguments(settings: RabbitMQConfig) -> dict[str, Any]:
    """What comfysup declares the jobs queue with: quorum, a delivery limit, dead letters to the invalid queue."""
    return {"x-queue-type": "quorum", "x-delivery-limit": settings.delivery_limit,
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": settings.invalid_queue,
            "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def ensure_queue(connection: pika.BlockingConnection, name: str,
                 arguments: dict[str, Any] | None = None) -> tuple[bool, str | None]:
    """The queue as it is, or created durable with ``arguments``. Returns (created, how an existing queue
    differs from ``arguments`` as the broker says it, or None)."""
    channel = connection.channel()
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments=arguments)
        channel.close()
        log.info("rabbitmq: declared queue %r%s", name, f" {arguments}" if arguments else "")
        return True, None
    channel.close()
    if not arguments:
        return False, None
    channel = connection.channel()  # the same declaration again: the broker refuses it if the queue differs
    try:
        channel.queue_declare(name, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 406:
            raise
        return False, str(exc.reply_text)
    channel.close()
    return False, None


def queue_warning(settings: RabbitMQConfig, difference: str) -> str:
    """What to tell an operator whose jobs queue lacks comfysup's delivery limit or dead-letter route."""
    policy = json.dumps({"delivery-limit": settings.delivery_limit, "dead-letter-exchange": "",
                         "dead-letter-routing-key": settings.invalid_queue, "dead-letter-strategy": "at-least-once",
                         "overflow": "reject-publish"})
    return (f"queue {settings.queue!r} already exists with other arguments than comfysup declares (the broker "
            f"says: {bound(difference, 300)}); it is used as it is, so unless a policy gives it a delivery limit "
            f"and a dead-letter route, a message that stops the consumer each time is redelivered forever (or "
            f"dropped by RabbitMQ 4's default limit). Fix: a policy, e.g. rabbitmqctl set_policy comfysup-jobs "
            f"'^{settings.queue}$' '{policy}' --apply-to quorum_queues; or delete the queue while it is empty and "
            "comfysup declares it")


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


def declare_all(connection: pika.BlockingConnection, settings: RabbitMQConfig) -> list[str]:
    """Everything comfysup's consumer and publisher use; each left as it is when it exists. Returns what an
    operator should be told about existing objects (see :func:`queue_warning`)."""
    ensure_queue(connection, settings.invalid_queue)  # first: the jobs queue's dead letters go there
    _, difference = ensure_queue(connection, settings.queue, jobs_queue_arguments(settings))
    for name in (settings.done_exchange, settings.dead_exchange):
        ensure_exchange(connection, name)
    return [] if difference is None else [queue_warning(settings, difference)]


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
