"""comfysup prune: the command, its dates, and runners that keep working while it runs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cli_support import write_config
from queue_contract import make_job

from comfysup.cli import main
from comfysup.commands.prune import parse_before
from comfysup.errors import UsageError
from comfysup.queue.sqlite import SQLiteQueue

NOW = 1_800_000_000.0
DAY = 86400.0


@pytest.mark.parametrize(("text", "expected"), [
    ("30d", NOW - 30 * DAY), ("12h", NOW - 12 * 3600), ("90m", NOW - 90 * 60), ("1.5d", NOW - 1.5 * DAY),
    ("2026-01-31T18:00:00+00:00", datetime(2026, 1, 31, 18, tzinfo=UTC).timestamp()),
    ("2026-01-31", datetime(2026, 1, 31).timestamp()),  # local midnight, as a person means it
])
def test_dates_and_ages(text: str, expected: float) -> None:
    assert parse_before(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "30", "-3d", "2026-13-01"])
def test_a_date_it_cannot_read_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--done-before"):
        parse_before(text, NOW)


def _queue_with_history(tmp_path: Path) -> tuple[Path, SQLiteQueue, Path]:
    config = write_config(tmp_path)
    queue = SQLiteQueue(tmp_path / "var" / "queue.db")
    store = tmp_path / "var" / "results"
    now = time.time()
    queue.intake.submit([make_job(n) for n in range(6)], now=now - 10 * DAY)
    for n, (state, age_days) in enumerate([("done", 9), ("dead", 8), ("done", 7), ("done", 0.5)]):
        claim = queue.leases.claim("host-a/1/gpu0/t", "gpu0", 60, now=now - age_days * DAY)
        assert claim is not None and claim.id == make_job(n).id
        if state == "done":
            queue.leases.complete(claim, [], now=now - age_days * DAY)
        else:
            queue.leases.dead(claim, "broken", now=now - age_days * DAY)
        (store / claim.id).mkdir(parents=True)
        (store / claim.id / "out.png").write_bytes(b"png")
    queue.intake.cancel([make_job(4).id], now=now - 8 * DAY)
    return config, queue, store


def test_prune_removes_old_finished_jobs_and_with_files_their_folders(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config, queue, store = _queue_with_history(tmp_path)
    assert main(["prune", "--config", str(config), "--done-before", "2d", "--dry-run"]) == 0
    assert "4 finished job(s)" in capsys.readouterr().out
    assert queue.intake.prunable(time.time()) == 5  # nothing was removed by the dry run
    assert main(["prune", "--config", str(config), "--done-before", "2d", "--files", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "removed 4 finished job(s)" in out and "3 result folder(s)" in out  # the cancelled one had none
    assert {j.id for j in queue.reads.iter_jobs()} == {make_job(3).id, make_job(5).id}  # recent done, and queued
    assert sorted(p.name for p in store.iterdir()) == [make_job(3).id]
    queue.close()


def test_prune_without_files_keeps_the_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, queue, store = _queue_with_history(tmp_path)
    assert main(["prune", "--config", str(config), "--done-before", "2d"]) == 0
    assert "removed 4 finished job(s)" in capsys.readouterr().out
    assert len(list(store.iterdir())) == 4
    queue.close()


def test_a_date_in_the_future_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    assert main(["prune", "--config", str(config), "--done-before", "2999-01-01"]) == 2
    assert "in the future" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_runners_keep_claiming_and_recording_while_prune_runs(tmp_path: Path) -> None:
    """Each batch is its own short transaction: a runner whose busy timeout is far shorter than the whole
    prune still gets the write lock between batches, every time."""
    path = tmp_path / "q.db"
    queue = SQLiteQueue(path)
    old = time.time() - 10 * DAY
    queue.intake.submit([make_job(n) for n in range(1000)], now=old)
    for _ in range(800):
        queue.leases.complete(queue.leases.claim("old", "gpu0", 60, now=old), [], now=old)
    runner = SQLiteQueue(path, busy_timeout_seconds=1.0)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work() -> None:
        done = 0
        try:
            while not stop.is_set() and done < 150:
                claim = runner.leases.claim("live", "gpu1", 60)
                if claim is None:
                    break
                runner.leases.complete(claim, [])
                done += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    removed = 0
    while batch := queue.intake.prune(time.time() - DAY, limit=20).removed:
        removed += len(batch)
    stop.set()
    thread.join(30)
    assert errors == []
    assert removed == 800
    # the live runner's work is kept
    assert queue.intake.prunable(time.time()) == queue.reads.status().counts["done"] > 0
    runner.close()
    queue.close()
