"""The consumer's state and the outbox backlog as status, the page and /metrics show them."""

from __future__ import annotations

from prometheus_client.core import CollectorRegistry

from comfysup.observability.brokermetrics import broker_metrics
from comfysup.observability.brokerview import broker_text

STATE = {"pid": 42, "state": "consuming", "queue": "renders", "url": "amqp://127.0.0.1:5672/", "unacked": 3,
         "ready": 120, "received": 10, "inserted": 8, "existing": 1, "invalid": 1, "acked": 10, "published": 5,
         "last_error": None}


def test_the_status_line_says_state_unacknowledged_depth_and_backlog() -> None:
    text = broker_text(STATE, backlog=7)
    assert "pid 42: consuming" in text and "3 unacknowledged" in text and "120 waiting in the broker" in text
    assert "8 inserted" in text and "1 invalid" in text and "outbox backlog 7" in text
    assert "not running" in broker_text({**STATE, "stale": "gone"}, 0)
    assert "no consumer" in broker_text(None, 2)


def test_metrics_carry_consuming_unacknowledged_and_backlog() -> None:
    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            return broker_metrics(STATE, 7)

    registry = CollectorRegistry()
    registry.register(One())  # type: ignore[arg-type]
    assert registry.get_sample_value("comfysup_broker_outbox_backlog") == 7
    assert registry.get_sample_value("comfysup_broker_consuming") == 1
    assert registry.get_sample_value("comfysup_broker_unacknowledged") == 3
    assert registry.get_sample_value("comfysup_broker_messages_total", {"result": "invalid"}) == 1
    assert [m.name for m in broker_metrics(None, 0)] == ["comfysup_broker_outbox_backlog"]


def test_held_results_and_setup_warnings_are_shown_and_measured() -> None:
    state = {**STATE, "returned": 4, "unroutable": {"comfysup.done": 2}, "warnings": ["queue 'renders' already "
                                                                                      "exists with other arguments"]}
    text = broker_text(state, backlog=2)
    assert "2 result(s) held in the outbox: exchange 'comfysup.done' has no queue bound" in text
    assert "4 returned" in text and "warning: queue 'renders' already exists" in text

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            return broker_metrics(state, 2)

    registry = CollectorRegistry()
    registry.register(One())  # type: ignore[arg-type]
    assert registry.get_sample_value("comfysup_broker_outbox_unroutable", {"exchange": "comfysup.done"}) == 2
    assert registry.get_sample_value("comfysup_broker_messages_total", {"result": "returned"}) == 4
    assert registry.get_sample_value("comfysup_broker_setup_warnings") == 1
