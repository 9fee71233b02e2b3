"""What the queue derives from a workflow: its content address, its model key, and the job's own copy of it.

A batch is usually one workflow with different ``set`` values. The queue stores each distinct workflow
once, addressed by the hash of its text, and keeps only the job's ``set`` with the job; the workflow that
ComfyUI receives is rebuilt from the two (``apply_params``) exactly as ``comfysup submit`` applied it.

The model key names the files a workflow's loader nodes load (checkpoints, UNets, CLIPs, VAEs, LoRAs,
ControlNets, upscale models). Loading one takes seconds to minutes, so a runner prefers the next job whose
key matches what its server ran last (model affinity, in the queue's claim).

Pure functions: no I/O, so they are tested as tables and the two backends share them.

The submodules read workflows as people save them, knowing nothing of queues or servers: ``ui`` converts the
UI format (subgraphs, group nodes, reroutes, primitives, mute and bypass) into the API prompt ComfyUI's
frontend queues, given a node catalogue; ``image`` reads the prompt and workflow ComfyUI writes into PNG and
animated WEBP files; ``names`` resolves ``set`` keys by title or subgraph id path and lists what a job can set.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

LOADER_CLASSES = frozenset({
    "CheckpointLoaderSimple", "CheckpointLoader", "ImageOnlyCheckpointLoader", "unCLIPCheckpointLoader",
    "UNETLoader", "CLIPLoader", "DualCLIPLoader", "TripleCLIPLoader", "QuadrupleCLIPLoader", "VAELoader",
    "LoraLoader", "LoraLoaderModelOnly", "ControlNetLoader", "DiffControlNetLoader", "UpscaleModelLoader",
    "CLIPVisionLoader", "StyleModelLoader", "GLIGENLoader", "HypernetworkLoader", "PhotoMakerLoader",
})
"""ComfyUI's built-in loaders; any other class whose name contains "Loader" (custom loaders such as
UnetLoaderGGUF) counts too. LoadImage does not: an image is not a model."""
_FILE_INPUT = re.compile(r"[a-z0-9_]*_name\d*")
"""Inputs that name a file to load: ckpt_name, unet_name, clip_name1, vae_name, lora_name, control_net_name,
model_name, …; strengths and dtypes change no file, so they do not change the key."""
MODEL_KEY_CHARS = 16
"""64 bits of sha256: short in the affinity index, and a collision only costs one model swap."""



def _encoder(*, sort_keys: bool) -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)``, with its C encoder built once.

    JSONEncoder.encode builds a new C encoder for every call (half the cost of encoding a small dict, six
    times that of an int), and a large submit encodes hundreds of thousands of small values. Without the
    circular-reference check: what is encoded here was parsed from JSON, which cannot hold a cycle.
    """
    plain = json.JSONEncoder(sort_keys=sort_keys, separators=(",", ":"))
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return plain.encode
    encode = c_make_encoder(None, plain.default, encode_basestring_ascii, None, ":", ",", sort_keys, False, True)

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


canonical = _encoder(sort_keys=True)
"""The stored text of a workflow: sorted keys, no spaces (what spec hashes are computed over)."""
compact = _encoder(sort_keys=False)
"""Compact JSON in the keys' own order: a job's small JSON (params, extra_data, meta) as stored."""


def content_hash(text: str) -> str:
    """The address of a stored workflow: sha256 of its canonical text."""
    return hashlib.sha256(text.encode()).hexdigest()


def is_loader(class_type: str) -> bool:
    return class_type in LOADER_CLASSES or "Loader" in class_type


def model_files(workflow: Mapping[str, Any]) -> list[str]:
    """``Class.input=file`` for every file a loader node of ``workflow`` loads, sorted, without repeats."""
    found: set[str] = set()
    for node in workflow.values():
        if not isinstance(node, dict):
            continue
        class_type = node.get("class_type")
        inputs = node.get("inputs")
        if not isinstance(class_type, str) or not isinstance(inputs, dict) or not is_loader(class_type):
            continue
        for name, value in inputs.items():
            if isinstance(value, str) and _FILE_INPUT.fullmatch(name):
                found.add(f"{class_type}.{name}={value}")
    return sorted(found)


def model_key(workflow: Mapping[str, Any]) -> str | None:
    """A short key for the set of model files ``workflow`` loads; None when it loads none (no affinity)."""
    files = model_files(workflow)
    if not files:
        return None
    return hashlib.sha256("\n".join(files).encode()).hexdigest()[:MODEL_KEY_CHARS]


def touches_loader(workflow: Mapping[str, Any], changed: Mapping[str, Any]) -> bool:
    """Whether nodes changed by a ``set`` include a loader, so the template's model key may not hold."""
    return any(is_loader(str((workflow.get(k) or {}).get("class_type", ""))) for k in changed)


def apply_params(template: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The workflow ComfyUI receives: ``template`` with the job's ``set`` applied, as comfysup.jobs.apply_set
    did at submit (validated there, so a key naming a missing node cannot occur; it is skipped, never raised
    in a runner).

    Only the nodes a key changes are copied; the others are shared with ``template``, which callers (a
    cache of parsed templates) must therefore never modify. Applying ``params`` to a workflow that already
    has them applied changes nothing, so rows stored before templates were split out still rebuild
    exactly.
    """
    if not params:
        return dict(template)
    out = dict(template)
    copied: set[str] = set()
    for key, value in params.items():
        node_id, dot, name = key.rpartition(".")
        node = out.get(node_id)
        if not dot or not isinstance(node, dict):
            continue
        if node_id not in copied:
            node = out[node_id] = {**node, "inputs": dict(node.get("inputs") or {})}
            copied.add(node_id)
        node["inputs"][name] = value
    return out

