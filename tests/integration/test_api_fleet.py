"""A job submitted through the API is a normal comfysup job, and a job from ``comfysup submit`` is visible
through the API; on PostgreSQL, an API on one machine sees the work of a runner on another."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w
from comfy_low.models import Job as JobModel
from pg_support import pg_url  # noqa: F401

from comfysup.cli import main as cli
from comfysup.config import load_config
from tests.api_support import StandInRunner, api_config, running_api

ROOT = Path(__file__).resolve().parents[2]
TRIVIAL = ROOT / "examples" / "workflows" / "trivial.json"
GRAPH = json.loads(TRIVIAL.read_text())
SECRET = "sk-partner-9f8e7d6c5b4a"
CLI_JOB = "0f2b1c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def _command(config_path: Path, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli([args[0], "--config", str(config_path), *args[1:]])
    return code, out.getvalue() + err.getvalue()


def test_api_jobs_and_submitted_jobs_are_one_queue(tmp_path: Path) -> None:
    config = api_config(tmp_path)
    config_path = Path(config.source)
    jobs = tmp_path / "jobs.jsonl"
    line = {"id": CLI_JOB, "workflow": str(TRIVIAL), "meta": {"team": "render"}}
    jobs.write_text(json.dumps(line) + "\n")
    assert _command(config_path, "submit", str(jobs))[0] == 0
    with running_api(config) as url:
        posted = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH, "metadata": {"team": "web"},
                                                        "extra_data": {"api_key_comfy_org": SECRET}})
        assert posted.status_code == 201, posted.text
        api_id = posted.json()["id"]
        listed = httpx.get(f"{url}/api/v2/jobs").json()["jobs"]  # the spec has no list model; the SDK reads dicts
        assert len(listed) == 2
        [cli_job] = [j for j in listed if j["id"] != api_id]
        assert cli_job["metadata"] == {"team": "render"} and cli_job["status"] == "queued"
        cli_id = cli_job["id"]
        assert JobModel.model_validate(httpx.get(f"{url}/api/v2/jobs/{cli_id}").json()).status.value == "queued"
        runner = StandInRunner(config)
        try:
            while runner.run_one() is not None:
                pass
        finally:
            runner.close()
        for job_id in (api_id, cli_id):
            assert httpx.get(f"{url}/api/v2/jobs/{job_id}").json()["status"] == "succeeded"
    code, status = _command(config_path, "status")
    assert code == 0 and "running 0 · storing 0 · done 2 · dead 0" in status
    code, shown = _command(config_path, "show", api_id, "--workflow")
    assert code == 0 and api_id in shown and "web" in shown
    assert SECRET not in shown and SECRET[:8] not in shown  # partner keys are stored, never shown
    code, csv = _command(config_path, "results", "--csv")
    assert code == 0 and api_id in csv and cli_id in csv and SECRET[:8] not in csv


@pytest.mark.timeout(60)
def test_on_postgresql_the_api_sees_a_runner_on_another_machine(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    def config_for(name: str) -> Any:
        folder = tmp_path / name
        folder.mkdir()
        doc = {"queue": {"url": pg_url}, "store": {"dir": str(tmp_path / "shared-store")},
               "comfyui": {"gpus": "cpu:1"}, "api": {"listen": "127.0.0.1:0"}}
        path = folder / "config.toml"
        path.write_bytes(tomli_w.dumps(doc).encode())
        return load_config(str(path), env={})

    api_machine, gpu_machine = config_for("a"), config_for("b")
    with running_api(api_machine) as url:
        ids = [httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": f"k{n}"}
                          ).json()["id"] for n in range(3)]
        runner = StandInRunner(gpu_machine)
        try:
            done = 0
            while runner.run_one() is not None:
                done += 1
        finally:
            runner.close()
        assert done == 3
        for job_id in ids:
            body = JobModel.model_validate(httpx.get(f"{url}/api/v2/jobs/{job_id}").json())
            assert body.status.value == "succeeded" and len(body.outputs) == 1
            content = httpx.get(str(body.outputs[0].url))
            assert content.status_code == 200 and content.content.startswith(b"\x89PNG")
        again = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "k0"})
        assert again.status_code == 422 and again.json()["error"]["details"] == {"job_id": ids[0]}
