"""fake_comfy saves a filename_prefix with folders as ComfyUI's folder_paths.get_save_image_path does: the
folder part becomes the file's subfolder (in /history and ``executed``), the file lands in output/<subfolder>/
(comfysup gives each job its own folder this way: comfysup.runner.outputs)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import requests

from fake_comfy import FakeComfy
from fake_comfy.server import trivial_prompt


@pytest.mark.timeout(30)
def test_a_prefix_with_folders_saves_into_that_subfolder(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fc:
        prompt_id = str(uuid.uuid4())
        prompt = trivial_prompt(7, f"comfysup/{prompt_id}/cats/tabby")
        answer = requests.post(f"{fc.url}/prompt", json={"prompt": prompt, "prompt_id": prompt_id}, timeout=5)
        assert answer.status_code == 200, answer.text
        end = time.monotonic() + 10
        entry = None
        while entry is None and time.monotonic() < end:
            entry = requests.get(f"{fc.url}/history/{prompt_id}", timeout=5).json().get(prompt_id)
            time.sleep(0.02)
        assert entry is not None
        (images,) = [o["images"] for o in entry["outputs"].values()]
        assert images == [{"filename": "tabby_00001_.png", "subfolder": f"comfysup/{prompt_id}/cats", "type": "output"}]
        saved = Path(fc.output_directory) / "comfysup" / prompt_id / "cats" / "tabby_00001_.png"
        assert saved.is_file()
        view = requests.get(f"{fc.url}/view", params=images[0], timeout=5)
        assert view.status_code == 200 and view.content == saved.read_bytes()
