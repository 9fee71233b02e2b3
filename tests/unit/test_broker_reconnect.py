"""The consumer's reconnection waits: full jitter, growing with failures in a row, capped, reset by success."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pika")

from comfysup.broker.connection import Reconnect


def test_waits_grow_with_failures_are_capped_and_reset() -> None:
    r = Reconnect(max_delay_seconds=4.0, rand=lambda: 0.999999)
    assert [round(r.failed(), 2) for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    r.worked()
    assert round(r.failed(), 2) == 0.5
    assert Reconnect(4.0, rand=lambda: 0.0).failed() == 0.0  # full jitter: anywhere from nothing


def test_a_workflow_path_must_stay_below_workflows_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from comfysup.broker.consumer import BrokerJobs
    from comfysup.jobs import JobLineError

    jobs = BrokerJobs(tmp_path / "<rabbitmq>", base_dir=tmp_path)
    for bad in ("../x.json", "/etc/passwd", "a/../../x.json", "a\\..\\x.json"):
        line = {"id": "3a04fce3-6738-5756-874e-4487209ae4f6", "workflow": bad}
        with pytest.raises(JobLineError, match="workflows_dir"):
            jobs.parse(json.dumps(line).encode(), check=True)
