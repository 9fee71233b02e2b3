"""The RabbitMQ front door as people see it: the consumer's state (its own file, comfysup.slotstate
``broker.json``) and the broker outbox's backlog (the queue), in ``status``, the status page and /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from comfysup.config import Config
from comfysup.slotstate import read_broker_state, read_state

if TYPE_CHECKING:
    from prometheus_client.core import Metric

COUNTS = ("received", "inserted", "existing", "duplicates", "invalid", "acked", "published", "returned")


def state_with_broker(config: Config) -> dict[str, Any] | None:
    """The supervisor's state with the consumer's under ``broker`` (when [rabbitmq] url is set)."""
    state = read_state(config)
    if state is not None and config.rabbitmq.url:
        state = {**state, "broker": read_broker_state(config)}
    return state


def broker_text(broker: dict[str, Any] | None, backlog: int) -> str:
    """One line for ``status`` and the page: state, unacknowledged, queue depth, counts, outbox backlog."""
    if broker is None:
        return f"rabbitmq: no consumer has run with this queue; outbox backlog {backlog}"
    head = f"rabbitmq consumer pid {broker.get('pid')}: {broker.get('state')}"
    if broker.get("stale"):
        head = f"rabbitmq consumer not running ({broker['stale']}); last state {broker.get('state')}"
    ready = broker.get("ready")
    parts = [f"queue {broker.get('queue')!r} at {broker.get('url')}", f"{broker.get('unacked', 0)} unacknowledged",
             f"{'-' if ready is None else ready} waiting in the broker",
             ", ".join(f"{broker.get(k, 0)} {k}" for k in COUNTS), f"outbox backlog {backlog}"]
    for exchange, held in sorted(unroutable(broker).items()):
        parts.append(f"{held} result(s) held in the outbox: exchange {exchange!r} has no queue bound (the broker "
                     "returned them); they are published once a queue is bound")
    if broker.get("last_error"):
        parts.append(f"last error: {broker['last_error']}")
    for warning in broker.get("warnings") or ():
        parts.append(f"warning: {warning}")
    return head + "\n  " + "\n  ".join(parts)


def unroutable(broker: dict[str, Any]) -> dict[str, int]:
    """Outbox rows held back by exchange, as the consumer last saw them."""
    held = broker.get("unroutable")
    return {str(k): int(v) for k, v in held.items() if isinstance(v, int)} if isinstance(held, dict) else {}


def broker_metrics(broker: dict[str, Any] | None, backlog: int) -> Iterator[Metric]:
    # Here, not at the top: `comfysup status` prints broker_text and never builds a metric (prometheus_client
    # was a third of its imports).
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    pending = GaugeMetricFamily("comfysup_broker_outbox_backlog", "Broker announcements of ended jobs not yet "
                                "confirmed by RabbitMQ.")
    pending.add_metric([], backlog)
    yield pending
    if broker is None:
        return
    up = GaugeMetricFamily("comfysup_broker_consuming", "1 while the RabbitMQ consumer is connected and "
                           "consuming.")
    up.add_metric([], 1.0 if broker.get("state") == "consuming" and not broker.get("stale") else 0.0)
    unacked = GaugeMetricFamily("comfysup_broker_unacknowledged", "Messages the consumer holds, not yet "
                                "acknowledged.")
    unacked.add_metric([], float(broker.get("unacked") or 0))
    ready = GaugeMetricFamily("comfysup_broker_ready", "Messages waiting in the jobs queue of the broker.")
    ready.add_metric([], float(broker.get("ready") or 0))
    counts = CounterMetricFamily("comfysup_broker_messages", "Messages by what the consumer did with them "
                                 "since it started, and results published.", labels=["result"])
    for key in COUNTS:
        counts.add_metric([key], float(broker.get(key) or 0))
    held = GaugeMetricFamily("comfysup_broker_outbox_unroutable", "Results held in the outbox because their "
                             "exchange has no queue bound (the broker returned them).", labels=["exchange"])
    for exchange, n in sorted(unroutable(broker).items()):
        held.add_metric([exchange], float(n))
    warned = GaugeMetricFamily("comfysup_broker_setup_warnings", "Problems found with existing broker objects at "
                               "the consumer's start (e.g. a jobs queue without a delivery limit); see status.")
    warned.add_metric([], float(len(broker.get("warnings") or ())))
    yield from (up, unacked, ready, counts, held, warned)
