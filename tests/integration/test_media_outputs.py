"""Outputs that are videos and audio are downloaded, hashed, stored and served with their type, on
both ComfyUI versions. The fake writes them as ComfyUI lists them (fake_comfy/t2i.py): SaveVideo's MP4 under
``images`` with ``animated: [true]``, SaveAnimatedWEBP's animated WebP under ``images``, SaveAudio's FLAC under
``audio``, VideoHelperSuite's MP4 under ``gifs`` (with its absolute ``fullpath``, which is never followed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from comfysup.api import views
from comfysup.observability.metrics import Metrics
from comfysup.observability.web import App
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike

MEDIA = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 3, "color": 255}},
    "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 8.0}},
    "3": {"class_type": "SaveVideo", "inputs": {"video": ["2", 0], "filename_prefix": "video/clip", "format": "auto",
                                                 "codec": "auto"}},
    "4": {"class_type": "EmptyAudio", "inputs": {"duration": 2.0, "sample_rate": 44100, "channels": 2}},
    "5": {"class_type": "SaveAudio", "inputs": {"audio": ["4", 0], "filename_prefix": "audio/sound"}},
    "6": {"class_type": "VHS_VideoCombine", "inputs": {"images": ["1", 0], "frame_rate": 8.0,
                                                        "filename_prefix": "vhs", "format": "video/h264-mp4"}},
    "7": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["1", 0], "filename_prefix": "anim", "fps": 6.0,
                                                        "lossless": True, "quality": 80, "method": "default"}},
}
EXPECTED = {"video/clip_00001_.mp4": ("3", "video/mp4", b"ftyp"),
            "audio/sound_00001_.flac": ("5", "audio/flac", b"fLaC"),
            "vhs_00001.mp4": ("6", "video/mp4", b"ftyp"), "anim_00001_.webp": ("7", "image/webp", b"WEBP")}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("launched", [False, True], ids=["through /view", "from the output folder"])
def test_video_and_audio_outputs_are_stored_and_served_with_their_type(tmp_path: Path, fake_comfy: FakeComfy,
                                                                       launched: bool) -> None:
    queue = submit(write_config(tmp_path), [{"id": job_id(1), "workflow": MEDIA}])
    outputs = {"cpu0": tmp_path / "fake_comfy" / "output"} if launched else None
    Runner(config_of(tmp_path / "config.toml"), "cpu0", fake_comfy.url,
           RunnerOptions(until_empty=True, output_dirs=outputs)).run()
    job = queue.reads.get(job_id(1))
    assert job.state == "done", job.reason
    stored = {o.name: o for o in job.outputs}
    assert set(stored) == set(EXPECTED), stored
    app = App(queue, Metrics(queue, lambda: None), lambda: None, tmp_path / "store")
    for name, (node, kind, magic) in EXPECTED.items():
        data = (tmp_path / "store" / job.id / name).read_bytes()
        assert magic in data[:12] and hashlib.sha256(data).hexdigest() == stored[name].sha256
        assert stored[name].node_id == node and stored[name].size == len(data)
        assert views.content_type(name) == kind and views.output_type(name) == kind.split("/")[0]
        served = app.get(f"/files/{job.id}/{name}")
        assert (served.status, served.content_type, served.content()) == (200, kind, data)
        served.close()
    queue.close()
