"""The SQLite connection's busy_timeout and synchronous, set only when they change: a runner's writes follow one
another without the two PRAGMAs around each, and every statement outside a write still waits as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from queue_contract import T0, make_job

from comfysup.queue.sqlite import SQLiteQueue


def _statements(q: SQLiteQueue) -> list[str]:
    seen: list[str] = []
    q.db.conn.set_trace_callback(seen.append)
    return seen


@pytest.mark.timeout(30)
def test_a_runner_s_writes_set_busy_timeout_once_and_synchronous_only_when_it_changes(tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db", busy_timeout_seconds=7)
    q.intake.submit([make_job(n) for n in range(3)], now=T0)
    seen = _statements(q)
    for _ in range(3):
        claim = q.leases.claim("runner-a", "gpu0", 30, now=T0)
        assert claim is not None
        q.leases.record_prompt(claim, "gpu0", 1)  # not durable
        assert q.leases.heartbeat(claim, 30) is False  # not durable (a renewal)
        q.leases.complete(claim, [])
    pragmas = [s for s in seen if s.startswith("PRAGMA")]
    # busy_timeout 0 for the first BEGIN, then kept; synchronous NORMAL before each record_prompt, FULL before
    # each claim that follows a renewal (the complete follows a claim or a complete: nothing to set)
    assert pragmas == ["PRAGMA busy_timeout = 0"] + ["PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"] * 3
    assert seen.count("BEGIN IMMEDIATE") == 12
    q.close()


@pytest.mark.timeout(30)
def test_inside_a_write_the_transaction_s_own_sync_and_outside_every_statement_gets_full_and_the_timeout(
        tmp_path: Path) -> None:
    q = SQLiteQueue(tmp_path / "q.db", busy_timeout_seconds=7)
    with q.db._write(durable=False) as conn:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0  # waits for nothing, holding the lock
    assert q.db._read("PRAGMA synchronous")[0][0] == 2  # FULL
    assert q.db._read("PRAGMA busy_timeout")[0][0] == 7000
    with q.db._write() as conn:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert q.db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 7000  # conn itself: any caller's statement
    q.close()


@pytest.mark.timeout(30)
def test_a_read_after_the_writes_runs_with_the_busy_timeout_again(tmp_path: Path) -> None:
    """The writes leave busy_timeout 0 behind them; the queue's reads (status, a job's record, the idle wait's
    data_version) set it back before their first statement, so each waits for a lock as it did before."""
    q = SQLiteQueue(tmp_path / "q.db", busy_timeout_seconds=0.3)
    q.intake.submit([make_job(1)], now=T0)
    claim = q.leases.claim("runner-a", "gpu0", 30, now=T0)
    assert claim is not None
    seen: list[str] = []
    raw = q.db._conn
    assert raw is not None
    raw.set_trace_callback(seen.append)
    assert raw.execute("PRAGMA busy_timeout").fetchone()[0] == 0  # what the claim left (read past conn)
    seen.clear()
    assert q.reads.status(now=T0).counts["running"] == 1
    assert seen[0] == "PRAGMA busy_timeout = 300" and all(not s.startswith("PRAGMA") for s in seen[1:])
    assert raw.execute("PRAGMA busy_timeout").fetchone()[0] == 300
    q.leases.record_prompt(claim, "gpu0", 1)  # not durable: NORMAL, busy_timeout 0 again
    seen.clear()
    q.wait_for_work(0.0)
    assert q.reads.get(claim.id) is not None
    assert seen[:2] == ["PRAGMA busy_timeout = 300", "PRAGMA synchronous = FULL"]
    assert sum(s.startswith("PRAGMA busy_timeout") for s in seen) == 1
    q.close()
