"""fake_comfy runs text-to-image graphs (the node shapes recorded from ComfyUI 0.3.64 in
fake_comfy/data/object-info-t2i.json), with a list of fake model files, KSampler steps as progress, and a
deterministic image of the latent's size; comfysup runs such a workflow end to end on it."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket

from fake_comfy import FakeComfy
from fake_comfy.uploads import decode_png

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "fake_comfy" / "data"
T2I = json.loads((DATA / "workflows" / "t2i_sd15.json").read_text())
RECORDED = json.loads((DATA / "object-info-t2i.json").read_text())


def start_cli(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m fake_comfy` as a user types it; (process, url) once it prints its address."""
    process = subprocess.Popen([sys.executable, "-m", "fake_comfy", "--port", "0", "--base-directory",
                                str(tmp_path), *args], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None
    for line in process.stdout:
        if match := re.match(r"To see the GUI go to: (http://\S+)", line):
            return process, match.group(1)
    process.wait(10)
    pytest.fail(f"no startup line; exit {process.returncode}: {process.stderr.read() if process.stderr else ''}")


def run(url: str, prompt: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Post the prompt as a client and read its WebSocket to the end: (history entry, messages)."""
    client_id, prompt_id = str(uuid.uuid4()), str(uuid.uuid4())
    ws = websocket.create_connection("ws" + url[len("http"):] + f"/ws?clientId={client_id}", timeout=20)
    try:
        answer = requests.post(f"{url}/prompt", json={"prompt": prompt, "prompt_id": prompt_id,
                                                      "client_id": client_id}, timeout=10)
        assert answer.status_code == 200, answer.text
        messages = []
        while True:
            message = json.loads(ws.recv())
            messages.append(message)
            data = message.get("data") or {}
            if message["type"] == "executing" and data.get("node") is None and data.get("prompt_id") == prompt_id:
                break
    finally:
        ws.close()
    return requests.get(f"{url}/history/{prompt_id}", timeout=10).json()[prompt_id], messages


def files(url: str, entry: dict[str, Any], node: str) -> list[bytes]:
    return [requests.get(f"{url}/view", params=image, timeout=10).content for image in entry["outputs"][node]["images"]]


def t2i(seed: int, prefix: str, **changes: Any) -> dict[str, Any]:
    prompt = copy.deepcopy(T2I)
    prompt["3"]["inputs"]["seed"] = seed
    prompt["9"]["inputs"]["filename_prefix"] = prefix
    for key, value in changes.items():
        node, name = key.split("_", 1)
        prompt[node]["inputs"][name] = value
    return prompt


@pytest.mark.timeout(60)
def test_python_m_fake_comfy_runs_the_recorded_sd15_workflow(tmp_path: Path) -> None:
    process, url = start_cli(tmp_path, "--models", "--step-ms", "1", "--node-ms", "1")
    try:
        info = requests.get(f"{url}/object_info", timeout=10).json()
        for name, recorded in RECORDED["object_info"].items():
            assert name in info, name
            assert info[name]["output"] == recorded["output"] and info[name]["input_order"] == recorded["input_order"]
        assert "v1-5-pruned-emaonly.safetensors" in info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]

        first, messages = run(url, t2i(1, "a"))
        assert first["status"]["status_str"] == "success"
        progress = [m["data"] for m in messages if m["type"] == "progress" and m["data"]["node"] == "3"]
        assert [(p["value"], p["max"]) for p in progress] == [(step, 20) for step in range(1, 21)], "one per step"
        (png,) = files(url, first, "9")
        width, height, channels, _ = decode_png(png)
        assert (width, height, channels) == (512, 512, 3), "the image has the latent's size"

        pixels = decode_png(png)[3]
        other, _ = run(url, t2i(2, "a"))
        prompt_changed, _ = run(url, t2i(1, "a", **{"6_text": "a horse riding an astronaut"}))
        assert decode_png(files(url, other, "9")[0])[3] != pixels, "another seed, another image"
        assert decode_png(files(url, prompt_changed, "9")[0])[3] != pixels, "another prompt, another image"
        requests.post(f"{url}/free", json={"free_memory": True}, timeout=10)  # nothing served from the cache
        again, messages = run(url, t2i(1, "a"))
        assert next(m["data"]["nodes"] for m in messages if m["type"] == "execution_cached") == []
        assert files(url, again, "9") == [png], "the same seed and prompt give the same bytes"

        small, _ = run(url, t2i(1, "e", **{"5_width": 72, "5_height": 40, "5_batch_size": 2}))
        assert [decode_png(f)[:2] for f in files(url, small, "9")] == [(72, 40), (72, 40)]

        missing = requests.post(f"{url}/prompt", json={"prompt": t2i(1, "f", **{"4_ckpt_name": "nope.safetensors"})},
                                timeout=10)
        assert missing.status_code == 400
        (error,) = missing.json()["node_errors"]["4"]["errors"]
        assert (error["type"], error["extra_info"]["received_value"]) == ("value_not_in_list", "nope.safetensors")
        assert error["details"].startswith("ckpt_name: 'nope.safetensors' not in ['v1-5-pruned-emaonly.safetensors'")
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.timeout(30)
def test_a_missing_checkpoint_gets_the_recorded_answer(tmp_path: Path) -> None:
    """The recording's server had no model files; a fake given none answers its POST exactly as it did."""
    recorded = RECORDED["t2i_missing_checkpoint"]
    with FakeComfy(base_directory=tmp_path, models="checkpoints=") as fc:
        answer = requests.post(f"{fc.url}/prompt", json=recorded["request"]["body"], timeout=10)
        assert answer.status_code == recorded["status"] == 400
        assert answer.json() == recorded["body_json"]
        assert requests.get(f"{fc.url}/queue", timeout=10).json() == recorded["GET /queue afterwards"]
        assert requests.get(f"{fc.url}/models/checkpoints", timeout=10).json() == []


@pytest.mark.timeout(60)
def test_lora_controlnet_upscale_and_animated_outputs(tmp_path: Path) -> None:
    prompt = copy.deepcopy(T2I)
    prompt["5"]["inputs"].update(width=64, height=48, batch_size=3)
    prompt["10"] = {"class_type": "LoraLoader", "inputs": {"model": ["4", 0], "clip": ["4", 1], "strength_model": 1.0,
                                                          "strength_clip": 1.0,
                                                          "lora_name": "lcm-lora-sdv1-5.safetensors"}}
    prompt["6"]["inputs"]["clip"] = ["10", 1]
    prompt["3"]["inputs"]["model"] = ["10", 0]
    prompt["11"] = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "control_v11p_sd15_canny.pth"}}
    prompt["12"] = {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0}}
    prompt["13"] = {"class_type": "ControlNetApplyAdvanced", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "control_net": ["11", 0], "image": ["12", 0], "strength": 1.0,
        "start_percent": 0.0, "end_percent": 1.0}}
    prompt["3"]["inputs"].update(positive=["13", 0], negative=["13", 1], steps=3)
    prompt["14"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "RealESRGAN_x4plus.pth"}}
    prompt["15"] = {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["14", 0], "image": ["8", 0]}}
    prompt["9"]["inputs"]["images"] = ["15", 0]
    prompt["16"] = {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["8", 0], "filename_prefix": "anim",
                                                                 "fps": 6.0, "lossless": True, "quality": 80,
                                                                 "method": "default"}}
    prompt["17"] = {"class_type": "SaveWEBM", "inputs": {"images": ["8", 0], "filename_prefix": "video",
                                                         "codec": "vp9", "fps": 24.0, "crf": 32.0}}
    with FakeComfy(base_directory=tmp_path, models="", step_ms=1, node_ms=1) as fc:
        entry, messages = run(fc.url, prompt)
        assert entry["status"]["status_str"] == "success", entry["status"]
        assert [decode_png(f)[:2] for f in files(fc.url, entry, "9")] == [(256, 192)] * 3, "upscaled 4x, each image"
        assert entry["outputs"]["16"]["animated"] == [True]
        (webp,) = files(fc.url, entry, "16")
        assert webp[:4] == b"RIFF" and webp[8:16] == b"WEBPVP8X" and webp.count(b"ANMF") == 3
        assert int.from_bytes(webp[24:27], "little") + 1 == 64 and int.from_bytes(webp[27:30], "little") + 1 == 48
        (webm,) = files(fc.url, entry, "17")
        assert webm.startswith(bytes.fromhex("1A45DFA3")) and b"webm" in webm[:128] and b"V_VP9" in webm
        assert entry["outputs"]["17"]["images"][0]["filename"].endswith(".webm")
        progress = [m["data"]["value"] for m in messages if m["type"] == "progress"]
        assert progress == [1, 2, 3]

        lora_missing = copy.deepcopy(prompt)
        lora_missing["10"]["inputs"]["lora_name"] = "missing.safetensors"
        del lora_missing["16"], lora_missing["17"]  # (ComfyUI passes a second output whose ancestor already failed)
        answer = requests.post(f"{fc.url}/prompt", json={"prompt": lora_missing}, timeout=10)
        assert answer.status_code == 400
        assert answer.json()["node_errors"]["10"]["errors"][0]["type"] == "value_not_in_list"


