"""Input files as values: the content hash, the reference a workflow carries, and the name ComfyUI is given.

A job's input file is named everywhere by its BLAKE3 hash, ``blake3:<hex>``, which is Comfy's API v2 asset
convention. In the stored job (its ``set``) and in the workflow it is the API v2 reference object
``{"__type": "core/ASSET", "info": {"hash": "blake3:<hex>", "file_path": "cat.png", "size": 852}}``; the runner
replaces it, just before POST /prompt, by the name the upload got on its server (``comfysup/<hex>.png``). A
name derived from the content means a changed input is always a new name, so ComfyUI's cache (which keys
LoadImage on the file it names) can never serve the old image for it.

A base module: the jobs layer, the queue's asset store, the runner and the views all read references.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any, BinaryIO

import blake3

ASSET_TYPE = "core/ASSET"
HASH_PREFIX = "blake3:"
UPLOAD_SUBFOLDER = "comfysup"
"""The subfolder of ComfyUI's input folder that holds comfysup's uploads (created by the first upload)."""
_HASH = re.compile(r"blake3:[0-9a-f]{64}")
_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")
READ_BYTES = 1 << 20
MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp",
               ".gif": "image/gif", ".webm": "video/webm", ".mp4": "video/mp4", ".mov": "video/quicktime",
               ".mkv": "video/x-matroska", ".flac": "audio/flac", ".mp3": "audio/mpeg", ".opus": "audio/ogg",
               ".ogg": "audio/ogg", ".wav": "audio/wav", ".m4a": "audio/mp4", ".glb": "model/gltf-binary",
               ".txt": "text/plain", ".json": "application/json"}
"""What ComfyUI's savers write (SaveImage, SaveAnimatedWEBP/PNG, SaveWEBM, SaveVideo, SaveAudio*, SaveGLB, VHS's
combiners), typed the same on every machine: mimetypes alone reads /etc/mime.types, which differs between hosts
(``.flac`` is unknown without it, ``.wav`` is ``audio/x-wav`` with it)."""


def is_hash(value: Any) -> bool:
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def hash_stream(stream: BinaryIO, limit: int | None = None) -> tuple[str, int]:
    """``(blake3:<hex>, size)`` of what ``stream`` holds; ValueError past ``limit`` bytes."""
    hasher, size = blake3.blake3(), 0
    while chunk := stream.read(READ_BYTES):
        size += len(chunk)
        if limit is not None and size > limit:
            raise ValueError(f"larger than {limit:,} bytes")
        hasher.update(chunk)
    return HASH_PREFIX + hasher.hexdigest(), size


def hash_bytes(data: bytes) -> str:
    return HASH_PREFIX + blake3.blake3(data).hexdigest()


def reference(digest: str, file_path: str, size: int) -> dict[str, Any]:
    """The API v2 reference to a stored asset, as a job stores it (no id: the hash is the identity)."""
    return {"__type": ASSET_TYPE, "info": {"hash": digest, "file_path": file_path, "size": size}}


def is_reference(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("__type") == ASSET_TYPE and isinstance(value.get("info"), Mapping)


def ref_hash(value: Mapping[str, Any]) -> str:
    return str(value["info"].get("hash", ""))


def ref_name(value: Mapping[str, Any]) -> str:
    return str(value["info"].get("file_path") or "")


def upload_name(digest: str, file_path: str) -> str:
    """The file name an input gets on a ComfyUI server: its hash, with the original suffix (loaders of video
    and audio pick a decoder by it). Two names for one content are one upload."""
    suffix = PurePosixPath(file_path.replace("\\", "/")).suffix
    return digest.removeprefix(HASH_PREFIX) + (suffix.lower() if _SUFFIX.fullmatch(suffix) else "")


def workflow_value(name: str) -> str:
    """What a loader's input holds for an upload in comfysup's subfolder (as ComfyUI's frontend writes it)."""
    return f"{UPLOAD_SUBFOLDER}/{name}"


def references(workflow: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """``(node id, input name, reference)`` for every input file of an API-format workflow."""
    for node_id, node in workflow.items():
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        if isinstance(inputs, Mapping):
            for name, value in inputs.items():
                if is_reference(value):
                    yield str(node_id), str(name), value


def in_params(params: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The ``set`` keys whose values are input files, with their references (what show and results list)."""
    return {key: value for key, value in params.items() if is_reference(value)}


def with_names(workflow: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``workflow`` with each reference replaced by the value ComfyUI expects for ``names[hash]``; the nodes it
    changes are copies, the others shared."""
    out = dict(workflow)
    for node_id, input_name, ref in list(references(workflow)):
        node = out[node_id]
        if node is workflow[node_id]:
            node = out[node_id] = {**node, "inputs": dict(node["inputs"])}
        node["inputs"][input_name] = workflow_value(names[ref_hash(ref)])
    return out


def listing(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A job's input files as show, results, webhooks and the status page list them: the ``set`` key, the
    file's name, its hash and size."""
    return [{"input": key, "name": ref_name(ref), "hash": ref_hash(ref), "size": ref["info"].get("size")}
            for key, ref in in_params(params).items()]


def short(ref: Mapping[str, Any]) -> str:
    """A reference in one cell: ``cat.png blake3:<hex>``."""
    return f"{ref_name(ref)} {ref_hash(ref)}".strip()


def media_type(name: str) -> str:
    """The content type of a stored file, from its name (an output is served with it)."""
    return MEDIA_TYPES.get(PurePosixPath(name).suffix.lower()) or mimetypes.guess_type(name)[0] \
        or "application/octet-stream"
