"""fake_comfy's input files against the recording (tests/recorded/uploads.json): POST /upload/image's naming,
dedup, overwrite, types and traversal; LoadImage / LoadImageMask reading the uploaded file; the recorded
workflows' pixels (ComfyUI's float32 truncation)."""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path

import pytest
import requests

from fake_comfy import FakeComfy
from fake_comfy.uploads import decode_png
from tests.input_images import expected_inverse, random_png

RECORDED = Path(__file__).resolve().parents[1] / "recorded"  # tests/recorded: refresh it with tests/recorded/refresh
UPLOADS = json.loads((RECORDED / "uploads.json").read_text())
FILES = UPLOADS["generated_input_files"]["files"]
REC_PNG = base64.b64decode(FILES["A (rec.png first upload, seed 1)"]["base64"])
RGBA_PNG = base64.b64decode(FILES["rgba.png"]["base64"])


def upload(fc: FakeComfy, name: str, data: bytes, **fields: str) -> requests.Response:
    return requests.post(f"{fc.url}/upload/image", files={"image": (name, data, "image/png")}, data=fields, timeout=5)


def run(fc: FakeComfy, prompt: dict) -> dict:
    prompt_id = str(uuid.uuid4())
    answer = requests.post(f"{fc.url}/prompt", json={"prompt": prompt, "prompt_id": prompt_id}, timeout=5)
    assert answer.status_code == 200, answer.text
    end = time.monotonic() + 10
    while time.monotonic() < end:
        entry = requests.get(f"{fc.url}/history/{prompt_id}", timeout=5).json().get(prompt_id)
        if entry:
            return entry
        time.sleep(0.02)
    raise AssertionError("no history")


@pytest.mark.timeout(30)
def test_upload_naming_dedup_and_overwrite_as_recorded(tmp_path: Path) -> None:
    other = REC_PNG[:-1] + b"\x00"
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fc:
        assert upload(fc, "rec.png", REC_PNG).json() == {"name": "rec.png", "subfolder": "", "type": "input"}
        assert upload(fc, "rec.png", REC_PNG, subfolder="comfysup", overwrite="true").json()["name"] == "rec.png"
        assert upload(fc, "rec.png", other, subfolder="comfysup").json()["name"] == "rec (1).png"
        assert upload(fc, "rec.png", other, subfolder="comfysup").json()["name"] == "rec (1).png"  # dedup
        third = upload(fc, "rec.png", other + b"x", subfolder="comfysup", overwrite="True")
        assert third.json()["name"] == "rec (2).png"
        assert upload(fc, "rec.png", other, subfolder="comfysup", overwrite="1").json()["name"] == "rec.png"
        assert (Path(fc.input_directory) / "comfysup" / "rec.png").read_bytes() == other
        assert upload(fc, "t.png", REC_PNG, type="temp").json() == {"name": "t.png", "subfolder": "", "type": "temp"}
        assert upload(fc, "b.png", REC_PNG, type="bogus").status_code == 500
        assert upload(fc, "../escape.png", REC_PNG).status_code == 400
        assert upload(fc, "x.png", REC_PNG, subfolder="../output").status_code == 400
        assert requests.post(f"{fc.url}/upload/image", data={"subfolder": "a"}, timeout=5).status_code == 400
        assert requests.post(f"{fc.url}/upload/image", data=b"", timeout=5).status_code == 400
        choices = requests.get(f"{fc.url}/object_info/LoadImage", timeout=5).json()["LoadImage"]
        assert choices["input"]["required"]["image"][0] == ["rec.png"]  # top-level files only


@pytest.mark.timeout(30)
def test_load_image_invert_save_pixels_follow_comfyui_float32(tmp_path: Path) -> None:
    workflow = json.loads((RECORDED / "workflows" / "load_image_invert.json").read_text())
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fc:
        assert upload(fc, "rec.png", REC_PNG, subfolder="comfysup").status_code == 200
        entry = run(fc, workflow)
        (images,) = [o["images"] for o in entry["outputs"].values()]
        out = requests.get(f"{fc.url}/view", params=images[0], timeout=5).content
    w, h, c, inverted = decode_png(out)
    w0, h0, _c0, original = decode_png(REC_PNG)
    assert (w, h, c) == (w0, h0, 3) == (16, 16, 3)
    assert list(inverted) == [expected_inverse(v) for v in original]
    assert sum(a == 255 - b for a, b in zip(inverted, original, strict=True)) not in (0, len(original))


@pytest.mark.timeout(30)
def test_a_missing_or_unprefixed_file_fails_validation_as_recorded(tmp_path: Path) -> None:
    workflow = json.loads((RECORDED / "workflows" / "load_image_invert.json").read_text())
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fc:
        upload(fc, "rec.png", REC_PNG, subfolder="comfysup")
        workflow["1"]["inputs"]["image"] = "rec.png"
        answer = requests.post(f"{fc.url}/prompt", json={"prompt": workflow}, timeout=5)
    assert answer.status_code == 400
    (error,) = answer.json()["node_errors"]["1"]["errors"]
    assert error["type"] == "custom_validation_failed"
    assert error["details"] == "image - Invalid image file: rec.png"


