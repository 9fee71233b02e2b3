"""A result store that cannot even make the job's folder (a full disk: no space or no inode left).

Found by the chaos suite's F1 row on a tmpfs out of inodes: the OSError escaped the attempt and
crashed the runner; its restart claimed the same job, adopted the run, and crashed again, until every
runner slot was marked failed and the queue stood still. It must be a transient failure like a file
that cannot be written: retried, then dead with the reason.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from comfysup.runner.store import ResultStore
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.mark.timeout(60)
def test_a_job_folder_that_cannot_be_made_is_a_transient_failure_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: ResultStore, job: str) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root / job))

    monkeypatch.setattr(ResultStore, "prepare", full)
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        config = write_config(tmp_path, attempts=2)
        queue = submit(config, [trivial_job(1)])
        counts = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()  # no exception

        job = queue.reads.get(job_id(1))
        assert job.state == "dead" and counts["dead"] == 1
        assert job.reason == (f"gave up after 2 attempts, last: the result store's disk is full: "
                              f"No space left on device ({job_id(1)})")
        assert fake.stats()["prompts"][job_id(1)]["executed"] == 1  # the retry adopted the run
