"""The official client, comfy-sdk, through every public method it has, against comfysup over the fake
ComfyUI (a real runner in a thread, the API in another): run, submit, wait, events, get_outputs, to_bytes /
to_file / ranges, assets from a file, from bytes and by hash, cancel, list with filters and cursors; outputs as
assets a later job names; a failed job's node error; ``outputs_reused``; and the README's own example, as
written, with the default ``filename_prefix`` and two save nodes."""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from comfy_low.models import Asset as AssetModel
from comfy_low.models import Job as JobModel
from comfy_sdk import Comfy, OutputReady, Preview, Progress, StatusChange
from comfy_sdk.exceptions import ComfyError, JobFailed

from comfysup.config import Config
from fake_comfy import FakeComfy
from fake_comfy.uploads import decode_png
from tests.api_support import api_config, running_api
from tests.input_images import INVERT, expected_inverse, random_png

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "examples" / "workflows"
T2I = json.loads((WORKFLOWS / "t2i_sd15.json").read_text())
CHECKPOINT = "v1-5-pruned-emaonly.safetensors"


class ClaimGate:
    """The runner's ``may_claim``: open, or shut. ``shut`` returns once the runner has asked again, so no turn
    it let through before (asked, then on its way to a claim) can still take a job submitted after it."""

    def __init__(self) -> None:
        self._open = True
        self._asks = 0
        self._asked = threading.Condition()

    def __call__(self) -> bool:
        with self._asked:
            self._asks += 1
            self._asked.notify_all()
            return self._open

    def shut(self, seconds: float = 10.0) -> None:
        with self._asked:
            self._open = False
            before = self._asks
            assert self._asked.wait_for(lambda: self._asks > before, seconds), "the runner did not ask to claim"

    def open(self) -> None:
        with self._asked:
            self._open = True


class Stack:
    """The fake ComfyUI, the API, and a runner in a thread that claims only while ``claiming`` is open."""

    def __init__(self, tmp: Path, token: str = "") -> None:
        self.tmp = tmp
        self.fake = FakeComfy(base_directory=tmp / "fake", node_ms=1, step_ms=1,
                              models=f"checkpoints={CHECKPOINT}")
        self.claiming = ClaimGate()
        self.config: Config = api_config(tmp, sections={"runner": {
            "attempts": 1, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
            "timeout_seconds": 20.0, "poll_seconds": 0.2, "lease_seconds": 10.0, "heartbeat_seconds": 0.5,
            "http_timeout_seconds": 5.0}}, token=token)

    @property
    def fake_inputs(self) -> Path:
        return Path(self.fake.input_directory) / "comfysup"


TOKEN = "t0ken-of-the-fleet-31"


@pytest.fixture(params=[""])
def stack(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The stack on a loopback API; ``params`` (indirect): its [api] token, which COMFY_API_KEY then carries, and
    COMFY_BASE_URL names the API as localhost (the Host check lets loopback names through)."""
    from comfysup.runner.loop import Runner
    from comfysup.runner.options import RunnerHooks

    s = Stack(tmp_path, token=request.param)
    s.fake.start()
    try:
        with running_api(s.config) as url:
            monkeypatch.setenv("COMFY_BASE_URL", url.replace("127.0.0.1", "localhost") if request.param else url)
            if request.param:
                monkeypatch.setenv("COMFY_API_KEY", request.param)
            else:
                monkeypatch.delenv("COMFY_API_KEY", raising=False)
            runner = Runner(s.config, "cpu0", s.fake.url, hooks=RunnerHooks(may_claim=s.claiming))
            thread = threading.Thread(target=runner.run, name="runner-under-test", daemon=True)
            thread.start()
            try:
                yield s
            finally:
                runner.state.stopping = True
                thread.join(20)
    finally:
        s.fake.stop()


def readme_workflow(prefix: str = "ComfyUI") -> dict[str, Any]:
    """The README's ``workflow_api.json``: text to image (node 6 the prompt, 9 its SaveImage) and a photo (node 10)
    inverted into a second SaveImage (12), both savers with ComfyUI's default ``filename_prefix``."""
    graph = copy.deepcopy(T2I)
    graph["3"]["inputs"]["steps"] = 3
    graph["5"]["inputs"].update(width=64, height=64)
    graph["9"]["inputs"]["filename_prefix"] = prefix
    graph["10"] = {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}}
    graph["11"] = {"class_type": "ImageInvert", "inputs": {"image": ["10", 0]}}
    graph["12"] = {"class_type": "SaveImage", "inputs": {"images": ["11", 0], "filename_prefix": prefix}}
    return graph


