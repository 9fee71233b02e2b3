"""An output named by a later job's core/ASSET reference (comfysup.api.outputs ``Inputs``): made an
upload over its content once, however many jobs name it; refused 422 missing_asset, saying what to do, when its
file is not in this machine's result store."""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any

import httpx

from comfysup.queue.base import Output
from tests.api_support import api  # noqa: F401  (a fixture)

MAKE = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}


def referencing(asset_id: str) -> dict[str, Any]:
    return {"1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": asset_id}}}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "y"}}}


def test_an_output_named_twice_is_stored_once_and_one_not_held_here_is_refused(api: Any) -> None:  # noqa: F811
    url, runner, config = api
    made = [httpx.post(f"{url}/api/v2/jobs", json={"workflow": MAKE}).json() for _ in range(2)]
    data = runner.run_one()
    runner.run_one()
    here, gone = (httpx.get(job["urls"]["self"]).json()["outputs"][0] for job in made)
    (config.resolve(config.store.dir) / made[1]["id"] / "comfysup_00001_.png").unlink()  # held elsewhere, say

    jobs = [httpx.post(f"{url}/api/v2/jobs", json={"workflow": referencing(here["id"])}) for _ in range(2)]
    assert [j.status_code for j in jobs] == [201, 201], jobs[0].text
    db = sqlite3.connect(config.resolve(config.queue.path))
    try:
        assert db.execute("SELECT count(*) FROM api_assets").fetchone() == (1,)  # one record, minted again
        (digest,) = db.execute("SELECT hash FROM api_assets").fetchone()
        assert db.execute("SELECT size FROM assets WHERE hash = ?", (digest,)).fetchone() == (len(data),)
    finally:
        db.close()
    refused = httpx.post(f"{url}/api/v2/jobs", json={"workflow": referencing(gone["id"])})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "missing_asset"
    assert "not in this machine's result store" in refused.json()["error"]["message"]


def test_an_output_in_a_bucket_is_refused_saying_how_to_name_it(api: Any, monkeypatch: Any) -> None:  # noqa: F811
    """An output the runner uploaded to a bucket ([store] url) has no file in this machine's store: the answer
    names its object and the references that work (its presigned url, or its s3:// location), not another
    machine's store. Its content, on a machine with no credentials to presign with, is 503 saying so."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url, runner, _config = api
    made = httpx.post(f"{url}/api/v2/jobs", json={"workflow": MAKE}).json()
    claim = runner.claim()
    location = f"s3://outputs/run/{claim.id}/comfysup_00001_.png"
    output = Output("comfysup_00001_.png", 3, hashlib.sha256(b"abc").hexdigest(), location)
    runner.queue.leases.complete(claim, [output])
    [output] = httpx.get(made["urls"]["self"]).json()["outputs"]

    refused = httpx.post(f"{url}/api/v2/jobs", json={"workflow": referencing(output["id"])})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "missing_asset", refused.text
    message = refused.json()["error"]["message"]
    assert location in message and "info.url" in message and "[inputs] s3_buckets" in message, message
    assert "result store" not in message, message
    content = httpx.get(f"{url}/api/v2/assets/{output['id']}/content")
    assert content.status_code == 503 and content.json()["error"]["code"] == "storage_unavailable", content.text
    assert location in content.json()["error"]["message"] and "[store] access keys" in content.text
