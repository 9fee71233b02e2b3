"""The fake's model files: which loader input lists which models folder, and the files each folder holds.

A ComfyUI lists the files of its models folders (`models/checkpoints`, `models/loras`, ...) as the choices of
its loaders' inputs, and refuses a prompt naming another with 400 `value_not_in_list`. The fake has no files:
`--models` says what it has. Without `--models` its loaders take any name (and list `[]`, as the recorded
server with no model files did), so tests that swap made-up models keep working.
"""

from __future__ import annotations

import re

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
