"""SQLiteQueue.replaced(): whether the file at the queue's path is still the one this process has open
(the supervisor asks every tick)."""

from __future__ import annotations

from pathlib import Path

from comfysup.queue.sqlite import SQLiteQueue


def test_replaced_says_none_while_the_file_is_the_open_one(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    queue = SQLiteQueue(path)
    try:
        assert queue.replaced() is None
        queue.reads.status()
        assert queue.replaced() is None
        moved = tmp_path / "moved.db"
        path.rename(moved)
        assert queue.replaced() == f"{path} was deleted while open"
        SQLiteQueue(tmp_path / "new.db").close()
        (tmp_path / "new.db").rename(path)
        assert (queue.replaced() or "").startswith(f"{path} was replaced by another file while open")
        moved.replace(path)
        assert queue.replaced() is None
    finally:
        queue.close()
