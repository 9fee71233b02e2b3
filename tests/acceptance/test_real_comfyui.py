"""The runner against a real ComfyUI on the CPU (opt-in: COMFYUI_DIR names a checkout that runs --cpu).

COMFYUI_PYTHON names the Python of its environment (default: the one running the tests).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from comfysup.comfy import ComfyClient
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from tests import real_comfyui
from tests.runner_helpers import ROOT, config_of, job_id, submit, write_config

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = [pytest.mark.comfyui,
              pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout that runs with --cpu")]
WORKFLOWS = ROOT / "examples" / "workflows"


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory):
    with real_comfyui.started(tmp_path_factory.mktemp("comfyui")) as url:
        yield url


def _job(n: int, workflow: str, **set_: object) -> dict:
    return {"id": job_id(n), "workflow": json.loads((WORKFLOWS / workflow).read_text()),
            "set": {"1.color": int(time.time() * 1000) % 16777216, **set_}}


@pytest.mark.timeout(300)
def test_real_comfyui_runs_the_model_free_workflows(tmp_path, comfyui):
    config = write_config(tmp_path, attempts=2, timeout_seconds=120)
    queue = submit(config, [_job(1, "trivial.json"), _job(2, "error_image_to_mask.json"), _job(3, "slow.json")])
    Runner(config_of(config), "real", comfyui, RunnerOptions(until_empty=True)).run()
    trivial, error, slow = (queue.reads.get(job_id(n)) for n in (1, 2, 3))
    assert trivial.state == "done" and trivial.outputs[0].size > 0
    assert error.state == "dead" and error.reason.startswith("execution_error, node 2 (ImageToMask): IndexError:")
    assert slow.state == "done" and slow.outputs
    for job in (trivial, slow):
        assert Path(job.outputs[0].path).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(300)
def test_real_comfyui_finished_prompt_is_adopted_not_rerun(tmp_path, comfyui):
    """A runner died after ComfyUI finished: the next attempt adopts the result from /history."""
    config = write_config(tmp_path, timeout_seconds=120)
    queue = submit(config, [_job(4, "trivial.json")])
    claim = queue.leases.claim("dead-runner", "real", lease_seconds=60)
    client = ComfyClient(comfyui)
    number = client.post_prompt(claim.workflow, claim.id, "someone")
    queue.leases.record_prompt(claim, "real", number)
    deadline = time.monotonic() + 60
    while client.history(claim.id) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    queue.leases.release_owner("dead-runner", "runner process died")
    Runner(config_of(config), "real", comfyui, RunnerOptions(until_empty=True)).run()
    job = queue.reads.get(claim.id)
    assert job.state == "done" and job.attempt == 2
    # Not re-run: the history entry is still the first run's number.
    assert client.history(claim.id)["prompt"][0] == number


@pytest.mark.timeout(300)
def test_real_comfyui_animated_outputs_are_stored_with_their_type(tmp_path, comfyui):
    """A generated batch saved by SaveAnimatedWEBP (no model needed) is downloaded, hashed, stored and typed
    image/webp; SaveWEBM's video/webm too where the server's PyAV has the VP9 encoder (else its job is dead with the
    encoder's error, which says so)."""
    from comfysup.assets import media_type

    # Distinct frames (a colour, then its inverse): libwebp writes equal frames as a still WebP, without ANIM.
    batch = {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 4, "color": 255}},
             "3": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
             "4": {"class_type": "ImageBatch", "inputs": {"image1": ["1", 0], "image2": ["3", 0]}},
             "2": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["4", 0], "filename_prefix": "anim",
                                                                 "fps": 6.0, "lossless": True, "quality": 80,
                                                                 "method": "default"}}}
    webm = {"1": batch["1"], "2": {"class_type": "SaveWEBM", "inputs": {"images": ["1", 0], "filename_prefix": "clip",
                                                                       "codec": "vp9", "fps": 8.0, "crf": 32.0}}}
    config = write_config(tmp_path, attempts=1, timeout_seconds=120)
    queue = submit(config, [{"id": job_id(5), "workflow": batch}, {"id": job_id(6), "workflow": webm}])
    Runner(config_of(config), "real", comfyui, RunnerOptions(until_empty=True)).run()
    animated, video = queue.reads.get(job_id(5)), queue.reads.get(job_id(6))
    assert animated.state == "done", animated.reason
    [output] = animated.outputs
    data = Path(output.path).read_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WEBP" and b"ANIM" in data[:64]  # animated: 2 distinct frames
    assert media_type(output.name) == "image/webp" and output.node_id == "2"
    if video.state == "done":
        assert Path(video.outputs[0].path).read_bytes()[:4] == b"\x1a\x45\xdf\xa3"  # EBML: a WebM
        assert media_type(video.outputs[0].name) == "video/webm"
    else:
        assert video.state == "dead" and "execution_error" in (video.reason or ""), video.reason
