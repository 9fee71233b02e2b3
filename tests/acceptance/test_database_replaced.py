"""A queue database deleted or replaced under a running supervisor is noticed within a
heartbeat, logged as an error, and the supervisor exits with EXIT_DATABASE_REPLACED (75) so that systemd
(Restart=on-failure) starts it again on the real file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from supervisor_support import Supervised, gone

from comfysup.queue.sqlite import SQLiteQueue
from comfysup.supervisor.lock import EXIT_DATABASE_REPLACED


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_deleted_or_replaced_under_the_supervisor_makes_it_exit_75(harness: list[Supervised],
                                                                              tmp_path: Path, how: str) -> None:
    h = Supervised(tmp_path)
    harness.append(h)
    proc = h.start()
    state = h.wait_ready(proc)
    path = h.config.resolve(h.config.queue.path)
    if how == "deleted":
        path.unlink()
    else:
        other = tmp_path / "other.db"
        SQLiteQueue(other).close()
        shutil.copy(other, path.with_name("incoming.db"))
        path.with_name("incoming.db").replace(path)
    assert proc.wait(20) == EXIT_DATABASE_REPLACED, h.describe()
    log = h.log()
    assert f"the queue database {path} was {how}" in log, log[-3000:]
    assert "exit code 75" in log
    for slot in state["slots"]:
        assert gone(slot["pid"]) and gone(slot["runner_pid"]), "the servers and runners stopped with it"
