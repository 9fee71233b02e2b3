"""The console's search box as a queue search, and the last hour's figures."""

from __future__ import annotations

import pytest

from comfysup.api import console_query, console_views
from comfysup.queue.run_values import EndedAttempt
from comfysup.queue.search import SearchError

NOW = 1_800_000_000.0


def test_words_of_a_search() -> None:
    s = console_query.parse({"q": "team=red workflow:portrait since:2h until:2026-12-06 1a2b3c", "order": "oldest"},
                            now=NOW)
    assert s.labels == (("team", "red"),) and s.workflow == "portrait" and s.id_prefix == "1a2b3c"
    assert s.since == NOW - 7200 and s.until == 1796515200.0 and s.oldest_first
    assert console_query.parse({"q": "flux", "state": "dead"}, now=NOW).workflow == "flux"
    assert console_query.parse({"q": "flux", "state": "dead"}, now=NOW).state == "dead"


def test_a_tenant_in_the_box_or_the_url() -> None:
    s = console_query.parse({"q": "tenant:studio-a state:dead flux"}, now=NOW)
    assert (s.tenant, s.state, s.workflow) == ("studio-a", "dead", "flux")
    assert console_query.parse({"q": "flux", "tenant": "acme"}, now=NOW).tenant == "acme"
    assert console_query.parse({"q": "tenant:acme", "tenant": "beta"}, now=NOW).tenant == "beta"  # as state is
    assert console_query.parse({"q": "flux"}, now=NOW).tenant == ""  # no tenant: every tenant's jobs


@pytest.mark.parametrize("params", [{"q": "since:yesterday"}, {"state": "asleep"}, {"order": "sideways"},
                                    {"after": "not-a-cursor"}, {"q": "label:nokey"}])
def test_a_search_that_cannot_be_asked(params: dict[str, str]) -> None:
    with pytest.raises(SearchError):
        console_query.parse(params, now=NOW)


def test_a_cursor_goes_through_a_url_unchanged() -> None:
    for cursor in [(5,), (1.5e9, 7), ("0a1b",)]:
        assert console_query.cursor_of(console_query.cursor_text(cursor) or "") == cursor


def _ended(outcome: str, ended: float, waited: float) -> EndedAttempt:
    return EndedAttempt(job_id="j", attempt=1, outcome=outcome, kind=None, started_at=ended - 1, ended_at=ended,
                        nodes_run=1, nodes_cached=0, workflow_name="w", submitted_at=ended - 10,
                        first_started_at=ended - 10 + waited)


def test_the_last_hour_by_minute_and_its_queue_wait_percentiles() -> None:
    ended = [_ended("done", NOW - 30, w) for w in (1, 2, 3, 4)] + [_ended("dead", NOW - 3000, 10),
                                                                 _ended("retry", NOW - 30, 99)]
    hour = console_views.hour(ended, NOW)
    assert hour["done_per_minute"][59] == 4 and hour["dead_per_minute"][10] == 1 and hour["jobs"] == 5
    assert (hour["wait_p50"], hour["wait_p95"]) == (3, 10)
    assert hour["wait_p50_per_minute"][59] == 2
