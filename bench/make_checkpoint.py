"""bench/make_checkpoint.py: a checkpoint of a real architecture with random weights, made from ComfyUI's own models.

The benchmarks need a model that computes as a trained one does (the same UNet, VAE and text encoder, the same
shapes and kernels) without downloading one: this script builds the modules from ComfyUI's own definitions
(``comfy.model_detection`` picks the model class from the UNet's config, as CheckpointLoaderSimple does; the
VAE is ``comfy.ldm.models.autoencoder.AutoencoderKL`` with the config ``comfy.sd.VAE`` gives SD1.x/SDXL; the text
encoder is the model class's own ``clip_target``), on PyTorch's ``meta`` device (shapes only, no memory), fills
every tensor with random values of a sensible scale (normal with std 1/sqrt(fan-in) for weights, ones for norm
scales, zeros for biases), renames the keys with the model class's own ``process_*_state_dict_for_saving`` (the
prefixes ``model.diffusion_model.``, ``first_stage_model.``, ``cond_stage_model.transformer.`` for SD1.5) and
writes one safetensors file (to a temporary name, renamed when complete). The images it makes are noise; the time
they take is a real model's. It then checks that ComfyUI's detection names the file's model class.

Run it with ComfyUI's Python; the checkpoint is made where it runs and never committed:

    /work/comfyui-venv/bin/python bench/make_checkpoint.py --comfyui /work/comfyui OUT.safetensors
    ... --arch sdxl --device cuda OUT.safetensors        # SDXL (about 7 GB in fp16), made on the GPU

SD1.5 in fp16 is about 2 GB: 860 M UNet, 84 M VAE and 123 M text-encoder parameters.
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and bench/queue.py would shadow the standard library's
# queue module (torch imports it).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import math
import os
import time

import torch
from safetensors.torch import save_file

ARCHS = ("sd15", "sdxl")
"""The architectures this script builds."""


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the .safetensors file to write")
    parser.add_argument("--comfyui", type=Path, default=Path(os.environ.get("COMFYUI_DIR", "/work/comfyui")),
                        help="a ComfyUI checkout (default: $COMFYUI_DIR or /work/comfyui)")
    parser.add_argument("--arch", choices=ARCHS, default="sd15", help="the architecture (default sd15)")
    parser.add_argument("--device", default="cpu", help="where the random values are drawn (cpu, cuda; default cpu)")
    parser.add_argument("--seed", type=int, default=0, help="the random values' seed (default 0)")
    args = parser.parse_args()
    if not (args.comfyui / "comfy" / "model_detection.py").is_file():
        parser.error(f"--comfyui {args.comfyui}: not a ComfyUI checkout (no comfy/model_detection.py there)")
    return args

UNET = {
    "sd15": {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 320,
             "num_res_blocks": [2, 2, 2, 2], "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
             "channel_mult": [1, 2, 4, 4], "transformer_depth_middle": 1, "use_linear_in_transformer": False,
             "context_dim": 768, "num_heads": 8, "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
             "use_temporal_attention": False, "use_temporal_resblock": False},
    "sdxl": {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816, "in_channels": 4,
             "model_channels": 320, "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10],
             "channel_mult": [1, 2, 4], "transformer_depth_middle": 10, "use_linear_in_transformer": True,
             "context_dim": 2048, "num_head_channels": 64, "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
             "use_temporal_attention": False, "use_temporal_resblock": False},
}
"""Each architecture's UNet config, as comfy.model_detection's unet_config_from_diffusers_unet states it (0.3.64)."""

VAE = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
       "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}
"""The SD1.x/SDXL VAE's config, as comfy.sd.VAE builds it for a checkpoint's first_stage_model."""


def shapes(arch: str) -> tuple[object, dict[str, torch.Tensor]]:
    """The model class ComfyUI picks for the architecture, and the checkpoint's tensors on the meta device."""
    import comfy.model_detection
    from comfy.ldm.models.autoencoder import AutoencoderKL

    config = comfy.model_detection.model_config_from_unet_config(dict(UNET[arch]))
    if config is None:
        raise SystemExit(f"ComfyUI knows no model class for the {arch} UNet config: is this ComfyUI 0.3.x?")
    with torch.device("meta"):
        unet = config.get_model({}).diffusion_model.state_dict()
        vae = AutoencoderKL(ddconfig=dict(VAE), embed_dim=4).state_dict()
        clip = config.clip_target().clip(device="meta").state_dict()
    sd = config.process_unet_state_dict_for_saving(unet)
    sd.update(config.process_vae_state_dict_for_saving(vae))
    sd.update(config.process_clip_state_dict_for_saving(clip))
    return config, sd


def random_like(name: str, meta: torch.Tensor, generator: torch.Generator, device: str) -> torch.Tensor:
    """A tensor of meta's shape with values a trained model's layers would have the scale of (fp16 floats)."""
    if not meta.dtype.is_floating_point:
        return torch.arange(meta.shape[-1]).expand(meta.shape).contiguous().to(meta.dtype)  # position ids
    if meta.dim() >= 2:
        fan_in = math.prod(meta.shape[1:])
        out = torch.randn(meta.shape, generator=generator, device=device, dtype=torch.float16)
        return out.mul_(1.0 / math.sqrt(fan_in)).cpu()
    if name.endswith("bias") or meta.numel() == 0:
        return torch.zeros(meta.shape, dtype=torch.float16)
    if name.endswith("logit_scale"):
        return torch.full(meta.shape, math.log(100.0), dtype=torch.float16)
    return torch.ones(meta.shape, dtype=torch.float16)  # a norm's scale


def detected(path: Path) -> str:
    """The model class ComfyUI's detection names for the written file (as CheckpointLoaderSimple does)."""
    import comfy.model_detection
    import comfy.utils

    sd = comfy.utils.load_torch_file(str(path))
    config = comfy.model_detection.model_config_from_unet(sd, "model.diffusion_model.")
    return type(config).__name__ if config is not None else "nothing"


def main() -> None:
    args = arguments()
    sys.path.insert(0, str(args.comfyui))  # ComfyUI's modules (comfy.*), imported where they are used
    import comfy.cli_args

    comfy.cli_args.args.cpu = args.device == "cpu"  # as `main.py --cpu`: ComfyUI looks for no GPU
    started = time.perf_counter()
    config, metas = shapes(args.arch)
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    sd = {name: random_like(name, meta, generator, args.device) for name, meta in metas.items()}
    drawn = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    save_file(sd, str(partial), metadata={"made_by": "comfysup bench/make_checkpoint.py", "arch": args.arch,
                                          "weights": f"random, seed {args.seed}"})
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    partial.replace(args.out)
    written = time.perf_counter()
    params = sum(t.numel() for t in sd.values())
    found = detected(args.out)
    print(f"{args.out}: {args.arch} ({type(config).__name__}), {len(sd):,} tensors, {params / 1e6:,.0f} M parameters, "
          f"{args.out.stat().st_size / 2**30:.2f} GiB; drawn in {drawn - started:.1f} s on {args.device}, written in "
          f"{written - drawn:.1f} s; ComfyUI detects it as {found}", flush=True)
    if found != type(config).__name__:
        raise SystemExit(f"ComfyUI detects {args.out} as {found}, not {type(config).__name__}")


if __name__ == "__main__":
    main()
