"""``comfysup run`` supervising a real ComfyUI 0.3.64 on the CPU, driven through the Comfy API v2 with the official
SDK (comfy-sdk), as a user of Comfy Cloud's API would drive it (the evidence that the API works on a real
ComfyUI, not only on fake_comfy).

Opt-in like the rest of the real tier: COMFYUI_DIR names a ComfyUI checkout that runs with --cpu and
COMFYUI_PYTHON the Python of its environment (docs/comfyui-versions.md, "A real ComfyUI on the CPU", says how to
set one up). One ``comfysup run`` with one CPU server serves the whole module (a real ComfyUI takes ~10 s to
start); every workflow here is model-free and runs in milliseconds.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from comfy_sdk import Comfy
from comfy_sdk.events import OutputReady, StatusChange
from comfy_sdk.exceptions import JobFailed

from fake_comfy.uploads import decode_png
from tests.input_images import INVERT, expected_inverse, random_png
from tests.port_support import server_port
from tests.supervisor_support import Supervised, wait_for

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = [pytest.mark.comfyui,
              pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout that runs with --cpu")]
ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "examples" / "workflows"
RUN_SECONDS = 60.0
"""A job's whole run through the API: milliseconds of ComfyUI, plus the runner's poll and the SDK's backoff."""


class Real:
    """The running ``comfysup run`` and its API's address."""

    def __init__(self, sup: Supervised, url: str) -> None:
        self.sup, self.url = sup, url

    def comfyui_url(self) -> str:
        """The supervised ComfyUI's own address (from the supervisor's state), to read what it answered."""
        state = self.sup.state()
        assert state is not None
        [slot] = state["slots"]
        return str(slot["url"])


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Real]:
    """``comfysup run`` with ``[comfyui] main`` = the checkout's main.py, its Python, one CPU server and the API."""
    assert COMFYUI_DIR
    port = server_port()
    sup = Supervised(
        tmp_path_factory.mktemp("real_api"),
        comfyui={"main": str(Path(COMFYUI_DIR) / "main.py"), "gpus": "cpu:1", "extra_args": [],
                 "python": os.environ.get("COMFYUI_PYTHON", sys.executable), "startup_seconds": 120.0},
        runner={"timeout_seconds": 120.0},
        extra_sections={"api": {"listen": f"127.0.0.1:{port}"}})
    url = f"http://127.0.0.1:{port}"
    try:
        proc = sup.start()
        sup.wait_ready(proc, 150)
        sup.wait_api(url)
        yield Real(sup, url)
        assert sup.stop(proc, 60) == 0, sup.describe()
    finally:
        sup.cleanup()


@pytest.fixture
def client(real: Real, monkeypatch: pytest.MonkeyPatch) -> Iterator[Comfy]:
    monkeypatch.setenv("COMFY_BASE_URL", real.url)
    monkeypatch.delenv("COMFY_API_KEY", raising=False)
    with Comfy() as sdk:
        yield sdk


def _fresh(name: str) -> dict[str, Any]:
    """A model-free workflow whose EmptyImage colour is new, so ComfyUI's cache never serves it."""
    graph: dict[str, Any] = json.loads((WORKFLOWS / name).read_text())
    graph["1"]["inputs"]["color"] = uuid.uuid4().int % 16777216
    return graph