@pytest.mark.usefixtures("comfyui_version")  # both versions of the fake
@pytest.mark.timeout(60)
def test_the_readme_example_runs_as_written_with_the_default_prefix_and_two_save_nodes(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(stack.tmp)
    (stack.tmp / "workflow_api.json").write_text(json.dumps(readme_workflow()))
    photo = random_png(31)
    (stack.tmp / "photo.png").write_bytes(photo)

    # README.md, "Comfy API v2", as written:
    with Comfy() as client:                      # COMFY_BASE_URL=http://127.0.0.1:9189 → comfysup
        workflow = client.workflows.from_file("workflow_api.json")
        workflow.set_input("6", "text", "a lighthouse at dusk")
        workflow.set_input("10", "image", client.assets.from_file("photo.png"))  # uploaded once per content
        job = client.run(workflow)               # durable before the answer, run exactly once
        for output in job.get_outputs("9"):
            open(output.name, "wb").write(output.to_bytes())  # noqa: SIM115 (as the README writes it)

        [rendered] = job.get_outputs("9")
        [inverted] = job.get_outputs("12")
        pixels = decode_png(inverted.to_bytes())[3]
    assert len(job.outputs) == 2 and rendered.name != inverted.name
    assert (rendered.node_id, inverted.node_id) == ("9", "12")
    assert rendered.name.startswith("ComfyUI_") and inverted.name.startswith("ComfyUI_")
    assert decode_png((stack.tmp / rendered.name).read_bytes())[:2] == (64, 64)  # written by the README's loop
    assert list(pixels) == [expected_inverse(v) for v in decode_png(photo)[3]]
    assert job.get_outputs("3") == [] and job.get_outputs("nope") == []


@pytest.mark.usefixtures("comfyui_version")  # both versions of the fake
@pytest.mark.timeout(60)
def test_submit_wait_events_outputs_and_ranges(stack: Stack, tmp_path: Path) -> None:
    with Comfy() as client:
        stack.claiming.shut()
        workflow = client.workflows.from_json(readme_workflow("render/frame"))
        workflow.set_input("10", "image", client.assets.from_bytes(random_png(1), filename="a.png"))
        job = client.submit(workflow, metadata={"suite": "sdk"})
        assert job.status == "queued" and job.metadata == {"suite": "sdk"}
        stack.claiming.open()
        seen = list(job.events())
        assert isinstance(seen[0], StatusChange)
        assert any(isinstance(e, Progress) for e in seen)
        ready = [e.output for e in seen if isinstance(e, OutputReady)]
        assert sorted(o.node_id for o in ready) == ["12", "9"]
        assert isinstance(seen[-1], StatusChange) and seen[-1].status == "succeeded"
        job.wait(timeout=30)
        assert job.status == "succeeded"
        again = client.jobs.get(job.id)
        [output] = again.get_outputs("9")
        assert output.id == next(o.id for o in ready if o.node_id == "9")  # the same asset, stable
        data = output.to_bytes()
        assert output.size_bytes == len(data) and output.content_type == "image/png" and output.type == "image"
        assert output.to_bytes(range=(1, 3)) == data[1:4]
        assert output.to_file(tmp_path / "x.png").read_bytes() == data
        url = output.get_download_url().url
        assert url.startswith(f"{client_base()}/api/v2/assets/{output.id}/content")
        body = httpx.get(f"{client_base()}/api/v2/jobs/{job.id}").json()
        model = JobModel.model_validate(body)
        assert [o.node_id for o in model.outputs] == ["9", "12"] or [o.node_id for o in model.outputs] == ["12", "9"]
        nine = next(o for o in body["outputs"] if o["node_id"] == "9")
        assert (nine["subfolder"], nine["filename"]) == ("render", nine["name"])  # the prefix's folder
        assert str(model.urls.self).startswith("http://")
        asset = AssetModel.model_validate(httpx.get(f"{client_base()}/api/v2/assets/{output.id}").json())
        assert asset.job_id == job.id and asset.size_bytes == len(data)
        assert job.get_workflow().graph["9"]["inputs"]["filename_prefix"] == "render/frame"


def client_base() -> str:
    import os

    return os.environ["COMFY_BASE_URL"]


@pytest.mark.timeout(60)
def test_an_output_is_an_asset_a_later_job_names_without_a_download(stack: Stack) -> None:
    """LoadImage → ImageInvert → SaveImage twice: the second job's input is the first job's output, by its id."""
    photo = random_png(7)
    with Comfy() as client:
        first = client.workflows.from_json(copy.deepcopy(INVERT))
        first.set_input("1", "image", client.assets.from_bytes(photo, filename="p.png"))
        [inverted] = client.run(first, timeout=30).get_outputs("3")
        second = client.workflows.from_json(copy.deepcopy(INVERT))
        second.set_input("1", "image", client.assets.get(inverted.id))  # an output, by its asset id
        [back] = client.run(second, timeout=30).get_outputs("3")
        with pytest.raises(ComfyError, match="removed with its job") as refused:
            client.assets.delete(inverted.id)  # an output goes with its job, not by DELETE
        assert refused.value.code == "forbidden"
        pixels = decode_png(back.to_bytes())[3]
    assert list(pixels) == [expected_inverse(expected_inverse(v)) for v in decode_png(photo)[3]]
    assert len(list(stack.fake_inputs.iterdir())) == 2  # the photo, then the first job's output, as inputs


@pytest.mark.timeout(60)
def test_assets_by_hash_cancel_and_lists_with_filters_and_cursors(stack: Stack) -> None:
    data = random_png(3)
    with Comfy() as client:
        one = client.assets.from_bytes(data, filename="same.png")
        one.commit()
        two = client.assets.from_bytes(data, filename="same.png")
        two.commit()  # HEAD by-hash finds the content: from-hash mints, nothing is uploaded again
        assert one.hash == two.hash and two.created_new is False
        stack.claiming.shut()
        jobs = []
        for n in range(3):
            workflow = client.workflows.from_json(copy.deepcopy(INVERT))
            workflow.set_input("1", "image", two)
            jobs.append(client.submit(workflow, metadata={"batch": "b1", "n": str(n)}))
        other = client.workflows.from_json(copy.deepcopy(INVERT))
        other.set_input("1", "image", one)
        client.submit(other, metadata={"batch": "b2"})
        cancelled = jobs[0].cancel()
        assert cancelled.status == "canceled"
        listed = list(client.list_jobs(metadata={"batch": "b1"}, limit=1))  # one a page: cursors followed
        assert [s.id for s in listed] == [j.id for j in reversed(jobs)]
        assert {s.status for s in listed} == {"queued", "canceled"}
        assert len(list(client.list_jobs(limit=2))) == 4
        stack.claiming.open()
        for job in jobs[1:]:
            assert job.wait(timeout=30).status == "succeeded"


@pytest.mark.usefixtures("comfyui_version")  # both versions of the fake
@pytest.mark.timeout(60)
def test_a_failed_jobs_error_names_the_node_its_class_and_the_traceback(stack: Stack) -> None:
    with Comfy() as client:
        workflow = client.workflows.from_file(WORKFLOWS / "error_image_to_mask.json")
        with pytest.raises(JobFailed) as failed:
            client.run(workflow, timeout=30)
    error = failed.value.error
    assert error is not None and error.code == "node_execution_error"
    assert (error.node_id, error.class_type) == ("2", "ImageToMask")
    assert error.traceback and "Traceback" not in error.message and "ImageToMask" in error.message


@pytest.mark.usefixtures("comfyui_version")  # both versions of the fake
@pytest.mark.timeout(60)
def test_outputs_reused_when_comfyui_served_nodes_from_its_cache(stack: Stack) -> None:
    graph = json.loads((WORKFLOWS / "trivial.json").read_text())
    with Comfy() as client:
        first = client.run(client.workflows.from_json(copy.deepcopy(graph)), timeout=30)
        second = client.run(client.workflows.from_json(copy.deepcopy(graph)), timeout=30)
        assert second.get_outputs("3")[0].to_bytes().startswith(b"\x89PNG")  # its files are still its own
    reused = [httpx.get(f"{client_base()}/api/v2/jobs/{j.id}").json()["outputs_reused"] for j in (first, second)]
    assert reused == [False, True]
    assert str(uuid.UUID(second.get_outputs("3")[0].id)) != first.get_outputs("3")[0].id


@pytest.mark.timeout(60)
def test_a_node_errors_text_has_the_jobs_secrets_masked(stack: Stack) -> None:
    """ComfyUI's message and traceback name what the node was given: a secret of the job's extra_data among it is
    masked in the job's error, as in its reason."""
    secret = "sk-canary-31b-3f9a7c"
    graph = json.loads((WORKFLOWS / "trivial.json").read_text())
    graph["3"]["inputs"]["filename_prefix"] = f"../{secret}/x"
    with Comfy() as client:
        job = client.submit(client.workflows.from_json(graph), api_key=secret)
        job.wait(timeout=30)
    body = httpx.get(f"{client_base()}/api/v2/jobs/{job.id}").json()
    assert body["status"] == "failed" and body["error"]["node_id"] == "3", body["error"]
    assert secret not in json.dumps(body)
    assert "full_output_folder: " in body["error"]["exception_message"]  # ComfyUI's own text, whole
    assert "/fake/***\n" in body["error"]["exception_message"]  # the folder it named: the secret, masked


PREVIEWING = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": 9}},
    "2": {"class_type": "ComfysupProgressDemo", "inputs": {"image": ["1", 0], "steps": 8, "step_seconds": 0.25}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "preview"}},
}


