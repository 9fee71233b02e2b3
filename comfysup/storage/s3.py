"""An S3-compatible bucket through boto3: one client per process and settings, uploads confirmed by the service,
presigned URLs, deletes, and the service's errors sorted in two.

boto3 is the standard S3 client: its transfer manager uploads a large file in parts (in parallel, each part
retried), and botocore signs for every S3-compatible service (AWS, R2, GCS's XML API, MinIO, SeaweedFS, Ceph).
It is imported only when a bucket is configured: a machine without one never pays for importing it.
``new_client`` is the one place comfysup makes a client: for [store]'s buckets here, and for the s3:// inputs of
[inputs] (comfysup.jobs.fetch) and the model manifest's s3:// files (comfysup.models.sources), which import it
from this low layer.

Errors: ``Unreachable`` (an OSError: the service did not answer, answered 5xx or asked to slow down) is
transient: the runner retries the job with its usual backoff, never recording it done; ``Refused`` (wrong
credentials, no such bucket, no such profile) means the config is wrong: said once at start, not per job.
Every message is passed through a Redactor holding the configured keys, so no credential is ever shown.
"""

from __future__ import annotations

import base64
import errno
import functools
import mimetypes
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from comfysup.errors import ComfysupError
from comfysup.redact import Redactor

SCHEME = "s3"
SHA256_METADATA = "sha256"
"""The user metadata key under which each object carries the hex SHA-256 comfysup recorded for it: what the
confirmation (``head_object``) and the chaos suite's checker compare."""
MAX_TTL_SECONDS = 7 * 86400
"""SigV4 presigned URLs are valid for at most 7 days."""
DELETE_BATCH = 1000
"""S3's DeleteObjects takes at most 1000 keys a call."""


class Settings(Protocol):
    """Where the service is and who we are: [store] carries these keys (the asset store uses [store]'s too)."""

    endpoint_url: str
    region: str
    profile: str
    access_key_id: str
    secret_access_key: str


class Unreachable(OSError):
    """The service did not answer, or answered that it cannot now (5xx, SlowDown): transient, retried later."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)


class Refused(ComfysupError):
    """The service refused who we are or where we write (credentials, bucket, profile): the config is wrong."""


class Location(NamedTuple):
    """``s3://bucket/prefix``: a bucket and a key prefix (no leading or trailing slash; "" for the bucket's root)."""

    bucket: str
    prefix: str

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def uri(self, key: str) -> str:
        return f"{SCHEME}://{self.bucket}/{key}"

    def __str__(self) -> str:
        return self.uri(self.prefix)