def _job(real: Real, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{real.url}/api/v2/jobs/{job_id}", timeout=5).json()
    return body


def _stored(real: Real, job_id: str) -> dict[str, tuple[str, str]]:
    """The job's stored files as the queue has them: name → (node that made it, sha256 of the file on disk)."""
    record = real.sup.jobs([job_id])[job_id]
    assert record.state == "done", real.sup.describe()
    out = {}
    for item in record.outputs:
        data = Path(item.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == item.sha256 and len(data) == item.size
        out[item.name] = (item.node_id, item.sha256)
    return out


@pytest.mark.timeout(300)
def test_the_readme_example_on_a_real_comfyui(real: Real, client: Comfy) -> None:
    """run / submit / wait / get_outputs / to_bytes with ComfyUI's default ``filename_prefix``, then with two save
    nodes sharing it: each node's get_outputs has that node's own file (the first difference)."""
    graph = _fresh("trivial.json")
    graph["3"]["inputs"]["filename_prefix"] = "ComfyUI"
    job = client.run(client.workflows.from_json(graph), timeout=RUN_SECONDS)
    [output] = job.get_outputs("3")
    image = output.to_bytes()
    assert image.startswith(b"\x89PNG") and output.content_type == "image/png"
    assert _stored(real, job.id) == {output.name: ("3", hashlib.sha256(image).hexdigest())}

    two = copy.deepcopy(graph)
    two["1"]["inputs"]["color"] = (graph["1"]["inputs"]["color"] + 1) % 16777216
    two["9"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "ComfyUI"}}
    submitted = client.submit(client.workflows.from_json(two))
    assert submitted.wait(timeout=RUN_SECONDS).status == "succeeded", _job(real, submitted.id)
    inverted, plain = submitted.get_outputs("3"), submitted.get_outputs("9")
    assert len(inverted) == 1 and len(plain) == 1, _job(real, submitted.id)
    assert inverted[0].to_bytes() != plain[0].to_bytes()  # the image, and its inverse
    assert {node for node, _ in _stored(real, submitted.id).values()} == {"3", "9"}


@pytest.mark.timeout(300)
def test_an_animated_webp_and_a_webm_of_a_generated_batch(real: Real, client: Comfy) -> None:
    """SaveAnimatedWEBP (and SaveWEBM) of an EmptyImage batch (no model): ComfyUI files each under ``images`` with
    ``animated`` beside it; comfysup downloads them whole, hashes and stores them, and serves them as image/webp and
    video/webm."""
    graph = {"1": {"class_type": "EmptyImage",
                   "inputs": {"width": 32, "height": 32, "batch_size": 4, "color": uuid.uuid4().int % 16777216}},
             "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
             "3": {"class_type": "ImageBatch", "inputs": {"image1": ["1", 0], "image2": ["2", 0]}},
             "4": {"class_type": "SaveAnimatedWEBP",
                   "inputs": {"images": ["3", 0], "filename_prefix": "ComfyUI", "fps": 4.0, "lossless": True,
                              "quality": 80, "method": "default"}},
             "5": {"class_type": "SaveWEBM",
                   "inputs": {"images": ["3", 0], "filename_prefix": "ComfyUI", "codec": "vp9", "fps": 4.0,
                              "crf": 32.0}}}
    job = client.run(client.workflows.from_json(graph), timeout=RUN_SECONDS)
    [output] = job.get_outputs("4")
    assert output.name.endswith(".webp") and output.content_type == "image/webp"
    data = output.to_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WEBP" and int.from_bytes(data[4:8], "little") + 8 == len(data)
    # An animation: libwebp merges equal neighbours, so the batch's 4 + 4 frames are its 2 distinct images.
    assert b"ANIM" in data[:64] and data.count(b"ANMF") >= 2
    # SaveWEBM of the same frames (PyAV's own libvpx): filed under `images` too, served as video/webm.
    [video] = job.get_outputs("5")
    movie = video.to_bytes()
    assert video.name.endswith(".webm") and video.content_type == "video/webm" and movie[:4] == b"\x1a\x45\xdf\xa3"
    assert _stored(real, job.id) == {output.name: ("4", hashlib.sha256(data).hexdigest()),
                                     video.name: ("5", hashlib.sha256(movie).hexdigest())}
    for listed in _job(real, job.id)["outputs"]:
        served = httpx.get(httpx.URL(real.url).join(listed["url"]), timeout=10)
        assert served.status_code == 200, listed
        assert served.headers["content-type"].split(";")[0] == {"4": "image/webp", "5": "video/webm"}[listed["node_id"]]
        assert served.content == {"4": data, "5": movie}[listed["node_id"]]


@pytest.mark.timeout(300)
def test_an_uploaded_input_is_inverted_and_the_events_tell_it(real: Real, client: Comfy, tmp_path: Path) -> None:
    """The SDK's README flow with an input: assets.from_file, a LoadImage naming it, submit and follow
    ``job.events()`` to the end. comfysup uploads the file to the real ComfyUI (POST /upload/image) before the
    prompt; every output pixel is the input's inverse in ComfyUI's float32 arithmetic."""
    photo = tmp_path / "photo.png"
    photo.write_bytes(random_png(uuid.uuid4().int % 1000))
    workflow = client.workflows.from_json(copy.deepcopy(INVERT))
    workflow.set_input("1", "image", client.assets.from_file(photo))
    job = client.submit(workflow)
    statuses, ready = [], []
    for event in job.events():
        match event:
            case StatusChange(status=status):
                statuses.append(status)
            case OutputReady(output=output):
                ready.append(output)
    # The stream reports the states it sees: a job of milliseconds may pass from queued to succeeded between two.
    assert statuses[-1] == "succeeded", statuses
    [output] = job.refresh().get_outputs("3")
    assert [o.id for o in ready] == [output.id]
    _w, _h, _c, inverted = decode_png(output.to_bytes())
    _w, _h, _c, original = decode_png(photo.read_bytes())
    assert list(inverted) == [expected_inverse(v) for v in original]


@pytest.mark.timeout(300)
def test_a_running_job_canceled_is_interrupted_on_the_real_server(real: Real, client: Comfy) -> None:
    """``job.cancel()`` while the real ComfyUI executes it (8 blurs of a 1024² image, ~3 s on 2 cores): the job ends
    ``canceled``, and the server's own history says it was interrupted, not run to the end."""
    graph = json.loads((ROOT / "tests" / "recorded" / "workflows" / "long.json").read_text())
    graph["1"]["inputs"]["color"] = uuid.uuid4().int % 16777216
    job = client.submit(client.workflows.from_json(graph))
    statuses = []
    for event in job.events():
        if isinstance(event, StatusChange):
            statuses.append(event.status)
            if event.status == "running":
                wait_for(lambda: real.sup.slot_running(job.id), 30, "the real server executing the job",
                         real.sup.describe)
                job.cancel()
    assert statuses[-1] == "canceled" and job.refresh().status == "canceled", statuses
    assert real.sup.jobs([job.id])[job.id].state == "cancelled"
    history = httpx.get(f"{real.comfyui_url()}/history/{job.id}", timeout=5).json()
    assert history, "the prompt never reached the server's history"
    messages = [name for name, _ in history[job.id]["status"]["messages"]]
    assert "execution_interrupted" in messages and history[job.id]["outputs"] == {}, messages


def _failing(real: Real, client: Comfy) -> tuple[JobFailed, dict[str, Any]]:
    """A workflow that passes validation and fails at run time on the real server (ImageToMask's alpha channel of
    an RGB image: an IndexError in node 2): the SDK's JobFailed, and the job as the API shows it."""
    job = client.submit(client.workflows.from_json(_fresh("error_image_to_mask.json")))
    job.wait(timeout=RUN_SECONDS)
    with pytest.raises(JobFailed) as failed:
        job.result()
    return failed.value, _job(real, job.id)


@pytest.mark.timeout(300)
def test_an_execution_error_fails_the_job(real: Real, client: Comfy) -> None:
    """The real server's execution_error ends the job at once (permanent: no retry), its reason naming the node,
    its class and the exception, as the SDK's JobFailed and the API's job show it."""
    failed, body = _failing(real, client)
    assert body["status"] == "failed", body
    record = real.sup.jobs([body["id"]])[body["id"]]
    assert record.state == "dead" and record.attempt == 1, real.sup.describe()
    assert record.reason.startswith("execution_error, node 2 (ImageToMask): IndexError:"), record.reason
    assert failed.error is not None and "IndexError" in failed.error.message and "ImageToMask" in failed.error.message


@pytest.mark.timeout(300)
def test_an_execution_error_carries_its_node_class_and_traceback(real: Real, client: Comfy) -> None:
    """The spec's JobError as comfy-sdk reads it: ``node_execution_error`` with the node, its class and ComfyUI's
    traceback (its frames end in the node's own code, comfy_extras/nodes_mask.py)."""
    failed, _ = _failing(real, client)
    error = failed.error
    assert error is not None
    assert error.code == "node_execution_error" and error.node_id == "2" and error.class_type == "ImageToMask"
    assert error.traceback and "nodes_mask.py" in error.traceback and "IndexError" in error.message
