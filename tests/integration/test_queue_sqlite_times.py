"""The SQLite queue records the times of the runner's side in the order of its commits.

Found by the chaos suite (K1, 500 runner kills): a claim took its time, then waited for the write lock
behind the supervisor's release of the same job, and the attempts table showed the new attempt
starting a few milliseconds before the old one ended. Times are now taken once the lock is held.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from comfysup.queue.base import Claim, NewJob
from comfysup.queue.sqlite import SQLiteQueue

HELD_SECONDS = 0.3


def job(n: int) -> NewJob:
    return NewJob(id=f"00000000-0000-0000-0000-{n:012d}", workflow={"1": {"class_type": "SaveImage"}},
                  spec_hash=f"h{n}")


@pytest.mark.timeout(30)
def test_a_claim_that_waited_for_the_lock_starts_and_leases_from_when_it_got_it(tmp_path: Path) -> None:
    queue = SQLiteQueue(tmp_path / "q.db")
    queue.intake.submit([job(1)])
    blocker = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    claimed: list[Claim | None] = []
    thread = threading.Thread(target=lambda: claimed.append(queue.leases.claim("runner-b", "cpu1", lease_seconds=10)))
    thread.start()
    time.sleep(HELD_SECONDS)  # the lock is held this long: the fault itself, not a wait for something
    released_at = time.time()
    blocker.execute("ROLLBACK")
    thread.join(10)
    claim = claimed[0]
    assert claim is not None
    started = queue.reads.get(claim.id).attempts[0].started_at
    assert started >= released_at - 0.01, f"the attempt starts {released_at - started:.3f} s before it was claimed"
    assert claim.lease_until >= released_at + 10 - 0.01
    blocker.close()
    queue.close()
