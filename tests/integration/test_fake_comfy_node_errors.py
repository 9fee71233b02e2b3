"""Any exception inside the fake's execution of a node becomes ComfyUI's execution_error for
that prompt (the shape of the recorded execution-error.json), and the fake moves on to the next prompt. A damaged
PNG given to LoadImage used to raise inside the executor, and the prompt stayed running forever."""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
import requests

from fake_comfy import FakeComfy
from tests.input_images import random_png

DATA = Path(__file__).resolve().parents[2] / "fake_comfy" / "data"
RECORDED_ERROR = json.loads((DATA / "execution-error.json").read_text())
LOAD_SAVE = {"1": {"class_type": "LoadImage", "inputs": {"image": "damaged.png"}},
             "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "damaged"}}}


def recorded_error_keys() -> set[str]:
    message = next(m["json"] for m in RECORDED_ERROR["ws_messages_client_A_prompt_owner"]
                   if m["json"]["type"] == "execution_error")
    return set(message["data"])


def run(fc: FakeComfy, prompt: dict[str, Any]) -> dict[str, Any]:
    """POST the prompt, then wait for its history entry (none within 10 s: the fake is stuck)."""
    prompt_id = str(uuid.uuid4())
    answer = requests.post(f"{fc.url}/prompt", json={"prompt": prompt, "prompt_id": prompt_id}, timeout=5)
    assert answer.status_code == 200, answer.text
    end = time.monotonic() + 10
    while time.monotonic() < end:
        entry = requests.get(f"{fc.url}/history/{prompt_id}", timeout=5).json().get(prompt_id)
        if entry:
            return entry
        time.sleep(0.02)
    raise AssertionError(f"prompt {prompt_id} never ended: the fake is stuck")


def error_of(entry: dict[str, Any]) -> dict[str, Any]:
    assert entry["status"]["status_str"] == "error"
    (error,) = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    return error


def trivial(color: int) -> dict[str, Any]:
    return {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": color}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "next"}}}


def with_bad_crc(png: bytes, kind: bytes, corrupt_data: bool = False) -> bytes:
    """``png`` with the checksum of its chunk ``kind`` wrong (and, for ``corrupt_data``, a byte of the chunk's
    data flipped first, so the zlib stream's own checksum fails as well)."""
    pos = 8
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        if png[pos + 4:pos + 8] == kind:
            body = bytearray(png[pos + 8:pos + 8 + length])
            if corrupt_data:
                body[len(body) // 2] ^= 0xFF
            crc = struct.pack(">I", (zlib.crc32(kind + bytes(body)) ^ 0x5A5A5A5A) & 0xFFFFFFFF)
            return png[:pos + 8] + bytes(body) + crc + png[pos + 12 + length:]
        pos += 12 + length
    raise AssertionError(f"no {kind!r} chunk")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "corrupt", "exception_type", "message"), [
    (b"IDAT", True, "OSError", "broken data stream when reading image file\n"),
    (b"IHDR", False, "PIL.UnidentifiedImageError", "cannot identify image file '{path}'\n"),
])
def test_a_damaged_png_fails_its_prompt_with_execution_error_and_the_next_prompt_runs(
        tmp_path: Path, kind: bytes, corrupt: bool, exception_type: str, message: str) -> None:
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fc:
        (Path(fc.options.input_dir) / "damaged.png").write_bytes(with_bad_crc(random_png(3), kind, corrupt))
        error = error_of(run(fc, LOAD_SAVE))
        assert set(error) == recorded_error_keys() | {"timestamp"}
        assert (error["node_id"], error["node_type"], error["executed"]) == ("1", "LoadImage", [])
        assert error["exception_type"] == exception_type
        assert error["exception_message"] == message.format(path=Path(fc.options.input_dir) / "damaged.png")
        assert isinstance(error["traceback"], list) and error["current_inputs"] == {"image": ["damaged.png"]}
        assert run(fc, trivial(7))["status"]["status_str"] == "success", "the fake moved on to the next prompt"


@pytest.mark.timeout(60)
def test_any_exception_of_a_node_is_reported_as_comfyui_reports_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_comfy import t2i

    async def broken(node_id: str, inputs: dict[str, Any], run: Any) -> Any:
        raise KeyError("samples")

    monkeypatch.setitem(t2i.NODES, "EmptyLatentImage", broken)
    prompt = json.loads((DATA / "workflows" / "t2i_sd15.json").read_text())
    with FakeComfy(base_directory=tmp_path, node_ms=1, step_ms=0) as fc:
        error = error_of(run(fc, prompt))
        assert (error["node_id"], error["node_type"]) == ("5", "EmptyLatentImage")
        assert (error["exception_type"], error["exception_message"]) == ("KeyError", "'samples'\n")
        assert error["current_inputs"] == {"width": [512], "height": [512], "batch_size": [1]}
        assert error["traceback"] and all(isinstance(line, str) for line in error["traceback"])
        assert error["current_outputs"] == list(prompt)
        assert run(fc, trivial(9))["status"]["status_str"] == "success"
