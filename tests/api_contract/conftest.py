"""The API under the conformance suite: comfysup's API with a bearer token and one allowed browser origin, over a
SQLite queue whose first job a real runner ran on fake_comfy, once per ComfyUI version the fake answers as, and
once on a real ComfyUI when COMFYUI_DIR names one (tests/real_comfyui.py; the ``real`` cases, marked comfyui)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from comfysup.config import Config
from comfysup.jobs import PRIORITY_RANGE
from comfysup.queue import open_queue
from comfysup.queue.base import Output
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests import real_comfyui
from tests.api_support import api_config, running_api
from tests.conftest import COMFYUI_VERSIONS

SERVERS = (*COMFYUI_VERSIONS, *([pytest.param("real", marks=pytest.mark.comfyui)] if real_comfyui.COMFYUI_DIR else []))
"""The servers the suite's jobs run on: the fake as each ComfyUI version, and a real ComfyUI when COMFYUI_DIR names
one (without it the real cases are left out, not listed as 63 skips)."""

ROOT = Path(__file__).resolve().parents[2]
GRAPH = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
TOKEN = "contract-token"
APP_ORIGIN = "https://app.example"
RUNNER = {"attempts": 2, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
          "timeout_seconds": 20.0, "poll_seconds": 0.2, "lease_seconds": 10.0, "heartbeat_seconds": 0.5,
          "http_timeout_seconds": 5.0}

BUCKET = {"endpoint_url": "http://127.0.0.1:9", "region": "us-east-1", "access_key_id": "contract",
          "secret_access_key": "contract-secret"}
"""Credentials to presign with (offline: no call to the service), for an output recorded in a bucket; the
runner's own outputs stay on disk ([store] url is empty)."""


class Contract:
    """The API's address and what the cases build on: requests with the token, fresh jobs and uploads."""

    def __init__(self, url: str, config: Config, server_url: str, version: str) -> None:
        self.url = url
        self.config = config
        self.server_url = server_url
        """The ComfyUI the runner posts to: fake_comfy, or a real one."""
        self.version = version
        self.client = httpx.Client(base_url=url, timeout=20.0)
        self.finished = ""
        """A job the runner ran to its end on fake_comfy (succeeded, one output)."""

    def send(self, method: str, path: str, *, auth: bool = True, headers: dict[str, str] | None = None,
             **kwargs: Any) -> httpx.Response:
        sent = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
        return self.client.request(method, path, headers={**sent, **(headers or {})}, **kwargs)

    def graph(self) -> dict[str, Any]:
        """The trivial workflow with a colour of its own, so each job is another job."""
        graph = json.loads(json.dumps(GRAPH))
        graph["1"]["inputs"]["color"] = uuid.uuid4().int % 2**24
        return graph

    def job(self, **headers: str) -> str:
        answer = self.send("POST", "/api/v2/jobs", json={"workflow": self.graph()}, headers=headers)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def upload(self, data: bytes | None = None, key: str | None = None, **fields: str) -> httpx.Response:
        data = os.urandom(64) if data is None else data
        form = {"content_type": "image/png", "file_path": "photo.png", **fields}
        return self.send("POST", "/api/v2/assets", files={"file": ("photo.png", data, "image/png")}, data=form,
                         headers={"Idempotency-Key": key} if key else {})

    def asset(self) -> dict[str, Any]:
        answer = self.upload()
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    def in_bucket(self) -> str:
        """The output id of a job done with its file in a bucket, as a runner with [store] url records it."""
        job = self.send("POST", "/api/v2/jobs", json={"workflow": self.graph(), "priority": PRIORITY_RANGE[1]})
        assert job.status_code == 201, job.text
        queue = open_queue(self.config)
        try:
            claim = queue.leases.claim("contract/1/gpu0/t", "gpu0", 60.0)  # the highest priority: this job
            assert claim is not None and claim.id == job.json()["id"]
            queue.leases.complete(claim, [Output("x.png", 3, hashlib.sha256(b"png").hexdigest(),
                                          f"s3://outputs/run/{claim.id}/x.png")])
        finally:
            queue.close()
        return str(self.send("GET", f"/api/v2/jobs/{claim.id}").json()["outputs"][0]["id"])

    def run_queued(self) -> None:
        """Every queued job run by a real runner on the fake, to its end."""
        Runner(self.config, "cpu0", self.server_url, RunnerOptions(until_empty=True)).run()

    @contextmanager
    def bounded(self) -> Iterator[str]:
        """A second API process on the same queue with ``[api] max_queued = 1``."""
        folder = Path(self.config.root) / f"bounded-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        config = api_config(folder, sections={"queue": {"path": self.config.queue.path}}, token=TOKEN,
                            max_queued=1)
        with running_api(config) as url:
            yield url


@contextmanager
def _server(version: str, tmp: Path) -> Iterator[str]:
    if version == "real":
        with real_comfyui.started(tmp / "comfyui") as url:
            yield url
        return
    fake = FakeComfy(base_directory=tmp / "fake", node_ms=1, comfyui_version=version)
    fake.start()
    try:
        yield fake.url
    finally:
        fake.stop()


@pytest.fixture(scope="module", params=SERVERS)
def contract(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    version = str(request.param)
    tmp = tmp_path_factory.mktemp(f"contract-{version}")
    with _server(version, tmp) as server_url:
        config = api_config(tmp, sections={"runner": RUNNER, "store": {"dir": str(tmp / "store"), **BUCKET}},
                            token=TOKEN, allowed_origins=[APP_ORIGIN])
        with running_api(config) as url:
            ctx = Contract(url, config, server_url, version)
            ctx.finished = ctx.job()
            ctx.run_queued()
            try:
                yield ctx
            finally:
                ctx.client.close()
