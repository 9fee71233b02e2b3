"""fake_comfy reads ``--extra-model-paths-config`` as ComfyUI's utils/extra_config.py does: sections of folder
paths, relative to ``base_path`` or to the file, ``|`` blocks of several paths, legacy folder names, and lists the
model files below them (links followed) as its loaders' choices."""

from __future__ import annotations

import json
from pathlib import Path

from fake_comfy.cli import parse_options
from fake_comfy.models import read_extra_paths, scan

EXAMPLE = """\
# like ComfyUI's extra_model_paths.yaml.example
comfyui:
    base_path: common/
    # is_default: true
    checkpoints: models/checkpoints/
    clip: models/clip/
a111:
    base_path: /opt/webui

    loras: |
         models/Lora
         models/LyCORIS
other:
    vae: vae-here
"""


def test_the_yaml_of_comfyuis_example(tmp_path: Path) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text(EXAMPLE)
    assert read_extra_paths(str(path)) == {
        "checkpoints": [tmp_path / "common" / "models" / "checkpoints"],
        "text_encoders": [tmp_path / "common" / "models" / "clip"],
        "loras": [Path("/opt/webui/models/Lora"), Path("/opt/webui/models/LyCORIS")],
        "vae": [tmp_path / "vae-here"],
    }


def test_comfysups_json_and_the_files_it_lists(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "checkpoints" / "sd").mkdir(parents=True)
    blob = tmp_path / "blob"
    blob.write_bytes(b"x")
    (models / "checkpoints" / "sd" / "a.safetensors").symlink_to(blob)
    (models / "checkpoints" / "notes.txt").write_text("not a model")
    (models / "checkpoints" / ".hidden.safetensors").write_text("")
    path = tmp_path / "extra_model_paths.yaml"
    path.write_text(json.dumps({"comfysup_models": {"base_path": str(models), "checkpoints": "checkpoints"}}))
    assert scan(read_extra_paths(str(path))) == {"checkpoints": ["sd/a.safetensors"]}
    options = parse_options(["--extra-model-paths-config", str(path), "--models", "checkpoints=b.safetensors"])
    assert options.model_files()["checkpoints"] == ["b.safetensors", "sd/a.safetensors"]  # type: ignore[index]
    (models / "checkpoints" / "c.safetensors").write_bytes(b"")  # seen while it runs, as ComfyUI sees it
    assert "c.safetensors" in options.model_files()["checkpoints"]  # type: ignore[index]


def test_without_the_flag_the_loaders_still_take_any_name() -> None:
    assert parse_options([]).model_files() is None
