"""What the runner does differently per ComfyUI version: a timed-out prompt is stopped with
0.38's atomic POST /api/jobs/{id}/cancel, and with /interrupt plus a /queue delete on 0.3.64."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("version", "via"), [("0.38", {"cancel"}), ("0.3.64", {None})])
def test_a_timed_out_prompt_is_stopped_the_way_its_server_offers(tmp_path: Path, version: str,
                                                                 via: set[str | None]) -> None:
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5, comfyui_version=version) as fake:
        fake.script_by_id({job_id(1): ["hang"]})
        config = write_config(tmp_path, attempts=1, timeout_seconds=1.5)
        queue = submit(config, [trivial_job(1)])
        Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
        job = queue.reads.get(job_id(1))
        assert job.state == "dead" and "timed out" in (job.reason or ""), job.reason
        interrupts = [i for i in fake.stats()["interrupts"] if i.get("prompt_id") == job_id(1)]
        assert interrupts and {i.get("via") for i in interrupts} == via, interrupts
