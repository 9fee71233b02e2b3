"""the assets: ``/api/v2/assets`` uploads into the asset store and ``core/ASSET`` references resolved at
submit, driven by comfy-sdk as its README shows (``client.assets.from_file``, ``workflow.set_input(node, name,
asset)``, ``client.run``) and by raw requests shaped as the SDK's transport sends them; every body validated
against the SDK's generated models (comfy_low.models)."""

from __future__ import annotations

import copy
import os
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from comfy_low.models import Asset as AssetModel
from comfy_low.models import ErrorEnvelope
from comfy_low.models import Job as JobModel
from comfy_sdk import Comfy
from comfy_sdk.exceptions import ComfyError

from comfysup import assets
from comfysup.queue import open_queue
from fake_comfy import FakeComfy
from fake_comfy.uploads import decode_png
from tests.api_support import api_config, running_api, working
from tests.input_images import INVERT, expected_inverse, random_png
from tests.pg_support import pg_url  # noqa: F401
from tests.runner_helpers import comfysup
from tests.supervisor_support import wait_for

MIB = 1 << 20


def upload(url: str, data: bytes, name: str = "cat.png", **extra: Any) -> httpx.Response:
    """POST /api/v2/assets as comfy_low.transport.post_assets sends it (multipart; fields, then the file)."""
    headers = extra.pop("headers", {})
    fields = {"content_type": "image/png", "file_path": name, **extra}
    return httpx.post(f"{url}/api/v2/assets", data=fields, files={"file": (name, data, "image/png")},
                      headers=headers)


