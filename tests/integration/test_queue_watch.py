"""QueueWatch and SQLiteQueue.integrity: what each look sees of a queue file changed under an
open queue, and what it does not mistake for a loss."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from comfysup.queue.sqlite import SQLiteQueue
from comfysup.queue.watch import QueueWatch


def _queue(tmp_path: Path) -> tuple[SQLiteQueue, Path]:
    path = tmp_path / "q.db"
    queue = SQLiteQueue(path)
    queue.reads.status()
    with sqlite3.connect(path) as conn:  # every page in the file itself
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return queue, path


@pytest.mark.timeout(20)
def test_a_sound_file_is_never_lost_and_a_deep_look_agrees(tmp_path: Path) -> None:
    queue, _path = _queue(tmp_path)
    try:
        watch = QueueWatch(queue, every_seconds=0.0)
        assert [watch.check() for _ in range(3)] == [None, None, None]
        assert watch.look_deep() is None and queue.integrity(deep=True) is None
    finally:
        queue.close()


@pytest.mark.timeout(20)
def test_a_corrupt_interior_page_is_found_by_the_deep_look_in_sqlites_words(tmp_path: Path) -> None:
    queue, path = _queue(tmp_path)
    try:
        pages = path.stat().st_size // 4096
        assert pages > 3
        with path.open("r+b") as f:  # the header stays sound: only reading the pages finds it
            for page in range(1, pages):
                f.seek(page * 4096)
                f.write(b"\xff" * 4096)
        said: list[str] = []
        watch = QueueWatch(queue, every_seconds=0.0, on_lost=said.append)
        assert watch.check() is None  # the cheap look reads the header only
        reason = watch.look_deep()
        assert reason is not None and reason.startswith(f"{path} fails its integrity check")
        assert "malformed" in reason or "quick_check" in reason, reason
        assert watch.check() == reason and said == [reason]  # kept for good, said once
    finally:
        queue.close()


@pytest.mark.timeout(20)
def test_a_file_cut_mid_page_is_lost_at_the_first_look_and_a_cut_at_a_page_by_the_deep_one(tmp_path: Path) -> None:
    queue, path = _queue(tmp_path)
    try:
        size = path.stat().st_size
        with path.open("r+b") as f:  # a whole number of pages: only reading the pages that are gone finds it
            f.truncate(size // 2 // 4096 * 4096)
        assert queue.integrity() is None
        deep = queue.integrity(deep=True)
        assert deep is not None and "SQLite says" in deep, deep
        with path.open("r+b") as f:
            f.truncate(size // 2 + 100)
        reason = queue.integrity()
        assert reason is not None and "not a whole number of its 4096-byte pages" in reason, reason
        with path.open("r+b") as f:
            f.truncate(10)
        assert "less than one page" in (queue.integrity() or "")
    finally:
        queue.close()


@pytest.mark.timeout(20)
def test_a_header_overwritten_is_lost_at_the_first_look(tmp_path: Path) -> None:
    queue, path = _queue(tmp_path)
    try:
        with path.open("r+b") as f:
            f.write(b"\0" * 100)
        reason = QueueWatch(queue).check()
        assert reason is not None and "SQLite says: file is not a database" in reason, reason
    finally:
        queue.close()


def test_a_file_deleted_between_the_two_looks_is_said_deleted_not_unreadable() -> None:
    """The cheap look asks whether the file was replaced, then reads its header: a file deleted in between fails
    the read ("unable to open"), and the reason given is the deletion (a `comfysup work` run in CI met it)."""
    from comfysup.queue.watch import QueueWatch

    class Racing:
        def __init__(self) -> None:
            self.asked = 0

        def replaced(self) -> str | None:
            self.asked += 1
            return None if self.asked == 1 else "q.db was deleted while open"

        def integrity(self, deep: bool) -> str | None:
            return "q.db fails its integrity check: SQLite says: unable to open database file"

    said: list[str] = []
    watch = QueueWatch(Racing(), on_lost=said.append)
    assert watch.check() == "q.db was deleted while open" and said == ["q.db was deleted while open"]