@pytest.mark.usefixtures("comfyui_version")  # both versions of the fake
@pytest.mark.timeout(60)
def test_previews_reach_job_events_as_the_contracts_preview(stack: Stack) -> None:
    """The fake sends a JPEG preview at every step (as a sampler does); the runner writes the newest at most every
    [runner] preview_seconds, and job.events() gets them as Preview events of node 2 while the job runs."""
    with Comfy() as client:
        job = client.submit(client.workflows.from_json(copy.deepcopy(PREVIEWING)))
        seen = list(job.events())
    previews = [e for e in seen if isinstance(e, Preview)]
    assert previews, [type(e).__name__ for e in seen]
    assert all(p.node_id == "2" and p.content_type == "image/jpeg" and p.data.startswith(b"\xff\xd8")
               for p in previews)
    assert isinstance(seen[-1], StatusChange) and seen[-1].status == "succeeded"
    assert len(previews) <= 4  # 2 s of steps, one written a second at most: never one a step


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stack", [TOKEN], indirect=True)
def test_with_a_token_the_absolute_links_lead_back_to_the_name_the_client_used(stack: Stack) -> None:
    """comfy-sdk sends its token only to its own base_url's origin, and follows job.urls (refresh, events, cancel):
    links built from the bound address (127.0.0.1) would get no token from a client of localhost."""
    with Comfy() as client:
        job = client.submit(client.workflows.from_json(json.loads((WORKFLOWS / "trivial.json").read_text())))
        assert str(job._model.urls.self).startswith(f"{client_base()}/api/v2/jobs/")
        assert [e for e in job.events() if isinstance(e, StatusChange)][-1].status == "succeeded"
        assert job.refresh().status == "succeeded" and job.cancel().status == "succeeded"
        assert job.get_outputs("3")[0].to_bytes().startswith(b"\x89PNG")
    assert httpx.get(f"{client_base()}/api/v2/jobs/{job.id}").status_code == 401


