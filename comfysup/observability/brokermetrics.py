"""The RabbitMQ front door in /metrics (comfysup.observability.brokerview says the same in words): apart from it,
so that ``comfysup status``, which prints the words, never loads prometheus_client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from comfysup.observability.brokerview import COUNTS, unroutable


def broker_metrics(broker: dict[str, Any] | None, backlog: int) -> Iterator[Metric]:
    """The broker's families for /metrics: the outbox backlog always; with a consumer's state, whether it consumes,
    its unacknowledged and waiting messages, its counts, the results held as unroutable, its setup warnings."""
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
