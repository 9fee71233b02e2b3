"""Masking by value: a partner key that is also a node id and part of an output's file name is
masked wherever the job is shown — `show` (text and JSON, the trace's node ids), `results --csv`, the status page,
webhook and broker bodies, the runner's log lines — while the job itself runs with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.observability.views import overview
from comfysup.observability.web import render_page
from comfysup.observability.webhooks import encode, record_body
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, job_id, submit, write_config

KEY = "comfyui-canary-3f9d0c5e7a1b42d8"
WORKFLOW = {
    KEY: {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 3}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": [KEY, 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": f"img-{KEY}"}},
}


@pytest.mark.timeout(90)
def test_a_key_used_as_a_node_id_and_in_a_file_name_is_shown_nowhere(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    queue = submit(config, [{"id": job_id(1), "workflow": WORKFLOW, "extra_data": {"api_key_comfy_org": KEY}}])
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=2) as fake:
        work = comfysup("work", "--config", str(config), "--server", f"a={fake.url}", "--until-empty")
        assert work.returncode == 0, work.stderr
    job = queue.reads.get(job_id(1))
    assert job.state == "done" and KEY in job.outputs[0].name  # stored under the name ComfyUI gave it
    seen = {
        "show": comfysup("show", job_id(1), "--config", str(config)).stdout,
        "show --json": comfysup("show", job_id(1), "--config", str(config), "--json").stdout,
        "results --csv": comfysup("results", "--config", str(config), "--csv", "--full").stdout,
        "status page": render_page(overview(queue, None), 2.0),
        "webhook and broker body": encode(record_body(job)).decode(),
        "the runner's log": work.stdout + work.stderr,
    }
    assert job_id(1) in seen["show"] and "node" in seen["show"]  # the commands did show the job, and its trace
    leaked = [f"{where}: {line}" for where, text in seen.items() for line in text.splitlines()
              if KEY in line or KEY[:16] in line]
    assert leaked == []
    queue.close()
