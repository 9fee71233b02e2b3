"""``s3://`` entries of the model manifest: GetObject with ``Range`` continues a broken-off body, ``IfMatch`` holds
it to the same object, and the service's refusals are named. The S3 service is a stand-in that answers as S3 does
(Range, ContentRange, ETag, NoSuchKey): what is under test is how a pull uses the answers; the client itself is
boto3's, built by ``sources.s3_client`` (checked for its timeouts)."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, NoCredentialsError, ReadTimeoutError

from comfysup.models import sources
from tests.cli_support import cli
from tests.models_support import content, entry, write_config


class Body:
    def __init__(self, data: bytes, break_after: int | None) -> None:
        self.data, self.break_after = data, break_after

    def iter_chunks(self, size: int) -> Any:
        limit = len(self.data) if self.break_after is None else self.break_after
        for at in range(0, limit, size):
            yield self.data[at:min(at + size, limit)]
        if self.break_after is not None:
            raise ReadTimeoutError(endpoint_url="s3://stand-in")


class StandIn:
    """The GetObject of one bucket; ``break_after`` cuts the next body after that many bytes."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.calls: list[dict[str, Any]] = []
        self.sent = 0
        self.break_after: int | None = None

    def get_object(self, **request: Any) -> dict[str, Any]:
        self.calls.append(request)
        data = self.objects.get(f"{request['Bucket']}/{request['Key']}")
        if data is None:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "The specified key does not exist."}},
                              "GetObject")
        etag = f'"{hashlib.md5(data).hexdigest()}"'  # S3's ETag of a single-part object
        if request.get("IfMatch", etag) != etag:
            raise ClientError({"Error": {"Code": "PreconditionFailed"}}, "GetObject")
        start = int(re.fullmatch(r"bytes=(\d+)-", request["Range"]).group(1)) if "Range" in request else 0
        answer: dict[str, Any] = {"ContentLength": len(data) - start, "ETag": etag}
        if "Range" in request:
            answer["ContentRange"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        cut, self.break_after = self.break_after, None
        self.sent += len(data) - start if cut is None else cut
        answer["Body"] = Body(data[start:], cut)
        return answer


def test_an_s3_object_is_continued_after_a_break_and_a_missing_key_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    data = content((2 << 20) + 777, seed=30)
    service = StandIn({"models/sd/a.safetensors": data})
    service.break_after = 1 << 20
    monkeypatch.setattr(sources, "s3_client", lambda: service)
    config = write_config(tmp_path, [entry("s3://models/sd/a.safetensors", data),
                                     entry("s3://models/none.safetensors", b"other", name="b.safetensors")])
    code, out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
    assert code == 1
    assert "checkpoints/b.safetensors" in err and "NoSuchKey" in err
    assert "broke off after 1048576 bytes" in out
    first, second = service.calls[:2]
    assert "Range" not in first and second["Range"] == f"bytes={1 << 20}-"
    assert second["IfMatch"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert service.sent == len(data)
    blob = tmp_path / "var" / "model-cache" / "sha256" / hashlib.sha256(data).hexdigest()
    assert blob.read_bytes() == data


def test_the_s3_client_has_timeouts() -> None:
    client = sources.s3_client()
    assert client.meta.config.connect_timeout == sources.CONNECT_TIMEOUT
    assert client.meta.config.read_timeout == sources.READ_TIMEOUT


def test_missing_credentials_are_said_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    class NoKeys:
        def get_object(self, **request: Any) -> dict[str, Any]:
            raise NoCredentialsError()

    monkeypatch.setattr(sources, "s3_client", NoKeys)
    config = write_config(tmp_path, [entry("s3://models/a.safetensors", b"a")])
    started = time.monotonic()
    code, _, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
    assert code == 1 and "Unable to locate credentials" in err and "AWS_ACCESS_KEY_ID" in err
    assert time.monotonic() - started < 5, "tried again as if the service were down (1 + 2 + 4 s of waits)"
