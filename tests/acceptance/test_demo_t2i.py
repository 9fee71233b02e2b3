"""Issue 32, point 2: ``comfysup demo --example text-to-image`` runs a text-to-image batch (the recorded SD1.5
workflow, CheckpointLoaderSimple → CLIPTextEncode → KSampler → VAEDecode → SaveImage) on the fake servers, with
their model list, from any directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from supervisor_support import REPO, processes_under

from comfysup.commands.demo import EXAMPLES
from fake_comfy.uploads import decode_png


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_text_to_image_example_is_one_command_from_any_directory(tmp_path: Path) -> None:
    elsewhere, cache = tmp_path / "elsewhere", tmp_path / "cache"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    env.update(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(cache))
    result = subprocess.run([sys.executable, "-m", "comfysup", "demo", "--example", "text-to-image"], cwd=elsewhere,
                            env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (EXAMPLES / "text-to-image.jsonl").read_text().splitlines() if line]
    assert f"{len(lines)} of {len(lines)} job(s) done" in result.stdout
    results = cache / "comfysup" / "demo" / "var" / "results"
    images = []
    for line in lines:
        (output,) = (results / line["id"]).glob("*.png")
        width, height, _c, pixels = decode_png(output.read_bytes())
        assert (width, height) == (line["set"]["5.width"], line["set"]["5.height"]), "the latent's size"
        images.append(pixels)
    assert len(set(images)) == len(lines), "each seed and prompt its own image"
    assert list(elsewhere.iterdir()) == []
    assert not processes_under(tmp_path)