def envelope(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text
    return ErrorEnvelope.model_validate(answer.json()).error.code


def stored_files(config: Any) -> list[str]:
    """Everything in the asset folder (SQLite keeps it next to the queue), temporary files included."""
    folder = config.resolve(config.queue.path).parent / "assets"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.mark.timeout(60)
def test_the_readme_flow_uploads_the_input_and_the_job_names_it(api: Any, tmp_path: Path) -> None:
    url, runner, config = api
    photo = tmp_path / "photo.png"
    photo.write_bytes(random_png(1))
    stop = threading.Event()
    worker = working(runner, stop)
    try:
        with Comfy() as client:
            workflow = client.workflows.from_json(copy.deepcopy(INVERT))
            asset = client.assets.from_file(photo)
            workflow.set_input("1", "image", asset)
            job = client.run(workflow, timeout=30)
            assert job.status == "succeeded"
            assert asset.created_new is True and asset.hash == assets.hash_bytes(photo.read_bytes())
    finally:
        stop.set()
        worker.join(5)
    body = AssetModel.model_validate(httpx.get(f"{url}/api/v2/assets/{asset.id}").json())
    assert (body.size_bytes, body.file_path, body.job_id) == (photo.stat().st_size, "photo.png", None)
    assert body.expires_at is not None and body.expires_at > body.created_at
    assert httpx.get(str(body.url)).content == photo.read_bytes()
    record = runner.queue.reads.get(job.id)
    ref = record.params["1.image"]
    assert assets.ref_hash(ref) == asset.hash and assets.ref_name(ref) == "photo.png"
    assert runner.queue.assets.read_asset(asset.hash) == photo.read_bytes()
    assert stored_files(config) == [f"{asset.hash[7:9]}/{asset.hash[7:]}"]  # one copy, no temporary left


def test_the_same_content_is_stored_once_and_the_sdk_skips_the_second_upload(api: Any) -> None:
    url, runner, config = api
    data = random_png(2)
    first = upload(url, data)
    assert first.status_code == 201
    created = AssetModel.model_validate(first.json())
    assert created.created_new is True and created.hash == assets.hash_bytes(data)
    second = upload(url, data, name="same.png")
    assert second.status_code == 200
    deduped = AssetModel.model_validate(second.json())
    assert deduped.created_new is False and deduped.id != created.id and deduped.hash == created.hash
    posts: list[str] = []
    with Comfy() as client:
        client._low._client.event_hooks["request"].append(lambda r: posts.append(f"{r.method} {r.url.path}"))
        handle = client.assets.from_bytes(data, filename="again.png")
        handle.commit()
    assert posts == [f"HEAD /api/v2/assets/by-hash/{created.hash}", "POST /api/v2/assets/from-hash"]
    assert handle.created_new is False and handle.id not in (created.id, deduped.id)
    assert runner.queue.assets.asset_totals()["assets"] == 1 and len(stored_files(config)) == 1


def test_head_by_hash_and_from_hash(api: Any) -> None:
    url, _, _ = api
    data = b"bytes the store holds"
    digest = assets.hash_bytes(data)
    absent = assets.hash_bytes(b"bytes it never saw")
    assert httpx.head(f"{url}/api/v2/assets/by-hash/{digest}").status_code == 404
    assert httpx.head(f"{url}/api/v2/assets/by-hash/not-a-hash").status_code == 404
    assert envelope(httpx.post(f"{url}/api/v2/assets/from-hash", json={"hash": digest}), 404) == "blob_not_found"
    upload(url, data, name="a.txt")
    assert httpx.head(f"{url}/api/v2/assets/by-hash/{digest}").status_code == 200
    assert httpx.head(f"{url}/api/v2/assets/by-hash/{absent}").status_code == 404
    minted = httpx.post(f"{url}/api/v2/assets/from-hash", json={"hash": digest, "file_path": "b.txt"})
    assert minted.status_code == 201
    body = AssetModel.model_validate(minted.json())
    assert (body.hash, body.size_bytes, body.file_path, body.content_type) == (digest, len(data), "b.txt",
                                                                               "text/plain")
    again = httpx.post(f"{url}/api/v2/assets/from-hash", json={"hash": digest, "file_path": "b.txt"})
    assert again.status_code == 200 and again.json()["id"] == body.id
    assert envelope(httpx.post(f"{url}/api/v2/assets/from-hash", json={"hash": "md5:x"}), 400) == "invalid_request"


def test_ids_are_random_and_not_the_hash(api: Any) -> None:
    url, _, _ = api
    ids = [upload(url, b"same bytes").json()["id"] for _ in range(3)]
    assert len(set(ids)) == 3 and all(uuid.UUID(i).version == 4 for i in ids)
    digest = assets.hash_bytes(b"same bytes")
    assert envelope(httpx.get(f"{url}/api/v2/assets/{digest}"), 404) == "not_found"
    assert envelope(httpx.get(f"{url}/api/v2/assets/{uuid.uuid4()}/content"), 404) == "not_found"
    assert httpx.get(f"{url}/api/v2/assets/{ids[0]}/content").content == b"same bytes"


def test_content_with_range(api: Any) -> None:
    url, _, _ = api
    data = bytes(range(256)) * 9000  # two read chunks and more
    asset_id = upload(url, data, name="big.bin").json()["id"]
    whole = httpx.get(f"{url}/api/v2/assets/{asset_id}/content")
    assert whole.status_code == 200 and whole.content == data and whole.headers["Accept-Ranges"] == "bytes"
    part = httpx.get(f"{url}/api/v2/assets/{asset_id}/content", headers={"Range": "bytes=1048570-1048580"})
    assert part.status_code == 206 and part.content == data[1048570:1048581]
    assert part.headers["Content-Range"] == f"bytes 1048570-1048580/{len(data)}"
    tail = httpx.get(f"{url}/api/v2/assets/{asset_id}/content", headers={"Range": "bytes=-5"})
    assert tail.content == data[-5:]
    beyond = httpx.get(f"{url}/api/v2/assets/{asset_id}/content", headers={"Range": f"bytes={len(data)}-"})
    assert envelope(beyond, 416) == "range_not_satisfiable"
    with Comfy() as client, client._low.get_asset_content(asset_id, range=(3, 6)) as answer:  # the SDK's own
        assert answer.read() == data[3:7]

    # HEAD: the headers of a GET and no byte after them (a body there would be read as the next answer on a
    # kept-alive connection: another machine's API streaming from this one got 502s).
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(f"HEAD /api/v2/assets/{asset_id}/content HTTP/1.1\r\nHost: {host}\r\n"
                    "Connection: close\r\n\r\n".encode())
        answer = b""
        while chunk := raw.recv(65536):  # the server closes after its answer
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(data)}".encode() in head and body == b""


