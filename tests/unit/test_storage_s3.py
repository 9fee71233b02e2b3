"""comfysup.storage.s3 without a server: URLs, the sorting of the service's errors, and the confirmation of an
upload by a service that does not answer with the checksum. The real service: tests/integration."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from comfysup.storage import s3


class Settings:
    endpoint_url = "http://127.0.0.1:1"
    region = "us-east-1"
    profile = ""
    access_key_id = "AKIAEXAMPLEKEY123"
    secret_access_key = "wJalrXUtnFEMI-example-secret-key"


def test_urls_parse_into_a_bucket_and_a_prefix() -> None:
    assert s3.parse("s3://bucket") == s3.Location("bucket", "")
    assert s3.parse("s3://bucket/a/b/") == s3.Location("bucket", "a/b")
    assert s3.parse("s3://bucket/a").key("job", "sub/x.png") == "a/job/sub/x.png"
    for bad in ("http://bucket/x", "s3:///x", "s3://key:secret@bucket/x", "s3://bucket/a//b", "s3://bucket/../x",
                "s3://bucket/x?versionId=1"):
        with pytest.raises(ValueError):
            s3.parse(bad)
    assert s3.split_uri("s3://b/p/k.png") == ("b", "p/k.png") and s3.split_uri("/var/results/x") is None
    assert s3.job_prefix("s3://b/p/job-1/sub/x.png", "job-1") == ("b", "p/job-1/")


def error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"said {Settings.access_key_id}"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


@pytest.mark.parametrize(("exc", "kind", "words"), [
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b"), s3.Unreachable, "cannot reach the service"),
    (error("SlowDown", 503), s3.Unreachable, "cannot answer now"),
    (error("InternalError", 500), s3.Unreachable, "cannot answer now"),
    (error("InvalidAccessKeyId", 403), s3.Refused, "credentials are refused"),
    (error("SignatureDoesNotMatch", 403), s3.Refused, "credentials are refused"),
    (error("NoSuchBucket", 404), s3.Refused, "no such bucket"),
])
def test_the_services_errors_are_transient_or_a_wrong_config_and_never_show_a_key(
        exc: Exception, kind: type, words: str) -> None:
    sorted_ = s3.sort_error(exc, "uploading s3://b/k", Settings())
    assert isinstance(sorted_, kind) and words in str(sorted_) and "uploading s3://b/k" in str(sorted_)
    assert Settings.access_key_id not in str(sorted_) and Settings.secret_access_key not in str(sorted_)


class Service:
    """A service that stores what it is given but never names the checksum in its answer."""

    def __init__(self, keep: bool = True) -> None:
        self.objects: dict[str, tuple[int, dict[str, str]]] = {}
        self.keep = keep
        self.heads = 0

    def put_object(self, Bucket: str, Key: str, Body: Any, Metadata: dict[str, str], **_: Any) -> dict[str, Any]:
        data = Body.read()
        if self.keep:
            self.objects[Key] = (len(data), Metadata)
        return {"ETag": '"x"'}

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self.heads += 1
        if Key not in self.objects:
            raise error("404", 404)
        size, meta = self.objects[Key]
        return {"ContentLength": size, "Metadata": meta}


def test_a_put_whose_answer_names_no_checksum_is_confirmed_by_a_head(tmp_path: Path) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(b"bytes of an image")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    service = Service()
    s3.upload(service, "b", "p/x.png", path, path.stat().st_size, digest, 5 * 2**20)
    assert service.heads == 1 and service.objects["p/x.png"][1] == {s3.SHA256_METADATA: digest}
    lying = Service(keep=False)  # answers 200 and keeps nothing: never confirmed
    with pytest.raises(ClientError):
        s3.upload(lying, "b", "p/x.png", path, path.stat().st_size, digest, 5 * 2**20)
    lying.objects["p/x.png"] = (3, {s3.SHA256_METADATA: digest})  # another size than ours
    with pytest.raises(s3.Unreachable, match="not confirmed"):
        s3.confirm(lying, "b", "p/x.png", path.stat().st_size, digest)


def test_links_give_the_location_and_a_presigned_url_for_objects_only() -> None:
    from comfysup.storage.links import Links

    class WithTtl(Settings):
        url_ttl_seconds = 60

    class NoUrls(Settings):
        url_ttl_seconds = 0

    uri = "s3://renders/prod/job/x.png"
    link = Links(WithTtl(), wall=lambda: 1000.0)(uri)
    assert link["location"] == uri and link["url_expires_at"] == 1060.0
    assert link["url"].startswith("http://127.0.0.1:1/renders/prod/job/x.png?") and "X-Amz-Expires=60" in link["url"]
    assert Settings.secret_access_key not in link["url"]  # a signature, never the secret
    assert Links(NoUrls())(uri) == {"location": uri}
    assert "X-Amz-Expires=300" in Links(NoUrls())(uri, ttl_seconds=300)["url"]  # the API's redirect
    assert Links(WithTtl())("/var/results/job/x.png") == {}


def test_every_client_is_made_alike_and_what_cannot_make_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one construction [store], [inputs] and the model manifest share: path addressing at an endpoint of its
    # own, the caller's timeouts, boto3's retries; no bare ImportError or botocore error out of it.
    made = s3.new_client(used_for="s3:// inputs", endpoint_url="http://127.0.0.1:1", region="eu-west-1",
                         connect_timeout=7.0, read_timeout=8.0)
    config = made.meta.config
    assert (config.connect_timeout, config.read_timeout, config.s3["addressing_style"]) == (7.0, 8.0, "path")
    assert config.retries["mode"] == "standard" and made.meta.region_name == "eu-west-1"
    assert s3.new_client(used_for="x").meta.config.s3["addressing_style"] == "auto"
    with pytest.raises(s3.Refused, match=r"^\[store\]: The config profile \(absent\) could not be found"):
        s3.new_client(used_for="buckets", where="[store]", profile="absent")
    monkeypatch.setitem(__import__("sys").modules, "boto3", None)
    with pytest.raises(s3.Refused, match=r"^s3:// inputs need boto3, which is not installed: pip install "):
        s3.new_client(used_for="s3:// inputs")