@pytest.mark.timeout(120)
def test_comfysup_runs_the_t2i_workflow_on_the_fakes_model_list(tmp_path: Path) -> None:
    """Submitted through comfysup's own checks (the fake's catalogue recorded by a first job), run by a runner."""
    from runner_helpers import comfysup, config_of, jobs_file, submit, write_config

    from comfysup.runner.loop import Runner
    from comfysup.runner.options import RunnerOptions

    def line(n: int, ckpt: str = "v1-5-pruned-emaonly.safetensors") -> dict[str, Any]:
        return {"id": str(uuid.UUID(int=n << 96)), "workflow": T2I,
                "set": {"3.seed": n, "3.steps": 4, "5.width": 64, "5.height": 64, "9.filename_prefix": f"t2i{n}",
                        "4.ckpt_name": ckpt}}

    with FakeComfy(base_directory=tmp_path / "fake", models="checkpoints=v1-5-pruned-emaonly.safetensors",
                   step_ms=1) as fc:
        config = write_config(tmp_path)
        queue = submit(config, [line(1), line(2)])
        Runner(config_of(config), "cpu0", fc.url, RunnerOptions(until_empty=True)).run()
        jobs = {job.id: job for job in queue.reads.iter_jobs()}
        assert [job.state for job in jobs.values()] == ["done", "done"]
        outputs = sorted((tmp_path / "store").rglob("*.png"))
        assert len(outputs) == 2 and all(decode_png(p.read_bytes())[:2] == (64, 64) for p in outputs)
        assert outputs[0].read_bytes() != outputs[1].read_bytes(), "two seeds, two images"
        queue.close()
        # The runner recorded the fake's catalogue: a checkpoint the fake lacks is refused at submit.
        refused = comfysup("submit", "--config", str(config), str(jobs_file(tmp_path, [line(3, "sdxl.safetensors")])))
        assert refused.returncode != 0
        assert "ckpt_name 'sdxl.safetensors' is not on any server" in refused.stderr + refused.stdout
