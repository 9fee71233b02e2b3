"""Workflows as people save them, through the CLI on the fake: a UI-format text-to-image workflow with nested
subgraphs runs to done with parameters set by title (``"KSampler.seed"``), its PNG carrying its graph so it opens in
ComfyUI and runs again; the PNG a real ComfyUI 0.3.64 saved runs again from jobs.jsonl; and each refusal as a
person reads it at submit, ``file:line``, every problem of the line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from comfysup.queue.sqlite import SQLiteQueue
from comfysup.workflows import image
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, config_of, job_id, jobs_file, write_config

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
NESTED = json.loads((RECORDED / "built-nested-subgraphs.json").read_text())
CHECKPOINT = "v1-5-pruned-emaonly-fp16.safetensors"
REAL_PNG = RECORDED / "images" / "comfyui-saveimage.png"


@pytest.fixture
def fake(tmp_path: Path):
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=5,
                       choices={"CheckpointLoaderSimple.ckpt_name": [CHECKPOINT]})
    server.start()
    yield server
    server.stop()


@pytest.fixture
def config(tmp_path: Path, fake: FakeComfy) -> Path:
    """A queue whose server has started once: its runner recorded the fake's node catalogue."""
    path = write_config(tmp_path)
    started = comfysup("work", "--config", str(path), "--server", f"cpu0={fake.url}", "--until-empty")
    assert started.returncode == 0, started.stderr
    queue = SQLiteQueue(config_of(path).resolve(config_of(path).queue.path))
    try:
        assert queue.fleet.catalogues(), "the runner records its server's /object_info when it starts"
    finally:
        queue.close()
    (tmp_path / "t2i.json").write_text(json.dumps(NESTED["workflow"]))
    shutil.copy(REAL_PNG, tmp_path / "render.png")
    return path


def work(config: Path, fake: FakeComfy) -> str:
    out = comfysup("work", "--config", str(config), "--server", f"cpu0={fake.url}", "--until-empty")
    assert out.returncode == 0, out.stderr
    return out.stderr


def outputs(tmp_path: Path, n: int) -> list[Path]:
    return sorted((tmp_path / "store" / job_id(n)).rglob("*.png"))


@pytest.mark.timeout(120)
def test_ui_workflow_with_subgraphs_and_a_saved_png_run_to_done(tmp_path: Path, config: Path,
                                                                fake: FakeComfy) -> None:
    jobs = jobs_file(tmp_path, [
        {"id": job_id(1), "workflow": "t2i.json", "set": {"KSampler.seed": 42, "Positive Prompt.text": "a dog",
                                                         "Save Image.filename_prefix": "ui"}},
        {"id": job_id(2), "workflow": "render.png", "set": {"Blank.width": 32}},
    ])
    submitted = comfysup("submit", str(jobs), "--config", str(config))
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted 2 job(s)" in submitted.stdout
    log = work(config, fake)
    assert "summary: 2 done" in log, log
    [first, *_] = outputs(tmp_path, 1)
    saved = image.read(first)
    assert saved.workflow == NESTED["workflow"], "the PNG opens in ComfyUI with its graph"
    assert saved.prompt is not None and saved.prompt["57:212"]["inputs"]["seed"] == 42
    assert saved.prompt["57:210:100"]["inputs"]["text"] == "a dog"
    again = image.read(outputs(tmp_path, 2)[0])
    assert again.prompt is not None and again.prompt["1"]["inputs"]["width"] == 32
    assert again.workflow == image.read(REAL_PNG).workflow
    # The PNG comfysup made runs again from jobs.jsonl, as the one ComfyUI made did.
    shutil.copy(first, tmp_path / "made.png")
    rerun = jobs_file(tmp_path, [{"id": job_id(3), "workflow": "made.png", "set": {"KSampler.seed": 7}}], "again.jsonl")
    assert comfysup("submit", str(rerun), "--config", str(config)).returncode == 0
    assert "summary: 1 done" in work(config, fake)
    assert image.read(outputs(tmp_path, 3)[0]).prompt["57:212"]["inputs"]["seed"] == 7


