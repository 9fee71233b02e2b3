"""The RabbitMQ front door as people see it: the consumer's state (its own file, comfysup.slotstate
``broker.json``) and the broker outbox's backlog (the queue), in ``status`` and the status page (/metrics:
comfysup.observability.brokermetrics)."""

from __future__ import annotations

from typing import Any

from comfysup.config import Config
from comfysup.slotstate import read_broker_state, read_state

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