def parse(url: str) -> Location:
    """``s3://bucket[/prefix]`` as a Location; ValueError saying what is wrong (the config check words it)."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME or not parts.netloc:
        raise ValueError("expected s3://bucket/prefix")
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError("expected s3://bucket/prefix, with no credentials, query or fragment (credentials go in "
                         "access_key_id/secret_access_key, the environment or an AWS profile)")
    prefix = parts.path.strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise ValueError("the prefix has an empty, . or .. part")
    return Location(parts.netloc, prefix)


def split_uri(uri: str) -> tuple[str, str] | None:
    """(bucket, key) of an ``s3://bucket/key`` an output or an asset was recorded under; None for anything else
    (a path on a machine's disk)."""
    if not uri.startswith(f"{SCHEME}://"):
        return None
    bucket, _, key = uri[len(SCHEME) + 3:].partition("/")
    return (bucket, key) if bucket and key else None


def redactor(settings: Settings) -> Redactor:
    """Masks the configured credentials by value (and any 8 characters of them) in a message."""
    return Redactor([settings.secret_access_key, settings.access_key_id])


def client(settings: Settings) -> Any:
    """A boto3 S3 client for ``settings``, one per process: a client holds a pool of connections, which a forked
    child must not share with its parent, so the cache is keyed by the process id too."""
    return _client(os.getpid(), settings.endpoint_url, settings.region, settings.profile, settings.access_key_id,
                   settings.secret_access_key)


@functools.lru_cache(maxsize=8)
def _client(pid: int, endpoint_url: str, region: str, profile: str, access_key_id: str,
            secret_access_key: str) -> Any:
    return new_client(used_for="buckets ([store] url, [assets] url)", where="[store]", endpoint_url=endpoint_url,
                      region=region, profile=profile, access_key_id=access_key_id,
                      secret_access_key=secret_access_key)


def new_client(*, used_for: str, where: str = "", endpoint_url: str = "", region: str = "", profile: str = "",
               access_key_id: str = "", secret_access_key: str = "", connect_timeout: float = 5.0,
               read_timeout: float = 60.0) -> Any:
    """A new boto3 S3 client: the one way comfysup makes one (the output and asset buckets of [store], the s3://
    inputs of [inputs], the model manifest's s3:// files), so each gets the same credentials chain, signing,
    addressing and retries.

    Credentials are the ones given, else boto3's usual chain (AWS_* variables, ``AWS_PROFILE`` and ~/.aws, the
    instance's role); the endpoint and region likewise (``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``). A
    service at an address of its own (MinIO, SeaweedFS, Ceph) has no DNS name per bucket, so an ``endpoint_url``
    is addressed by path. A few retries (boto3's standard mode) and timeouts, so no call hangs on a silent service.

    Refused, never a bare ImportError or botocore error, when boto3 is not installed ("``used_for`` need
    boto3 …") or cannot make a client of what it was given (an unknown profile, an unreadable ~/.aws/config:
    "``where``: boto3's words", which name no secret; a caller that prefixes its own leaves ``where`` empty)."""
    try:  # boto3 is an optional dependency (comfysup[s3])
        import boto3
        from botocore.config import Config as BotoConfig
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise Refused(f"{used_for} need boto3, which is not installed: pip install 'comfysup[s3]'") from None

    try:
        session = boto3.session.Session(profile_name=profile or None, aws_access_key_id=access_key_id or None,
                                        aws_secret_access_key=secret_access_key or None,
                                        region_name=region or None)
        return session.client("s3", endpoint_url=endpoint_url or None, config=BotoConfig(
            signature_version="s3v4", connect_timeout=connect_timeout, read_timeout=read_timeout,
            retries={"mode": "standard", "max_attempts": 3},
            s3={"addressing_style": "path" if endpoint_url else "auto"}))
    except BotoCoreError as exc:
        raise Refused(f"{where}: {exc}" if where else str(exc)) from None


def sort_error(exc: BaseException, where: str, settings: Settings) -> Unreachable | Refused:
    """``exc`` of a call to the service as Unreachable (try again later) or Refused (the config is wrong), its
    message naming ``where`` and never a credential."""
    # boto3 is an optional dependency (comfysup[s3]), present once a client was made.
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )

    if isinstance(exc, Unreachable | Refused):
        return exc  # sorted already (an upload not confirmed)
    clean = redactor(settings)
    if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, ClientError | BotoCoreError):
        exc = exc.__context__  # the transfer manager's wrapper: sort by what the service said
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | ProfileNotFound):
        return Refused(clean(f"{where}: {exc}; give access_key_id and secret_access_key in [store], set "
                             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name an AWS profile", 600))
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        said = clean(f"{code or status} {error.get('Message') or ''}".strip(), 300)
        if status >= 500 or code in ("SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "InternalError"):
            return Unreachable(f"{where}: the service cannot answer now ({said})")
        if status == 403 or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
            return Refused(f"{where}: the credentials are refused ({said}); check [store] access_key_id and "
                           "secret_access_key, the AWS_* variables or the profile, and the key's rights on the bucket")
        if code in ("NoSuchBucket", "404") or status == 404:
            return Refused(f"{where}: no such bucket ({said}); create it, or correct the s3:// URL and endpoint_url")
        return Refused(f"{where}: refused ({said})")
    return Unreachable(clean(f"{where}: cannot reach the service ({type(exc).__name__}: {exc})", 600))


def service_errors() -> tuple[type[BaseException], ...]:
    """What a call to the service raises when the service (or the way to it) fails: the errors ``sort_error``
    sorts. Anything else (an exception of a ``progress`` callback: a lost lease, a cancel) is not the service's."""
    # boto3 is an optional dependency (comfysup[s3]), present once a client was made.
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, S3UploadFailedError, OSError)


def check_bucket(s3: Any, location: Location, settings: Settings, where: str) -> None:
    """The bucket exists and the credentials may use it (one HEAD): raises Refused or Unreachable."""
    try:
        s3.head_bucket(Bucket=location.bucket)
    except Exception as exc:
        raise sort_error(exc, f"{where} {location}", settings) from None


def upload(s3: Any, bucket: str, key: str, path: Path, size: int, sha256: str, part_bytes: int,
           progress: Callable[[], None] | None = None) -> None:
    """``path`` stored at ``key`` and confirmed, or an exception (sort it with ``sort_error``).

    Up to ``part_bytes`` in one PUT carrying the SHA-256 we recorded (``x-amz-checksum-sha256``): the service
    refuses the object unless the bytes it received have that hash, and its answer naming the same hash is the
    confirmation. Above, boto3's transfer manager uploads parts of ``part_bytes``, each with its own SHA-256 the
    service checks. The object carries our hash in its metadata; a HEAD confirms its size and that hash after a
    multipart upload, or after a PUT whose answer did not name the hash (a service that ignores checksums),
    before the caller may record it: what a job's ``done`` promises.

    ``progress`` (a multipart upload only: one PUT is bounded by the client's timeouts) is called as parts are
    sent; the parts then go one after the other in the calling thread, so whatever ``progress`` does (renew a
    lease in the runner's database connection) and raises happens there, stopping the upload."""
    extra = {"Metadata": {SHA256_METADATA: sha256},
             "ContentType": mimetypes.guess_type(key)[0] or "application/octet-stream"}
    if size <= part_bytes:
        checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
        with open(path, "rb") as f:
            answer = s3.put_object(Bucket=bucket, Key=key, Body=f, ContentLength=size, ChecksumSHA256=checksum,
                                   **extra)
        if answer.get("ChecksumSHA256") == checksum:
            return  # the service hashed what it stored and found ours: confirmed without another round trip
    else:
        # boto3 is an optional dependency (comfysup[s3]), present once a client was made.
        from boto3.s3.transfer import TransferConfig

        s3.upload_file(str(path), bucket, key, ExtraArgs={**extra, "ChecksumAlgorithm": "SHA256"},
                       Callback=(lambda sent: progress()) if progress is not None else None,
                       Config=TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes,
                                            max_concurrency=4, use_threads=progress is None))
    confirm(s3, bucket, key, size, sha256)


def confirm(s3: Any, bucket: str, key: str, size: int, sha256: str) -> None:
    """The object at ``key`` has ``size`` bytes and carries ``sha256``; else Unreachable (the upload is retried)."""
    head = s3.head_object(Bucket=bucket, Key=key)
    got_size, got_hash = head.get("ContentLength"), head.get("Metadata", {}).get(SHA256_METADATA)
    if got_size != size or got_hash != sha256:
        raise Unreachable(f"s3://{bucket}/{key}: stored {got_size} bytes with sha256 {got_hash}, expected {size} "
                          f"bytes with {sha256}: not confirmed")


def presign(s3: Any, uri: str, ttl_seconds: int) -> str:
    """A URL anyone can GET ``uri`` with for ``ttl_seconds`` (computed here: no call to the service)."""
    bucket, key = split_uri(uri) or ("", "")
    return s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                     ExpiresIn=max(1, min(ttl_seconds, MAX_TTL_SECONDS)))


def job_prefix(uri: str, job_id: str) -> tuple[str, str] | None:
    """(bucket, ``<prefix>/<job id>/``) of an output recorded at ``uri``: the folder of every key of that job,
    leftovers of an attempt that died between its upload and its done included."""
    split = split_uri(uri)
    if split is None:
        return None
    bucket, key = split
    at = f"/{key}".find(f"/{job_id}/")
    return None if at < 0 else (bucket, f"/{key}"[1:at + len(job_id) + 2])


def delete_prefixes(s3: Any, prefixes: Iterable[tuple[str, str]]) -> int:
    """Every object under each (bucket, prefix), in batches of 1000; how many were deleted."""
    deleted = 0
    for bucket, prefix in prefixes:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for start in range(0, len(keys), DELETE_BATCH):
                batch = keys[start:start + DELETE_BATCH]
                answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
                if answer.get("Errors"):
                    first = answer["Errors"][0]
                    raise Unreachable(f"s3://{bucket}/{first.get('Key')}: not deleted ({first.get('Code')} "
                                      f"{first.get('Message')})")
                deleted += len(batch)
    return deleted
