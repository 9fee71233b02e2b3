"""A job's folder holds one result set: what an interrupted earlier attempt left there is removed.

Found by the chaos suite (K2, 100 supervisor kills): an attempt downloaded its file and was killed before
its done record; its server died too, so the run was repeated, the new file got another name, and the
old complete file stayed beside the recorded one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from comfysup.runner.store import ResultStore
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

JOB = "00000000-0000-0000-0000-000000000001"


def test_prepare_removes_every_leftover_of_an_earlier_attempt(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store", max_file_bytes=1 << 20)
    store.prepare(JOB)
    store.write(JOB, "old_00001_.bin", [b"complete, never recorded"])
    store.write(JOB, "sub/old_00002_.bin", [b"x"])
    (tmp_path / "store" / JOB / ".old_00003_.png.part").write_bytes(b"half")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.png").write_bytes(b"not ours")
    (tmp_path / "store" / JOB / "link").symlink_to(outside)
    folder = store.prepare(JOB)
    assert list(folder.iterdir()) == []
    assert (outside / "keep.png").exists(), "a link is removed, never followed"


@pytest.mark.timeout(60)
def test_a_job_done_after_a_killed_attempt_has_only_its_recorded_files(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        config = write_config(tmp_path)
        queue = submit(config, [trivial_job(1)])
        leftover = tmp_path / "store" / job_id(1) / "job1_00007_.png"
        leftover.parent.mkdir(parents=True)
        leftover.write_bytes(b"\x89PNG a run whose attempt was killed before its done record")
        Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
        job = queue.reads.get(job_id(1))
        assert job.state == "done"
        assert sorted(p.name for p in leftover.parent.iterdir()) == [o.name for o in job.outputs]