def test_uploads_past_the_limits_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    config = api_config(tmp_path, sections={"assets": {"max_file_mb": 1}}, max_upload_mb=2)
    with running_api(config) as url:
        # Content-Length over [api] max_upload_mb: refused before a byte is read.
        assert envelope(upload(url, os.urandom(3 * MIB)), 413) == "payload_too_large"

        def chunked() -> Any:  # no Content-Length: counted while it streams, past [assets] max_file_mb
            yield (b'--bb\r\nContent-Disposition: form-data; name="content_type"\r\n\r\nimage/png\r\n'
                   b'--bb\r\nContent-Disposition: form-data; name="file_path"\r\n\r\nx.png\r\n'
                   b'--bb\r\nContent-Disposition: form-data; name="file"; filename="x.png"\r\n\r\n')
            for _ in range(3):
                yield os.urandom(MIB // 2)
            yield b"\r\n--bb--\r\n"

        answer = httpx.post(f"{url}/api/v2/assets", content=chunked(),
                            headers={"Content-Type": "multipart/form-data; boundary=bb"})
        assert envelope(answer, 413) == "payload_too_large" and "max_file_mb" in answer.json()["error"]["message"]
        assert upload(url, os.urandom(MIB - 10)).status_code == 201  # under both limits
    queue = open_queue(config)
    try:
        assert queue.assets.asset_totals()["assets"] == 1
    finally:
        queue.close()
    assert len(stored_files(config)) == 1  # no temporary file of the refused uploads left


def test_an_upload_cut_off_midway_leaves_nothing(api: Any) -> None:
    """The client's connection drops after half the file: no record, no content, no temporary file; the API
    answers the next request."""
    url, runner, config = api
    head = (b'--bb\r\nContent-Disposition: form-data; name="content_type"\r\n\r\nimage/png\r\n'
            b'--bb\r\nContent-Disposition: form-data; name="file_path"\r\n\r\nx.png\r\n'
            b'--bb\r\nContent-Disposition: form-data; name="file"; filename="x.png"\r\n\r\n')
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /api/v2/assets HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: multipart/form-data; boundary=bb\r\n"
                     + f"Content-Length: {len(head) + 4 * MIB + 10}\r\n\r\n".encode() + head)
        conn.sendall(os.urandom(2 * MIB))
        wait_for(lambda: any(".api-upload-" in f for f in stored_files(config)), 10, "the upload to be under way")
    wait_for(lambda: stored_files(config) == [], 10, "the cut upload's temporary file to be removed",
             lambda: str(stored_files(config)))
    assert runner.queue.assets.asset_totals()["assets"] == 0
    assert upload(url, b"next").status_code == 201


@pytest.mark.parametrize(("make", "status", "code"), [
    (lambda url: httpx.post(f"{url}/api/v2/assets", content=b"garbage",
                            headers={"Content-Type": "multipart/form-data; boundary=xx"}), 400, "invalid_request"),
    (lambda url: httpx.post(f"{url}/api/v2/assets", json={"file": "x"}), 400, "invalid_request"),
    (lambda url: httpx.post(f"{url}/api/v2/assets", data={"content_type": "image/png"},
                            files={"file": ("x.png", b"x")}), 400, "invalid_request"),
    (lambda url: httpx.post(f"{url}/api/v2/assets", data={"content_type": "image/png", "file_path": "x.png"}),
     400, "invalid_request"),
    (lambda url: upload(url, b"x", surprise="1"), 400, "invalid_request"),
    (lambda url: upload(url, b"x", expected_hash=assets.hash_bytes(b"y")), 409, "hash_mismatch"),
    (lambda url: upload(url, b"x", name="input/../../etc/cron.d/x"), 400, "invalid_request"),
    (lambda url: upload(url, b"x", name="/etc/passwd"), 400, "invalid_request"),
])
def test_bad_uploads_get_the_contracts_envelope_and_store_nothing(api: Any, make: Any, status: int,
                                                                  code: str) -> None:
    url, runner, config = api
    answer = make(url)
    assert envelope(answer, status) == code
    assert runner.queue.assets.asset_totals()["assets"] == 0 and stored_files(config) == []


def test_a_client_declared_hash_that_matches_is_accepted(api: Any) -> None:
    url, _, _ = api
    answer = upload(url, b"x", expected_hash=assets.hash_bytes(b"x"))
    assert answer.status_code == 201 and answer.json()["hash"] == assets.hash_bytes(b"x")


def test_an_upload_idempotency_key_is_single_use(api: Any) -> None:
    """Reusing a key is 422 idempotency_key_reuse naming the first upload's record, for the same bytes too."""
    url, runner, _ = api
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = upload(url, b"cat", headers=key)
    again = upload(url, b"cat", headers=key)
    assert envelope(again, 422) == "idempotency_key_reuse"
    assert again.json()["error"]["details"] == {"asset_id": first.json()["id"]}
    assert envelope(upload(url, b"dog", headers=key), 422) == "idempotency_key_reuse"
    assert not runner.queue.assets.has_asset(assets.hash_bytes(b"dog"))