@pytest.mark.timeout(60)
def test_refusals_as_a_person_reads_them(tmp_path: Path, config: Path) -> None:
    broken = json.loads(json.dumps(NESTED["workflow"]))
    for node in broken["nodes"]:
        if node["type"] == "VAEDecode":
            node.update(type="FancyDecode", title="My Decoder")
        if node["type"] == "EmptyLatentImage":
            node["widgets_values"] = ["wide", 512, 1]
    broken["links"][0][1] = 999
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    jobs = jobs_file(tmp_path, [
        {"workflow": "t2i.json", "set": {"KSampler.seed": 1}},
        {"workflow": "broken.json"},
        {"workflow": "t2i.json", "set": {"Positve Prompt.text": "x", "CLIPTextEncode.text": "y"}},
    ])
    out = comfysup("submit", str(jobs), "--config", str(config))
    assert out.returncode == 2
    problems = [line for line in out.stderr.splitlines() if line.startswith(f"{jobs}:")]
    assert len(problems) == 5, out.stderr
    assert f"{jobs}:2: workflow file" in problems[0]
    text = "\n".join(problems)
    assert "node 58 'My Decoder' (FancyDecode): the node catalogue of cpu0@" in text
    assert "has no node type 'FancyDecode' (a custom node that is not installed?)" in text
    assert "node 2 (EmptyLatentImage): its saved widget values ['wide', 512, 1] do not fit the widgets" in text
    assert "expects ['width', 'height', 'batch_size'] (first misfit: width)" in text
    assert "node 57 (5b630ba9-dd25-584b-aa39-f82e2161c21c) input 'model': its link 1 comes from node 999, which is " \
           "not there" in text
    assert f"{jobs}:3: set key 'Positve Prompt.text': no node is named 'Positve Prompt' (did you mean: " \
           "'Positive Prompt', 'Negative Prompt'?)" in text
    assert f"{jobs}:3: set key 'CLIPTextEncode.text': 'CLIPTextEncode' names 2 nodes (57:210:100, 57:210:101): " \
           "name one by its id" in text
    assert "nothing was submitted" in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_jobs_runs_a_ui_workflow(tmp_path: Path) -> None:
    """``comfysup demo --jobs``: submitted once the fake servers recorded their catalogues, which convert it."""
    workflow = json.dumps(NESTED["workflow"]).replace(CHECKPOINT, "v1-5-pruned-emaonly.safetensors")
    (tmp_path / "t2i.json").write_text(workflow)
    jobs = jobs_file(tmp_path, [{"id": job_id(n), "workflow": "t2i.json", "set": {"KSampler.seed": n}}
                                for n in (1, 2)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    result = subprocess.run([sys.executable, "-m", "comfysup", "demo", "--jobs", str(jobs), "--dir",
                             str(tmp_path / "demo")], env=env, capture_output=True, text=True, timeout=100,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 of 2 job(s) done" in result.stdout
    [made] = sorted((tmp_path / "demo" / "var" / "results" / job_id(2)).glob("*.png"))[:1]
    assert image.read(made).workflow == json.loads(workflow)


@pytest.mark.timeout(120)
def test_dynamic_prompts_run_the_choice_of_each_job_id(tmp_path: Path, config: Path, fake: FakeComfy) -> None:
    """Each job runs its own choice of ``{a|b}``, the one its id seeds, which a resubmit recomputes the same."""
    options = ["cat", "dog", "fox", "owl", "bee", "elk"]
    (tmp_path / "t2i.json").write_text(json.dumps(NESTED["workflow"]).replace('"a cat"', '"a {' + "|".join(options)
                                                                                + '}"'))
    lines = [{"id": job_id(n), "workflow": "t2i.json", "set": {"KSampler.seed": n}} for n in range(1, 5)]
    jobs = jobs_file(tmp_path, lines)
    assert comfysup("submit", str(jobs), "--config", str(config)).returncode == 0
    assert "summary: 4 done" in work(config, fake)
    ran = [image.read(outputs(tmp_path, n)[0]).prompt["57:210:100"]["inputs"]["text"] for n in range(1, 5)]
    assert all(text in {f"a {o}" for o in options} for text in ran) and len(set(ran)) > 1
    again = comfysup("submit", str(jobs), "--config", str(config))
    assert again.returncode == 0 and "0 job(s), 4 already submitted" in again.stdout, again.stdout + again.stderr