@pytest.mark.timeout(60)
def test_the_async_client_and_the_other_sources_and_sinks(stack: Stack, tmp_path: Path) -> None:
    """AsyncComfy: submit, events, wait, outputs to bytes and to a stream; assets from a stream and from a URL (an
    earlier job's output URL, downloaded by the client and uploaded: its content, stored once however often)."""
    import asyncio
    import io

    from comfy_sdk import AsyncComfy

    async def go() -> tuple[bytes, list[str]]:
        async with AsyncComfy() as client:
            workflow = client.workflows.from_json(copy.deepcopy(INVERT))
            workflow.set_input("1", "image", client.assets.from_stream(io.BytesIO(random_png(11)), filename="s.png"))
            job = await client.submit(workflow)
            kinds = [type(e).__name__ async for e in job.events()]
            await job.wait(timeout=30)
            [output] = job.get_outputs("3")
            sink = io.BytesIO()
            assert await output.to_stream(sink) == output.size_bytes
            return await output.to_bytes(), kinds

    data, kinds = asyncio.run(go())
    assert data.startswith(b"\x89PNG") and kinds[-1] == "StatusChange" and "OutputReady" in kinds
    with Comfy() as client:
        [first] = client.jobs.get(client.list_jobs(limit=1).__next__().id).get_outputs("3")
        fetched = client.assets.from_url(first.get_download_url().url)
        fetched.commit()
        again = client.assets.from_url(first.get_download_url().url)
        again.commit()
        assert fetched.hash == again.hash == client.assets.from_bytes(first.to_bytes()).hash
        assert (fetched.created_new, again.created_new) == (True, False)


@pytest.mark.timeout(60)
def test_a_running_job_is_cancelled_and_its_events_say_so(stack: Stack) -> None:
    graph = copy.deepcopy(PREVIEWING)
    graph["2"]["inputs"].update(steps=100, step_seconds=0.2)  # 20 s unless cancelled
    with Comfy() as client:
        job = client.submit(client.workflows.from_json(graph))
        asked, statuses = "", []
        for event in job.events():
            if isinstance(event, Progress) and not asked:
                asked = job.cancel().status  # running: canceling until its runner interrupts it
            if isinstance(event, StatusChange):
                statuses.append(event.status)
        assert job.wait(timeout=30).status == "canceled", (job.error, statuses)
    assert asked in ("canceling", "canceled") and statuses[-1] == "canceled", (asked, statuses)