def test_a_reference_to_an_asset_not_held_is_422_missing_asset_at_submit(api: Any) -> None:
    url, runner, _ = api
    asset_id = upload(url, random_png(3)).json()["id"]

    def submit(info: dict[str, Any]) -> httpx.Response:
        graph = {**INVERT, "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET",
                                                                                 "info": info}}}}
        return httpx.post(f"{url}/api/v2/jobs", json={"workflow": graph})

    unknown = submit({"id": str(uuid.uuid4()), "hash": assets.hash_bytes(b"never")})
    assert envelope(unknown, 422) == "missing_asset"
    assert unknown.json()["error"]["details"]["missing"][0]["node_id"] == "1"
    assert envelope(submit({"hash": assets.hash_bytes(random_png(3))}), 422) == "missing_asset"  # no info.id
    assert envelope(submit({"id": f"{uuid.uuid4()}.0"}), 422) == "missing_asset"  # an output's id
    # Malformed: no info object, or a reference inside an input's value; never queued as a literal object.
    for bad in ({"__type": "core/ASSET"}, {"__type": "core/ASSET", "info": "x"},
                [{"__type": "core/ASSET", "info": {"id": asset_id}}]):
        graph = {**INVERT, "1": {"class_type": "LoadImage", "inputs": {"image": bad}}}
        answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": graph})
        assert envelope(answer, 422) == "missing_asset", answer.text
    with Comfy() as client:
        client.assets.delete(asset_id)
        with pytest.raises(ComfyError) as refused:
            workflow = client.workflows.from_json(copy.deepcopy(INVERT))
            workflow.set_input("1", "image", {"__type": "core/ASSET", "info": {"id": asset_id}})
            client.submit(workflow)
        assert refused.value.code == "missing_asset"
    assert runner.queue.reads.status().counts["queued"] == 0
    data = random_png(3)
    accepted = upload(url, data).json()["id"]
    answer = submit({"id": accepted})
    assert answer.status_code == 201 and JobModel.model_validate(answer.json()).status.value == "queued"
    # /workflow is the executed graph (comfy-sdk's JobWorkflowResponse): the file as ComfyUI gets it, by its hash.
    executed = httpx.get(f"{url}/api/v2/jobs/{answer.json()['id']}/workflow").json()
    assert executed["format"] == "api" and executed["workflow"]["1"]["inputs"]["image"] == \
        f"comfysup/{assets.hash_bytes(data).removeprefix('blake3:')}.png"
    assert executed["workflow"]["2"] == INVERT["2"]


def test_delete_removes_an_upload_but_not_what_a_job_needs(api: Any) -> None:
    url, runner, _ = api
    with Comfy() as client:
        kept = client.assets.from_bytes(b"needed by a job", filename="a.png")
        workflow = client.workflows.from_json(copy.deepcopy(INVERT))
        workflow.set_input("1", "image", kept)
        client.submit(workflow)
        lone = client.assets.from_bytes(b"needed by nobody", filename="b.png")
        lone.commit()
        digests = (kept.hash, lone.hash)
        kept_id = kept.id
        kept.delete()
        lone.delete()
    assert envelope(httpx.get(f"{url}/api/v2/assets/{kept_id}"), 404) == "not_found"
    assert runner.queue.assets.read_asset(digests[0]) == b"needed by a job"
    assert not runner.queue.assets.has_asset(digests[1])
    assert envelope(httpx.delete(f"{url}/api/v2/assets/{kept_id}"), 404) == "not_found"
    assert envelope(httpx.delete(f"{url}/api/v2/assets/{uuid.uuid4()}.0"), 403) == "forbidden"