@pytest.mark.timeout(30)
def test_load_image_mask_alpha_is_inverted_as_recorded(tmp_path: Path) -> None:
    workflow = json.loads((RECORDED / "workflows" / "load_image_mask.json").read_text())
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fc:
        upload(fc, "rgba.png", RGBA_PNG, subfolder="comfysup")
        entry = run(fc, workflow)
        (images,) = [o["images"] for o in entry["outputs"].values()]
        out = requests.get(f"{fc.url}/view", params=images[0], timeout=5).content
    _w, _h, _c, pixels = decode_png(out)
    _w, _h, _c, rgba = decode_png(RGBA_PNG)
    alphas = rgba[3::4]
    assert list(pixels[0::3]) == [expected_inverse(a) for a in alphas]


def mask_png(width: int, height: int, alphas: list[int]) -> bytes:
    """An RGBA mask as the mask editor uploads it: black, the mask in its alpha."""
    from fake_comfy.uploads import rgba_png

    return rgba_png(width, height, b"".join(bytes((0, 0, 0, a)) for a in alphas), {})


def upload_mask(fc: FakeComfy, name: str, data: bytes, **fields: str) -> requests.Response:
    return requests.post(f"{fc.url}/upload/mask", files={"image": (name, data, "image/png")}, data=fields, timeout=5)


@pytest.mark.timeout(30)
def test_upload_mask_composites_the_mask_into_the_alpha_of_the_original(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fake:
        mask_checks(fake)


def mask_checks(fake: FakeComfy) -> None:
    """As recorded (uploads.json upload_mask): the original named by original_ref, RGBA, its alpha the mask's,
    written under the uploaded name in the form's subfolder; the same mask again is renamed; a missing
    original or one named with '..' answers 200 and writes nothing; no original_ref is a 500."""
    original = random_png(5, 16, 16)
    assert upload(fake, "rec.png", original, subfolder="comfysup").status_code == 200
    alphas = [(7 * i) % 256 for i in range(16 * 16)]
    ref = json.dumps({"filename": "rec.png", "subfolder": "comfysup", "type": "input"})
    answer = upload_mask(fake, "clipspace-mask-1.png", mask_png(16, 16, alphas), original_ref=ref,
                         type="input", subfolder="clipspace")
    assert answer.status_code == 200
    assert answer.json() == {"name": "clipspace-mask-1.png", "subfolder": "clipspace", "type": "input"}
    written = Path(fake.input_directory) / "clipspace" / "clipspace-mask-1.png"
    width, height, channels, samples = decode_png(written.read_bytes())
    _w, _h, _c, rgb = decode_png(original)
    assert (width, height, channels) == (16, 16, 4)
    assert bytes(b for i, b in enumerate(samples) if i % 4 != 3) == rgb  # the original's colours
    assert list(samples[3::4]) == alphas  # the mask's alpha
    again = upload_mask(fake, "clipspace-mask-1.png", mask_png(16, 16, alphas), original_ref=ref,
                        type="input", subfolder="clipspace")
    assert again.json()["name"] == "clipspace-mask-1 (1).png"  # compared with the composite: renamed
    for n, bad in enumerate(({"filename": "nope.png", "subfolder": "comfysup", "type": "input"},
                             {"filename": "../input/rec.png", "type": "input"}), start=3):
        answer = upload_mask(fake, f"clipspace-mask-{n}.png", mask_png(16, 16, alphas), original_ref=json.dumps(bad),
                             type="input", subfolder="clipspace")
        assert answer.status_code == 200 and answer.json()["name"] == f"clipspace-mask-{n}.png"
        assert not (Path(fake.input_directory) / "clipspace" / f"clipspace-mask-{n}.png").exists()
    absent = upload_mask(fake, "clipspace-mask-5.png", mask_png(16, 16, alphas), type="input", subfolder="clipspace")
    assert absent.status_code == 500
    # A composite LoadImageMask reads: its alpha channel is the mask, inverted as ComfyUI does.
    prompt = {"1": {"class_type": "LoadImageMask", "inputs": {"image": "clipspace/clipspace-mask-1.png",
                                                            "channel": "alpha"}},
              "2": {"class_type": "MaskToImage", "inputs": {"mask": ["1", 0]}},
              "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "m"}}}
    entry = run(fake, prompt)
    (image,) = entry["outputs"]["3"]["images"]
    _w, _h, _c, pixels = decode_png((Path(fake.output_directory) / image["subfolder"] / image["filename"]).read_bytes())
    assert list(pixels[0::3]) == [expected_inverse(a) for a in alphas]
