"""Files on the API's own machine. ``POST /api/v2/assets/from-path`` registers a file below ``[api]
path_roots`` (none by default); an upload to ``models/<folder>/<name>.safetensors`` is placed in ``[api]
models_dir`` (unset by default). Both refuse with the spec's envelope and say which setting opens them."""

from __future__ import annotations

import copy
import json
import os
import struct
import uuid
from pathlib import Path

import httpx
from comfy_low.models import Asset as AssetModel
from comfy_low.models import ErrorEnvelope

from comfysup import assets
from tests.api_support import api_config, running_api
from tests.input_images import INVERT


def _safetensors(payload: bytes = b"\0" * 16) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(payload)]}}).encode()
    return struct.pack("<Q", len(header)) + header + payload


def _code(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text
    return ErrorEnvelope.model_validate(answer.json()).error.code


def _upload(url: str, data: bytes, file_path: str) -> httpx.Response:
    return httpx.post(f"{url}/api/v2/assets", data={"content_type": "application/octet-stream",
                                                    "file_path": file_path},
                      files={"file": (file_path.rsplit("/", 1)[-1], data, "application/octet-stream")})


def test_nothing_on_the_machine_is_reachable_by_default(tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"not yours")
    with running_api(api_config(tmp_path)) as url:
        refused = httpx.post(f"{url}/api/v2/assets/from-path", json={"path": str(secret)})
        assert _code(refused, 403) == "forbidden" and "[api] path_roots" in refused.json()["error"]["message"]
        model = _upload(url, _safetensors(), "models/checkpoints/x.safetensors")
        assert _code(model, 403) == "forbidden" and "[api] models_dir" in model.json()["error"]["message"]


def test_from_path_registers_a_file_below_a_root_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "datasets"
    (root / "cats").mkdir(parents=True)
    photo = root / "cats" / "1.png"
    photo.write_bytes(b"\x89PNG a cat")
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"outside")
    (root / "link.png").symlink_to(outside)
    (root / "linked").symlink_to(tmp_path)
    os.mkfifo(root / "pipe.png")
    with running_api(api_config(tmp_path, path_roots=[str(root)])) as url:
        made = httpx.post(f"{url}/api/v2/assets/from-path", json={"path": str(photo), "file_path": "cat.png"})
        assert made.status_code == 201, made.text
        asset = AssetModel.model_validate(made.json())
        assert asset.hash == assets.hash_bytes(b"\x89PNG a cat") and asset.file_path == "cat.png"
        assert httpx.get(f"{url}/api/v2/assets/{asset.id}/content").content == b"\x89PNG a cat"
        again = httpx.post(f"{url}/api/v2/assets/from-path", json={"path": "cats/1.png"})  # relative to the root
        assert again.status_code == 200 and again.json()["created_new"] is False
        for path, (status, code) in {str(outside): (403, "forbidden"), f"{root}/../outside.png": (403, "forbidden"),
                                     str(root / "link.png"): (403, "forbidden"),
                                     f"{root}/linked/outside.png": (403, "forbidden"),
                                     str(root / "pipe.png"): (404, "blob_not_found"),
                                     str(root / "none.png"): (404, "blob_not_found"),
                                     str(root / "cats"): (404, "blob_not_found")}.items():
            assert _code(httpx.post(f"{url}/api/v2/assets/from-path", json={"path": path}), status) == code, path
        assert _code(httpx.post(f"{url}/api/v2/assets/from-path", json={"file_path": "x"}), 400) == "invalid_request"
        submitted = httpx.post(f"{url}/api/v2/jobs", json={"workflow": {**INVERT, "1": {
            "class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": asset.id}}}}}})
        assert submitted.status_code == 201, submitted.text


def test_a_model_upload_is_placed_once_and_named_as_loaders_name_it(tmp_path: Path) -> None:
    models = tmp_path / "models"
    with running_api(api_config(tmp_path, models_dir=str(models))) as url:
        data = _safetensors()
        made = _upload(url, data, "models/loras/style/anime.safetensors")
        assert made.status_code == 201, made.text
        assert (models / "loras" / "style" / "anime.safetensors").read_bytes() == data
        assert not [p for p in (models / "loras" / "style").iterdir() if p.name.startswith(".")]
        again = _upload(url, _safetensors(b"\1" * 16), "models/loras/style/anime.safetensors")
        assert _code(again, 409) == "hash_mismatch"
        assert (models / "loras" / "style" / "anime.safetensors").read_bytes() == data  # never replaced
        assert _code(_upload(url, b"PK\3\4 a pickle", "models/checkpoints/evil.safetensors"), 400) == "invalid_request"
        for bad in ("models/custom_nodes/x.safetensors", "models/configs/x.safetensors",
                    "models/checkpoints/../../x.safetensors", "models/checkpoints/x.ckpt"):
            assert _code(_upload(url, data, bad), 400) == "invalid_request", bad
        (models / "vae").symlink_to(tmp_path)
        assert _code(_upload(url, _safetensors(b"\2" * 16), "models/vae/x.safetensors"), 403) == "forbidden"
        assert not (tmp_path / "x.safetensors").exists()
        graph = {"1": {"class_type": "LoraLoaderModelOnly", "inputs": {"lora_name": {
            "__type": "core/ASSET", "info": {"id": made.json()["id"]}}}},
                 **{k: v for k, v in copy.deepcopy(INVERT).items() if k != "1"}}  # never the shared dict itself
        graph["4"] = {"class_type": "LoadImage", "inputs": {"image": "x.png"}}
        graph["2"]["inputs"]["image"] = ["4", 0]
        submitted = httpx.post(f"{url}/api/v2/jobs", json={"workflow": graph})
        assert submitted.status_code == 201, submitted.text
        executed = httpx.get(f"{url}/api/v2/jobs/{submitted.json()['id']}/workflow").json()["workflow"]
        assert executed["1"]["inputs"]["lora_name"] == "style/anime.safetensors"
    assert uuid.UUID(made.json()["id"])
