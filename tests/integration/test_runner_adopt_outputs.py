"""Each job's own folder in the server's output folder: adopted when the history died.

A ComfyUI server killed after a job's files were written and before its history was read loses the history;
where comfysup can see the server's output folder, the next attempt adopts the files instead of running the
job again. The files keep the names the user chose, and the job's folder is removed once done is recorded.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from comfysup.runner import station as station_module
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from comfysup.runner.outputs import complete_png
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


def complete_png_bytes(data: bytes) -> bool:
    fd = os.memfd_create("png")  # complete_png reads an open file
    try:
        os.write(fd, data)
        return complete_png(fd)
    finally:
        os.close(fd)


def _runner(config: Path, fake: FakeComfy) -> Runner:
    return Runner(config_of(config), "a", fake.url,
                  RunnerOptions(until_empty=True, output_dirs={"a": Path(fake.output_directory)}))


def _wait_for_file(folder: Path, seconds: float = 20.0) -> Path:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        files = [p for p in folder.rglob("*.png") if complete_png_bytes(p.read_bytes())] if folder.exists() else []
        if files:
            return files[0]
        time.sleep(0.005)
    raise AssertionError(f"no complete file appeared in {folder}")


@pytest.mark.timeout(60)
def test_files_keep_their_names_and_the_servers_job_folder_is_removed_once_done(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path / "a", node_ms=5) as a:
        config = write_config(tmp_path)
        job = trivial_job(1)
        job["set"]["3.filename_prefix"] = "portraits/job1"
        queue = submit(config, [job])
        _runner(config, a).run()

        record = queue.reads.get(job["id"])
        assert record.state == "done"
        assert [o.name for o in record.outputs] == ["portraits/job1_00001_.png"]
        stored = tmp_path / "store" / job["id"] / "portraits" / "job1_00001_.png"
        assert complete_png_bytes(stored.read_bytes())
        assert not (Path(a.output_directory) / "comfysup" / job["id"]).exists()
        assert a.stats()["prompts"][job["id"]]["executed"] == 1
        # Read from the server's output folder, not asked of the server (a round trip to a server that runs the
        # next prompt by then).
        assert a.stats()["views"] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("output_dir", ["none", "elsewhere"])
def test_files_come_through_view_when_the_servers_folder_is_unknown_or_not_the_servers(tmp_path: Path,
                                                                                       output_dir: str) -> None:
    """No output folder (a server elsewhere), or one that is not this server's (a wrong output_dir): each file
    comes through /view, and the job is done all the same."""
    with FakeComfy(base_directory=tmp_path / "a", node_ms=5) as a:
        config = write_config(tmp_path)
        job = trivial_job(4)
        queue = submit(config, [job])
        dirs = {} if output_dir == "none" else {"a": tmp_path / "not-the-servers-output"}
        Runner(config_of(config), "a", a.url, RunnerOptions(until_empty=True, output_dirs=dirs)).run()
        record = queue.reads.get(job["id"])
        assert record.state == "done", record.reason
        (out,) = record.outputs
        assert out.name == "job4_00001_.png"
        assert complete_png_bytes((tmp_path / "store" / job["id"] / out.name).read_bytes())
        assert [(v["filename"], v["status"]) for v in a.stats()["views"]] == [("job4_00001_.png", 200)]


def _crash_after_the_file(tmp_path: Path, damage: bool) -> tuple[object, FakeComfy, str]:
    a = FakeComfy(base_directory=tmp_path / "a", node_ms=5)
    a.start()
    config = write_config(tmp_path)
    job = trivial_job(2)
    queue = submit(config, [job])
    a.history_delay_ms = 5000  # the file is written, the history is not yet: the window of the kill
    runner = _runner(config, a)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        landed = _wait_for_file(Path(a.output_directory) / "comfysup" / job["id"])
        a.crash()
        if damage:  # a file cut short by the kill: never adopted
            landed.write_bytes(landed.read_bytes()[:-20])
        a.history_delay_ms = 0
        a.start()
        thread.join(40)
        assert not thread.is_alive()
    finally:
        a.stop()
    return queue.reads.get(job["id"]), a, job["id"]


@pytest.mark.timeout(60)
def test_a_run_whose_history_died_with_its_server_is_adopted_from_its_files(tmp_path: Path) -> None:
    record, a, job_id = _crash_after_the_file(tmp_path, damage=False)
    assert record.state == "done"
    assert a.stats()["prompts"][job_id]["executed"] == 1, "run again although its file was complete"
    assert [o.name for o in record.outputs] == ["job2_00001_.png"]
    assert complete_png_bytes((tmp_path / "store" / job_id / "job2_00001_.png").read_bytes())
    assert any(p == "adopted" for p, _ in record.attempts[-1].trace["phases"])
    assert not (Path(a.output_directory) / "comfysup" / job_id).exists()


@pytest.mark.timeout(60)
def test_a_partly_written_file_is_not_adopted_and_the_job_runs_again(tmp_path: Path) -> None:
    record, a, job_id = _crash_after_the_file(tmp_path, damage=True)
    assert record.state == "done"
    assert a.stats()["prompts"][job_id]["executed"] == 2
    (out,) = record.outputs
    assert complete_png_bytes((tmp_path / "store" / job_id / out.name).read_bytes())
    assert not any(p == "adopted" for p, _ in record.attempts[-1].trace["phases"])
    assert not (Path(a.output_directory) / "comfysup" / job_id).exists()


@pytest.mark.timeout(60)
def test_a_run_on_a_server_still_down_is_adopted_by_another_servers_runner(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Server a is killed just after the job's file landed and is not back yet when b's runner takes the job
    (the chaos suite's K3 caught it): b adopts the files from a's output folder instead of running it again.
    (A folder of a server that does not answer is never emptied: it may still be writing.)"""
    monkeypatch.setattr(station_module, "SERVER_LOST_MIN_SECONDS", 1.0)  # a's runner gives its server up sooner
    with FakeComfy(base_directory=tmp_path / "b", node_ms=5) as b:
        a = FakeComfy(base_directory=tmp_path / "a", node_ms=5)
        a.start()
        config = write_config(tmp_path, heartbeat_seconds=0.2, lease_seconds=1.0, attempts=3, http_timeout_seconds=1.0)
        job = trivial_job(3)
        queue = submit(config, [job])
        dirs = {"a": Path(a.output_directory), "b": Path(b.output_directory)}
        peers = {"a": a.url, "b": b.url}
        a.history_delay_ms = 5000  # the file is written, the history is not yet: the window of the kill
        runner_a = Runner(config_of(config), "a", a.url, RunnerOptions(peers=peers, until_empty=True, output_dirs=dirs))
        thread = threading.Thread(target=runner_a.run, daemon=True)
        thread.start()
        try:
            _wait_for_file(dirs["a"] / "comfysup" / job["id"])
            a.crash()  # and it stays down
            runner_a.state.stopping = True  # its runner goes too, as with a killed machine; its lease runs out
            thread.join(30)
            Runner(config_of(config), "b", b.url, RunnerOptions(peers=peers, until_empty=True, output_dirs=dirs)).run()
        finally:
            a.stop()
        record = queue.reads.get(job["id"])
        assert record.state == "done", record.reason
        assert b.stats()["prompts"].get(job["id"], {}).get("executed", 0) == 0, "run again on b"
        assert any(p == "adopted" for p, _ in record.attempts[-1].trace["phases"])
        assert [o.name for o in record.outputs] == ["job3_00001_.png"]