@pytest.mark.timeout(120)
def test_prune_keeps_a_fresh_upload_and_removes_an_expired_unreferenced_one(tmp_path: Path) -> None:
    config = api_config(tmp_path)
    with running_api(config) as url:
        fresh = AssetModel.model_validate(upload(url, b"fresh upload", name="fresh.png").json())
        old = AssetModel.model_validate(upload(url, b"old upload", name="old.png").json())
    conn = sqlite3.connect(config.resolve(config.queue.path))  # the old one's retention has passed
    with conn:
        conn.execute("UPDATE api_assets SET expires_at = ? WHERE id = ?", (time.time() - 1, old.id))
    conn.close()
    done = comfysup("prune", "--done-before", "1d", "--config", str(tmp_path / "config.toml"))
    assert done.returncode == 0, done.stderr
    assert "removed 1 input file(s) (10 bytes)" in done.stdout
    with running_api(config) as url:
        assert envelope(httpx.get(f"{url}/api/v2/assets/{old.id}"), 404) == "not_found"
        assert httpx.head(f"{url}/api/v2/assets/by-hash/{old.hash}").status_code == 404
        assert httpx.get(f"{url}/api/v2/assets/{fresh.id}/content").content == b"fresh upload"
    assert stored_files(config) == [f"{fresh.hash[7:9]}/{fresh.hash[7:]}"]


@pytest.mark.timeout(120)
def test_postgresql_keeps_uploads_in_the_database_and_serves_ranges(tmp_path: Path,
                                                                    pg_url: str) -> None:  # noqa: F811
    config = api_config(tmp_path, sections={"queue": {"url": pg_url}})
    data = os.urandom(5 * MIB)  # more than one 4 MiB chunk in the database
    with running_api(config) as url:
        created = upload(url, data, name="big.png")
        assert created.status_code == 201, created.text
        body = AssetModel.model_validate(created.json())
        assert httpx.get(f"{url}/api/v2/assets/{body.id}/content").content == data
        edge = 4 * MIB
        part = httpx.get(f"{url}/api/v2/assets/{body.id}/content", headers={"Range": f"bytes={edge - 3}-{edge + 3}"})
        assert part.status_code == 206 and part.content == data[edge - 3:edge + 4]
        assert httpx.head(f"{url}/api/v2/assets/by-hash/{body.hash}").status_code == 200
        assert upload(url, data, name="again.png").json()["created_new"] is False
        graph = {**INVERT, "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET",
                                                                                 "info": {"id": body.id}}}}}
        answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": graph})
        assert answer.status_code == 201, answer.text
        missing = {**graph, "1": {"class_type": "LoadImage", "inputs": {"image": {
            "__type": "core/ASSET", "info": {"id": str(uuid.uuid4())}}}}}
        assert envelope(httpx.post(f"{url}/api/v2/jobs", json={"workflow": missing}), 422) == "missing_asset"
    queue = open_queue(config)
    try:
        assert queue.reads.get(answer.json()["id"]).params["1.image"]["info"]["hash"] == body.hash
        assert queue.assets.assets_dir is None and queue.assets.read_asset(body.hash) == data
    finally:
        queue.close()


@pytest.mark.timeout(90)
def test_end_to_end_an_uploaded_image_is_inverted_by_a_real_runner(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """LoadImage → ImageInvert → SaveImage: the SDK uploads the input and submits; a real runner uploads it to
    fake_comfy (runner/inputs.py) and runs the job; every output pixel is the inverse of its input."""
    from comfysup.runner.loop import Runner
    from comfysup.runner.options import RunnerOptions

    fake = FakeComfy(base_directory=tmp_path / "fake", node_ms=1)
    fake.start()
    runner_settings = {"attempts": 2, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
                       "timeout_seconds": 20.0, "poll_seconds": 0.2, "lease_seconds": 10.0,
                       "heartbeat_seconds": 0.5, "http_timeout_seconds": 5.0}
    config = api_config(tmp_path, sections={"runner": runner_settings})
    photo = tmp_path / "photo.png"
    photo.write_bytes(random_png(5))
    try:
        with running_api(config) as url:
            monkeypatch.setenv("COMFY_BASE_URL", url)
            monkeypatch.delenv("COMFY_API_KEY", raising=False)
            with Comfy() as client:
                workflow = client.workflows.from_json(copy.deepcopy(INVERT))
                workflow.set_input("1", "image", client.assets.from_file(photo))
                job = client.submit(workflow)
                Runner(config, "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
                job.wait(timeout=30)
                assert job.status == "succeeded"
                [output] = job.get_outputs("3")
                _w, _h, _c, inverted = decode_png(output.to_bytes())
    finally:
        fake.stop()
    _w, _h, _c, original = decode_png(photo.read_bytes())
    assert list(inverted) == [expected_inverse(v) for v in original]
    digest = assets.hash_bytes(photo.read_bytes())
    assert [p.name for p in (Path(fake.input_directory) / "comfysup").iterdir()] == [assets.upload_name(digest,
                                                                                                        "photo.png")]
