"""comfysup.workflows as tables: which loader inputs make a model key, and how a job's workflow is rebuilt."""

from __future__ import annotations

import copy

import pytest

from comfysup.workflows import apply_params, model_files, model_key


def node(class_type: str, **inputs: object) -> dict:
    return {"class_type": class_type, "inputs": inputs}


@pytest.mark.parametrize(("workflow", "files"), [
    ({"1": node("CheckpointLoaderSimple", ckpt_name="sdxl.safetensors")},
     ["CheckpointLoaderSimple.ckpt_name=sdxl.safetensors"]),
    ({"1": node("UNETLoader", unet_name="flux.safetensors", weight_dtype="fp8"),
      "2": node("DualCLIPLoader", clip_name1="t5.safetensors", clip_name2="l.safetensors", type="flux"),
      "3": node("VAELoader", vae_name="ae.safetensors")},
     ["DualCLIPLoader.clip_name1=t5.safetensors", "DualCLIPLoader.clip_name2=l.safetensors",
      "UNETLoader.unet_name=flux.safetensors", "VAELoader.vae_name=ae.safetensors"]),
    ({"1": node("LoraLoader", lora_name="x.safetensors", strength_model=0.7, model=["0", 0])},
     ["LoraLoader.lora_name=x.safetensors"]),  # strengths and links load no file
    ({"1": node("UnetLoaderGGUF", unet_name="q4.gguf")}, ["UnetLoaderGGUF.unet_name=q4.gguf"]),  # custom loader
    ({"1": node("LoadImage", image="cat.png"), "2": node("CLIPTextEncode", text="a cat")}, []),
    ({"1": node("ControlNetLoader", control_net_name=["5", 0])}, []),  # a linked name is not known at submit
])
def test_model_files(workflow: dict, files: list[str]) -> None:
    assert model_files(workflow) == files
    assert (model_key(workflow) is None) == (not files)


def test_the_key_names_the_files_not_their_order_or_node_ids() -> None:
    a = {"1": node("CheckpointLoaderSimple", ckpt_name="m"), "2": node("LoraLoader", lora_name="l")}
    b = {"9": node("LoraLoader", lora_name="l", strength_clip=0.2), "4": node("CheckpointLoaderSimple", ckpt_name="m")}
    c = {"1": node("CheckpointLoaderSimple", ckpt_name="m"), "2": node("LoraLoader", lora_name="other")}
    assert model_key(a) == model_key(b) != model_key(c)
    assert len(model_key(a) or "") == 16


def test_apply_params_copies_only_what_it_changes_and_is_idempotent() -> None:
    template = {"1": node("EmptyImage", width=8, color=0), "2": node("SaveImage", filename_prefix="x")}
    before = copy.deepcopy(template)
    params = {"1.color": 5, "1.batch_size": 2, "9.missing": 1}
    out = apply_params(template, params)
    assert out == {"1": node("EmptyImage", width=8, color=5, batch_size=2), "2": node("SaveImage", filename_prefix="x")}
    assert template == before  # the cached template is never changed
    assert out["2"] is template["2"]  # untouched nodes are shared, not copied
    assert apply_params(out, params) == out  # rows stored with the set already applied rebuild exactly
    assert apply_params(template, {}) == template
