"""The metrics observer's reads and memory do not follow the rate of jobs.

bench/memory.py saw the monitor grow from 34 to 74 MiB over 10,000 jobs: every second the observer read
again every attempt of its look-back window, traces included. These tests count what it reads and keeps
through a queue that records every call: an idle look reads no more rows however many attempts ended in
the window, no row it gets carries a trace, a late write is still counted once, and what it keeps is the
keys of the window and nothing more.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from queue_contract import T0, make_job

from comfysup import records
from comfysup.observability.metrics import LOOKBACK_SECONDS, Observer
from comfysup.queue.base import Claim
from comfysup.queue.db import Role
from comfysup.queue.sqlite import SQLiteQueue

pytestmark = pytest.mark.timeout(60)

BIG_TRACE = {"nodes": [{"id": str(i), "class_type": "KSampler", "started": 0.0, "ended": 1.0, "note": "x" * 2000}
                       for i in range(3)], "cached": ["9"], "phases": {"post": 0.01, "execute": 1.0}}
"""About 6 KB of JSON: what the old observer read back for every attempt of the window, every second."""


class Recording:
    """The queue, with the rows each read method handed out counted and every value it returned checked."""

    def __init__(self, queue: SQLiteQueue) -> None:
        self.queue = queue
        self.rows: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.largest: float = 0
        """The largest value handed out (characters of a string; a dict or list would be a trace: inf)."""

    def __getattr__(self, name: str) -> Any:
        return self.record(name, getattr(self.queue, name))

    def record(self, name: str, method: Any) -> Any:
        if isinstance(method, Role):  # a role of the queue: its reads are recorded by their names, as the queue's
            return SimpleNamespace(**{n: self.record(n, getattr(method, n)) for n in dir(method)
                                      if not n.startswith("_") and callable(getattr(method, n))})

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            self.calls[name] += 1
            if isinstance(out, list):
                self.rows[name] += len(out)
                for row in out:
                    values = list(records.values(row).values()) if isinstance(row, records.Record) else list(row)
                    for v in values:
                        size = float("inf") if isinstance(v, (dict, list)) else len(v) if isinstance(v, str) else 0
                        self.largest = max(self.largest, size)
            return out

        return recorded

    def reset(self) -> None:
        self.rows.clear()
        self.calls.clear()


def claimed(queue: SQLiteQueue, owner: str, now: float) -> Claim:
    claim = queue.leases.claim(owner, "gpu0", 600, now=now)
    assert claim is not None
    return claim


def test_a_look_reads_the_new_attempts_only_never_a_trace_and_keeps_only_the_window(tmp_path: Path) -> None:
    queue = SQLiteQueue(tmp_path / "queue.db")
    try:
        n = 300
        queue.intake.submit([make_job(i) for i in range(n + 3)], now=T0 - 30)
        claims = [claimed(queue, f"r{i}", T0) for i in range(n + 3)]
        for i, claim in enumerate(claims[:n]):  # 300 attempts end within 30 s, each with a 6 KB trace
            queue.leases.complete(claim, [], now=T0 + 1 + i * 0.1, trace=BIG_TRACE)
        spy: Any = Recording(queue)  # stands in for the Queue it wraps
        registry = CollectorRegistry()
        observer = Observer(registry, since=T0)
        assert observer.catch_up(spy) == n
        assert spy.largest <= 64, "a row handed to metrics carries a trace or another blob"
        assert registry.get_sample_value("comfysup_nodes_total") == 4 * n
        assert registry.get_sample_value("comfysup_nodes_cached_total") == n
        assert len(observer.seen) == len(observer.expiry) == n  # the keys of the window, one each

        # Idle looks: the window still holds 300 attempts, and none of them is read again.
        for _ in range(5):
            spy.reset()
            assert observer.catch_up(spy) == 0
            assert spy.rows["ended_since"] <= 1, spy.rows  # at most the attempt at the cursor itself
            assert spy.calls["ended_keys"] == 0

        # A write that lands late (stamped inside the window, committed now) is counted once; its look
        # reads the window's keys, and rows only from its own end on.
        spy.reset()
        queue.leases.dead(claims[n], "gave up", now=T0 + 1 + (n - 5) * 0.1, kind="timeout", trace=BIG_TRACE)
        assert observer.catch_up(spy) == 1
        assert spy.calls["ended_keys"] == 1 and spy.rows["ended_since"] <= 7, spy.rows
        assert spy.largest <= 64
        assert registry.get_sample_value("comfysup_dead_letters_total", {"kind": "timeout"}) == 1
        spy.reset()
        assert observer.catch_up(spy) == 0 and spy.calls["ended_keys"] == 0
        assert len(observer.seen) == len(observer.expiry) == n + 1

        # The window moves on: the keys it left are dropped, nothing else is kept.
        queue.leases.complete(claims[n + 1], [], now=T0 + 1 + n * 0.1 + LOOKBACK_SECONDS + 1, trace=BIG_TRACE)
        assert observer.catch_up(spy) == 1
        assert len(observer.seen) == len(observer.expiry) == 1
        assert registry.get_sample_value("comfysup_attempts_total", {"outcome": "done", "kind": "none"}) == n + 1

        # Keys of attempts pruned while still in the window leave too, so the counts agree again.
        queue.leases.complete(claims[n + 2], [], now=T0 + 1 + n * 0.1 + LOOKBACK_SECONDS + 2)
        assert observer.catch_up(spy) == 1
        assert len(queue.intake.prune(finished_before=T0 + 1e6).removed) == n + 3
        spy.reset()
        assert observer.catch_up(spy) == 0 and spy.calls["ended_keys"] == 1
        assert observer.seen == set() and observer.expiry == []
        spy.reset()
        assert observer.catch_up(spy) == 0 and spy.calls["ended_keys"] == 0
    finally:
        queue.close()
