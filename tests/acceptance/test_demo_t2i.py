"""``comfysup demo --example text-to-image`` runs a text-to-image batch (the recorded SD1.5
workflow, CheckpointLoaderSimple → CLIPTextEncode → KSampler → VAEDecode → SaveImage) on the fake servers, with
their model list, from any directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from supervisor_support import demo_from_elsewhere, processes_under

from fake_comfy.uploads import decode_png


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_text_to_image_example_is_one_command_from_any_directory(tmp_path: Path) -> None:
    result, lines, results = demo_from_elsewhere(tmp_path, "text-to-image")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(lines)} of {len(lines)} job(s) done" in result.stdout
    images = []
    for line in lines:
        (output,) = (results / line["id"]).glob("*.png")
        width, height, _c, pixels = decode_png(output.read_bytes())
        assert (width, height) == (line["set"]["5.width"], line["set"]["5.height"]), "the latent's size"
        images.append(pixels)
    assert len(set(images)) == len(lines), "each seed and prompt its own image"
    assert list((tmp_path / "elsewhere").iterdir()) == []  # the demo wrote nothing where it ran
    assert not processes_under(tmp_path)
