"""The fake's model files: which loader input lists which models folder, and the files each folder holds.

A ComfyUI lists the files of its models folders (`models/checkpoints`, `models/loras`, ...) as the choices of
its loaders' inputs, and refuses a prompt naming another with 400 `value_not_in_list`. The fake has no files:
`--models` says what it has. Without `--models` its loaders take any name (and list `[]`, as the recorded
server with no model files did), so tests that swap made-up models keep working. `--extra-model-paths-config` adds
the files of the folders it names, read as ComfyUI reads them (``read_extra_paths``, ``scan``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: Loader input → the models folder its choices come from (ComfyUI's folder_paths names).
FOLDER_OF: dict[str, str] = {
    "CheckpointLoaderSimple.ckpt_name": "checkpoints",
    "LoraLoader.lora_name": "loras",
    "ControlNetLoader.control_net_name": "controlnet",
    "UpscaleModelLoader.model_name": "upscale_models",
    "VAELoader.vae_name": "vae",
    "UNETLoader.unet_name": "diffusion_models",
    "CLIPLoader.clip_name": "text_encoders",
}

#: What `--models` alone gives each folder: the files the recorded workflows and the README's examples name.
DEFAULT_MODELS: dict[str, list[str]] = {
    "checkpoints": ["v1-5-pruned-emaonly.safetensors", "sd_xl_base_1.0.safetensors"],
    "loras": ["lcm-lora-sdv1-5.safetensors"],
    "controlnet": ["control_v11p_sd15_canny.pth"],
    "upscale_models": ["RealESRGAN_x4plus.pth", "4x-UltraSharp.pth"],
    "vae": ["vae-ft-mse-840000-ema-pruned.safetensors"],
    "diffusion_models": ["flux1-dev.safetensors"],
    "text_encoders": ["t5xxl_fp16.safetensors", "clip_l.safetensors"],
}

FOLDERS = sorted(set(FOLDER_OF.values()))


def parse_models(spec: str) -> dict[str, list[str]]:
    """`--models` text → folder → files: `checkpoints=a.safetensors,b.safetensors;loras=x.safetensors`.

    An empty spec (`--models` alone) or `default` gives DEFAULT_MODELS; a folder the spec names lists exactly
    its files (none for `loras=`), the folders it does not name keep their defaults. Raises ValueError.
    """
    models = {folder: list(files) for folder, files in DEFAULT_MODELS.items()}
    spec = spec.strip()
    if spec in ("", "default"):
        return models
    for part in spec.split(";"):
        if not part.strip():
            continue
        folder, sep, files = part.partition("=")
        folder = folder.strip()
        if not sep or folder not in DEFAULT_MODELS:
            raise ValueError(f"--models: {part.strip()!r} is not FOLDER=FILE,FILE with FOLDER one of "
                             f"{', '.join(FOLDERS)} (e.g. --models 'checkpoints=my.safetensors;loras=a.safetensors')")
        models[folder] = [name.strip() for name in files.split(",") if name.strip()]
    return models


def scale_of(model_name: str | None) -> int:
    """An upscale model's factor, read from its name as a user would (`4x-UltraSharp`, `RealESRGAN_x2plus`);
    4 when the name says none, the factor of most upscale models."""
    found = re.search(r"(?:^|[^0-9])([1-8])x|x([1-8])(?:[^0-9]|$)", model_name or "")
    return int(found.group(1) or found.group(2)) if found else 4


#: ComfyUI's folder_paths.supported_pt_extensions: what its model folders list (other files are not models).
MODEL_EXTENSIONS = (".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft")
#: Legacy folder names ComfyUI maps to the current ones (folder_paths.map_legacy).
LEGACY = {"clip": "text_encoders", "unet": "diffusion_models"}


def read_extra_paths(path: str) -> dict[str, list[Path]]:
    """One ``--extra-model-paths-config`` file → folder → the directories it adds, as ComfyUI's
    utils/extra_config.load_extra_path_config reads it: sections of ``folder: path`` (several paths one per line),
    each relative to the section's ``base_path`` when it has one, else to the file's own folder. Raises OSError
    (ComfyUI fails to start on a file it cannot read) or ValueError."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        document = json.loads(text)  # JSON is YAML, and what comfysup writes
    except ValueError:
        document = _simple_yaml(text)
    here = Path(os.path.abspath(path)).parent
    found: dict[str, list[Path]] = {}
    for section in (document or {}).values():
        if not isinstance(section, dict):
            continue
        section = dict(section)
        base = section.pop("base_path", None)
        section.pop("is_default", None)
        if base is not None:
            base = Path(os.path.expandvars(os.path.expanduser(str(base))))
            base = base if base.is_absolute() else here / base
        for folder, value in section.items():
            for line in str(value).split("\n"):
                if line:
                    directory = base / line if base is not None else here / line
                    found.setdefault(LEGACY.get(folder, folder), []).append(Path(os.path.normpath(directory)))
    return found


def _simple_yaml(text: str) -> dict[str, dict[str, str]]:
    """The YAML of extra_model_paths.yaml.example: top-level sections of ``key: value`` lines, ``|`` blocks, and
    comments (PyYAML is ComfyUI's dependency, not the fake's)."""
    document: dict[str, dict[str, str]] = {}
    section: dict[str, str] | None = None
    block: str | None = None
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if not line[0].isspace():
            section = document.setdefault(line.rstrip(":").strip(), {})
            block = None
            continue
        if section is None:
            raise ValueError(f"not an extra_model_paths file: {raw!r}")
        key, colon, value = line.strip().partition(":")
        if block is not None and (not colon or " " in key):
            section[block] += line.strip() + "\n"
            continue
        value = value.strip().strip("'\"")
        block = key if value == "|" else None
        section[key] = "" if value == "|" else value
    return document


def scan(folders: dict[str, list[Path]]) -> dict[str, list[str]]:
    """The files each folder lists, as ComfyUI's get_filename_list does: every model file below its directories
    (links followed, hidden ones skipped), named by its path relative to the directory, sorted."""
    listed: dict[str, list[str]] = {}
    for folder, directories in folders.items():
        names: set[str] = set()
        for directory in directories:
            for parent, dirs, files in os.walk(directory, followlinks=True):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                for name in files:
                    full = Path(parent) / name
                    if not name.startswith(".") and name.lower().endswith(MODEL_EXTENSIONS) and full.is_file():
                        names.add(full.relative_to(directory).as_posix())
        listed[folder] = sorted(names)
    return listed
