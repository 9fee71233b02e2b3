"""comfysup.slotstate.StateFile: the supervisor's and ``comfysup work``'s state file is written when what it says
changes, and again every REFRESH_SECONDS for its ``updated_at``, never half."""

from __future__ import annotations

import json
import os

import pytest

from comfysup.slotstate import REFRESH_SECONDS, STALE_SECONDS, StateFile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(at: float, **more: object) -> dict[str, object]:
    return {"pid": 1, "updated_at": at, "state": "running", "slots": [{"name": "gpu0", "job": None}], **more}


def test_an_unchanged_snapshot_is_written_again_only_after_the_refresh(tmp_path):
    clock = Clock()
    state = StateFile(tmp_path / "work.json", clock=clock)
    assert state.write(snapshot(1.0))
    clock.now += REFRESH_SECONDS / 2
    assert not state.write(snapshot(2.0))  # only updated_at differs
    assert json.loads((tmp_path / "work.json").read_text())["updated_at"] == 1.0
    clock.now += REFRESH_SECONDS / 2
    assert state.write(snapshot(3.0))
    assert json.loads((tmp_path / "work.json").read_text())["updated_at"] == 3.0


def test_a_change_is_written_at_once_and_so_is_a_forced_one(tmp_path):
    clock = Clock()
    state = StateFile(tmp_path / "supervisor.json", clock=clock)
    state.write(snapshot(1.0))
    assert state.write(snapshot(1.1, summary="1 server(s), 1 out of service"))
    assert json.loads((tmp_path / "supervisor.json").read_text())["summary"].endswith("out of service")
    assert state.write(snapshot(1.2, summary="1 server(s), 1 out of service"), force=True)
    assert json.loads((tmp_path / "supervisor.json").read_text())["updated_at"] == 1.2


def test_the_refresh_keeps_the_file_fresh_for_its_readers():
    assert REFRESH_SECONDS * 3 <= STALE_SECONDS  # two writes may be late before a reader calls the writer hung


def test_a_failed_write_raises_and_is_tried_again_at_the_next_call(tmp_path):
    clock = Clock()
    folder = tmp_path / "gone"
    state = StateFile(folder / "work.json", clock=clock)
    with pytest.raises(FileNotFoundError):
        state.write(snapshot(1.0))
    folder.mkdir()
    assert state.write(snapshot(1.0))  # the same snapshot: written, the failed one counts for nothing
    assert [p.name for p in folder.iterdir()] == ["work.json"]  # no temporary file left behind


def test_the_file_is_replaced_whole(tmp_path):
    path = tmp_path / "work.json"
    path.write_text("old")
    inode = os.stat(path).st_ino
    StateFile(path).write(snapshot(1.0))
    assert os.stat(path).st_ino != inode  # renamed over the old one, never written in place
    assert json.loads(path.read_text())["slots"][0]["name"] == "gpu0"
