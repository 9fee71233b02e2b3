"""The Comfy API v2's ``workflow`` in ComfyUI's UI format: converted with the node catalogue the servers recorded
(as every door converts it, comfysup.jobs.brought), its UI workflow carried in the job's extra_pnginfo; what does
not convert is refused with every problem, and before any catalogue, with how to convert it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from comfy_low.models import ErrorEnvelope

from comfysup.queue import open_queue
from tests.api_support import api  # noqa: F401

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
OBJECT_INFO = json.loads((RECORDED / "object-info.json").read_text())
NESTED = json.loads((RECORDED / "built-nested-subgraphs.json").read_text())


def record_catalogue(config: Any) -> None:
    queue = open_queue(config)
    try:
        queue.fleet.record_catalogue("cpu0", "host", OBJECT_INFO)
    finally:
        queue.close()


def test_a_ui_workflow_is_converted_and_carries_its_graph(api: Any) -> None:  # noqa: F811
    url, _runner, config = api
    record_catalogue(config)
    answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": NESTED["workflow"]}, timeout=10)
    assert answer.status_code == 201, answer.text
    queue = open_queue(config)
    try:
        job = queue.reads.get(answer.json()["id"])
    finally:
        queue.close()
    assert {k: v["inputs"] for k, v in job.workflow.items()} == {k: v["inputs"] for k, v in NESTED["prompt"].items()}
    assert job.extra_data["extra_pnginfo"]["workflow"] == NESTED["workflow"]


def test_a_ui_workflow_that_does_not_convert_is_refused_naming_each_node(api: Any) -> None:  # noqa: F811
    url, _runner, config = api
    record_catalogue(config)
    workflow = json.loads(json.dumps(NESTED["workflow"]).replace('"VAEDecode"', '"FancyDecode"'))
    answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, timeout=10)
    error = ErrorEnvelope.model_validate(answer.json()).error
    assert answer.status_code == 422 and error.code == "invalid_workflow", answer.text
    assert "the node catalogue of cpu0@host has no node type 'FancyDecode'" in error.message


def test_before_any_catalogue_a_ui_workflow_is_refused_saying_how_to_convert_it(api: Any) -> None:  # noqa: F811
    url, _runner, _config = api
    answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": NESTED["workflow"]}, timeout=10)
    error = ErrorEnvelope.model_validate(answer.json()).error
    assert answer.status_code == 422 and error.code == "workflow_format_ui", answer.text
    assert "comfysup workflow convert FILE --object-info" in error.message
