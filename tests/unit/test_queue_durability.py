"""Which queue writes wait for the disk. A write that a crash of the database may lose must be one whose loss
the promise survives (docs/reliability.md): never an end, and on PostgreSQL never a lease's renewal, since
its server can crash and restart while the runners live on."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from comfysup.queue.leases import Leases
from comfysup.queue.postgres import PostgresDb
from comfysup.queue.sqlite import SQLiteDb, SQLiteQueue


def _recording(q: Any, calls: list[tuple[str, bool]], through: bool) -> None:
    real = q.db.transaction

    def transaction(fn: Any, *args: Any, durable: bool = True, **kwargs: Any) -> Any:
        calls.append((getattr(fn, "__name__", ""), durable))
        return real(fn, *args, durable=durable, **kwargs) if through else True

    q.db.transaction = transaction


def test_a_postgresql_renewal_waits_for_the_wal_flush() -> None:
    """A renewal lost with the server puts the lease back by one heartbeat; heartbeat_seconds may be most of
    lease_seconds, so the lease could pass under a live runner and hand its job to a second one."""
    db = PostgresDb.__new__(PostgresDb)  # no server: only which transaction the heartbeat asks for
    q = SimpleNamespace(db=db, leases=Leases(db))
    calls: list[tuple[str, bool]] = []
    _recording(q, calls, through=False)
    q.leases.heartbeat(object(), 60.0)  # type: ignore[arg-type]
    assert calls == [("heartbeat", True)]


def test_a_postgresql_prompt_number_that_replaces_an_earlier_one_waits_for_the_wal_flush() -> None:
    """Catch-up adopts a history entry only when its number is the one recorded (comfysup.runner.catchup): a lost
    record would leave an earlier attempt's number, and this run's entry, even a success, would be passed over
    and the job run again. A first record (none before it) may be lost: catch-up then adopts any success."""
    db = PostgresDb.__new__(PostgresDb)
    q = SimpleNamespace(db=db, leases=Leases(db))
    calls: list[tuple[str, bool]] = []
    _recording(q, calls, through=False)
    q.leases.record_prompt(SimpleNamespace(last_prompt_number=None), "gpu0", 7)  # type: ignore[arg-type]
    q.leases.record_prompt(SimpleNamespace(last_prompt_number=3), "gpu0", 8)  # type: ignore[arg-type]
    assert calls == [("record_prompt", False), ("record_prompt", True)]


def test_a_sqlite_renewal_may_skip_the_fsync(tmp_path: Path) -> None:
    """Only a power cut loses it there, and that stops the runner holding the lease too."""
    assert SQLiteDb.DURABLE_RENEWALS is False
    q = SQLiteQueue(tmp_path / "q.db")
    try:
        calls: list[tuple[str, bool]] = []
        _recording(q, calls, through=False)
        q.leases.heartbeat(object(), 60.0)  # type: ignore[arg-type]
        assert calls == [("heartbeat", False)]
    finally:
        q.close()


def test_recording_a_catalogue_is_durable(tmp_path: Path) -> None:
    """Its transaction makes the jobs no current catalogue can run dead and queues their webhooks: an end,
    which a crash of the database must not take back after a client was told."""
    q = SQLiteQueue(tmp_path / "q.db")
    try:
        calls: list[tuple[str, bool]] = []
        _recording(q, calls, through=True)
        q.fleet.record_catalogue("runner-0", "host", {"KSampler": {}})
        assert ("_record_catalogue", True) in calls, calls
    finally:
        q.close()
