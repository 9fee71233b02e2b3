"""Input files from elsewhere: ``{"url": "https://…"}`` and ``{"s3": "s3://bucket/key"}``, fetched at submit.

A job never depends on its URL staying up: the file is read once, at submit, into a staging file that the
submit's transaction copies into the content-addressed asset store (comfysup.queue.assets), and the job names it
by its hash like any input file. A retry, a re-run, another machine: none fetches again.

A URL comes from whoever submits a job, so fetching it is the webhook's problem turned around (server-side
request forgery: a job that makes comfysup read the cloud's metadata service, or ComfyUI's unauthenticated
port on 127.0.0.1, into an asset that its outputs then show). The same rules as webhooks: credentials in the
URL, literal private addresses and metadata names are refused before any connection (comfysup.destinations),
and every connection resolves its name once and goes only to addresses that were checked to be public
(comfysup.safehttp: no DNS rebinding, no private port touched). Redirects are followed by hand, at most
``[inputs] max_redirects``, and each destination is checked again the same way. ``[inputs] allow_private``
turns both checks off, for a file server on the same machine or network.

Bounds: the size (``[assets] max_file_mb``, refused from Content-Length before any byte when the server says
it, else as the bytes pass it), the wait to connect and for each next bytes (``timeout_seconds``: a server that
never answers fails, it does not hang submit) and the whole download (``max_seconds``: nor does one that sends
a byte now and then). The bytes are hashed (BLAKE3, the asset hash, and SHA-256 when a line expects one) as
they are written, so an expected hash is checked without reading the file again.

``s3://`` is read with boto3 (the standard client: its credential chain is the environment, the AWS profile
and the instance role), at ``[inputs] s3_endpoint_url`` for a service other than AWS; the client is made as every
S3 client of comfysup is (comfysup.storage.s3.new_client).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol
from urllib.parse import urljoin, urlsplit

import blake3
import requests
from urllib3.exceptions import HTTPError as TransportError

from comfysup.assets import HASH_PREFIX, READ_BYTES
from comfysup.config import InputsConfig
from comfysup.destinations import is_http_url, url_problem
from comfysup.jobs.sources import FetchError, s3_parts, where
from comfysup.safehttp import PrivateDestination, public_only_session
from comfysup.storage import s3

REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "comfysup-input"


@dataclass(frozen=True)
class Fetched:
    """A fetched input in its staging file, with its size and both hashes."""

    path: str
    size: int
    blake3: str
    """``blake3:<hex>``, the asset hash."""
    sha256: str
    """Bare hex; empty when not asked for (hashing costs as much as a fast download: ``sha256_of`` later)."""

    def with_sha256(self) -> Fetched:
        """This, with its SHA-256 (read from the staging file when the fetch did not compute it)."""
        if self.sha256:
            return self
        with open(self.path, "rb") as f:
            return dataclasses.replace(self, sha256=hashlib.file_digest(f, "sha256").hexdigest())


class Progress(Protocol):
    """What a command shows while a large input downloads (comfysup submit: a tqdm bar on a terminal)."""

    def start(self, name: str, total: int | None) -> None: ...

    def advance(self, size: int) -> None: ...

    def end(self) -> None: ...


class Fetcher:
    """Fetches sources into files; one per submit (its HTTP session and S3 client are made at first use)."""

    def __init__(self, settings: InputsConfig, max_bytes: int, progress: Progress | None = None,
                 stopping: threading.Event | None = None) -> None:
        self.settings = settings
        self.max_bytes = max_bytes
        self.progress = progress
        self.stopping = stopping
        """Set when the service stops (the API): a download ends at its next bytes, not at ``max_seconds``."""
        self._session: requests.Session | None = None
        self._s3: Any = None
        self._sha256 = False

    def check_url(self, url: str) -> None:
        """What is refused without a connection: not http(s), credentials, a literal private address or a
        metadata name (unless ``allow_private``)."""
        if not is_http_url(url):
            raise FetchError(f"{where(url)} is not an http:// or https:// URL with a host")
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            raise FetchError(f"{where(url)}: the URL carries credentials (user:password@), which would be stored "
                             "with the job's line; use a presigned URL, or s3:// with credentials in the environment")
        if not self.settings.allow_private and (problem := url_problem(url)):
            raise FetchError(f"{where(url)}: {problem}; set [inputs] allow_private = true to fetch inputs inside "
                             "this network")

    def fetch(self, source: str, into: str, name: str, sha256: bool = False, until: float | None = None) -> Fetched:
        """``source`` (a URL or s3://) written to the new file ``into``, hashed (BLAKE3; SHA-256 too with
        ``sha256``), by ``max_seconds`` from now or ``until`` (the job's downloads together) if sooner; FetchError,
        and no file, when it fails."""
        deadline = min(time.monotonic() + self.settings.max_seconds, until if until is not None else float("inf"))
        self._sha256 = sha256
        try:
            with open(into, "xb") as out:  # not synced: the submit's transaction copies it and syncs its copy
                if source.startswith("s3://"):
                    written = self._s3_get(source, out, deadline, name)
                else:
                    written = self._http_get(source, out, deadline, name)
        except BaseException:
            _remove(into)
            raise
        return Fetched(into, *written)

    # -- http ------------------------------------------------------------------------------------------------

    def session(self) -> requests.Session:
        if self._session is None:
            if self.settings.allow_private:
                self._session = requests.Session()
                self._session.trust_env = False  # no proxy from the environment: the URL is what is fetched
            else:
                self._session = public_only_session()
        return self._session

    def _http_get(self, url: str, out: BinaryIO, deadline: float, name: str) -> tuple[int, str, str]:
        timeout = self.settings.timeout_seconds
        for _hop in range(self.settings.max_redirects + 1):
            self.check_url(url)
            try:
                answer = self.session().get(url, stream=True, timeout=(timeout, timeout), allow_redirects=False,
                                            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
            except PrivateDestination as exc:
                raise FetchError(f"{where(url)}: {exc}; set [inputs] allow_private = true to fetch inputs inside "
                                 "this network") from None
            except requests.Timeout:
                raise FetchError(f"{where(url)}: no answer within {timeout:g} s ([inputs] timeout_seconds)") from None
            except requests.RequestException as exc:  # its own text names the URL's path: only its kind is said
                raise FetchError(f"{where(url)}: cannot connect ({type(exc).__name__})") from None
            except ValueError as exc:  # requests reads a redirect's Location even when not following it
                raise FetchError(f"{where(url)}: its answer cannot be read ({exc})") from None
            with answer:
                if answer.status_code in REDIRECTS and answer.headers.get("Location"):
                    url = urljoin(url, answer.headers["Location"])  # read by requests already (ValueError above)
                    continue
                if answer.status_code != 200:
                    raise FetchError(f"{where(url)}: HTTP {answer.status_code} {answer.reason or ''}".rstrip())
                encoding = answer.headers.get("Content-Encoding", "").strip().lower()
                if encoding not in ("", "identity"):  # its bytes are not the file's: they would be stored as it
                    raise FetchError(f"{where(url)}: the server sent it encoded (Content-Encoding: {encoding[:40]}) "
                                     "though asked for the file as it is")
                total = _length(answer.headers.get("Content-Length"))
                self._check_size(where(url), total)
                return self._copy(where(url), _read1(answer.raw), out, deadline, name, total)
        raise FetchError(f"{where(url)}: more than {self.settings.max_redirects} redirects ([inputs] max_redirects)")

    # -- s3 --------------------------------------------------------------------------------------------------

    def _s3_get(self, source: str, out: BinaryIO, deadline: float, name: str) -> tuple[int, str, str]:
        bucket, key = s3_parts(source)
        if self._s3 is None:
            # Credentials from the usual places only ([inputs] holds none), the timeouts of [inputs].
            try:
                self._s3 = s3.new_client(
                    used_for="s3:// inputs", endpoint_url=self.settings.s3_endpoint_url,
                    region=self.settings.s3_region, connect_timeout=self.settings.timeout_seconds,
                    read_timeout=self.settings.timeout_seconds)
            except s3.Refused as exc:  # no boto3, an unknown AWS_PROFILE
                raise FetchError(f"{source}: {exc}") from None
        # botocore comes with boto3, an optional dependency: the client above was made, so it is installed.
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            answer = self._s3.get_object(Bucket=bucket, Key=key)
        except NoCredentialsError:
            raise FetchError(f"{source}: no AWS credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                             "AWS_PROFILE, or an instance role)") from None
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
            raise FetchError(f"{source}: {_S3_CODES.get(code, code)}") from None
        except BotoCoreError as exc:  # the endpoint does not answer, a bad region: boto3's text names no secret
            raise FetchError(f"{source}: {exc}") from None
        total = _length(str(answer.get("ContentLength", "")))
        self._check_size(source, total)
        body = answer["Body"]
        try:
            return self._copy(source, iter(lambda: body.read(READ_BYTES), b""), out, deadline, name, total,
                              (BotoCoreError,))
        finally:
            body.close()

    # -- both ------------------------------------------------------------------------------------------------

    def _check_size(self, shown: str, total: int | None) -> None:
        if total is not None and total > self.max_bytes:
            raise FetchError(f"{shown} is {total:,} bytes; an input file may have at most {self.max_bytes:,} bytes "
                             "([assets] max_file_mb)")

    def _copy(self, shown: str, chunks: Iterator[bytes], out: BinaryIO, deadline: float, name: str,
              total: int | None, errors: tuple[type[BaseException], ...] = ()) -> tuple[int, str, str]:
        """The chunks into ``out``, hashed on the way; the size and the whole download's time bounded. A failure
        to read (urllib3's, an OSError, or one of ``errors``) is said with what was read before it."""
        hashes = _Hashes(self._sha256)
        if self.progress is not None:
            self.progress.start(name, total)
        try:
            for chunk in self._bounded(shown, chunks, deadline, errors):
                if hashes.size + len(chunk) > self.max_bytes:
                    self._check_size(shown, hashes.size + len(chunk))
                hashes.update(chunk)
                out.write(chunk)
                if self.progress is not None:
                    self.progress.advance(len(chunk))
        finally:
            if self.progress is not None:
                self.progress.end()
        if total is not None and hashes.size != total:
            raise FetchError(f"{shown}: the answer ended after {hashes.size:,} of its {total:,} bytes")
        return hashes.size, HASH_PREFIX + hashes.blake3.hexdigest(), hashes.sha256.hexdigest() if hashes.sha256 else ""

    def _bounded(self, shown: str, chunks: Iterator[bytes], deadline: float,
                 errors: tuple[type[BaseException], ...]) -> Iterator[bytes]:
        """``chunks`` until they end; FetchError once the service stops, the deadline passes or a read fails."""
        read = 0
        while True:
            if self.stopping is not None and self.stopping.is_set():
                raise FetchError(f"{shown}: not fetched: the service is stopping")
            if time.monotonic() > deadline:
                raise FetchError(f"{shown}: not fetched within {self.settings.max_seconds:g} s ([inputs] max_seconds)")
            try:
                chunk = next(chunks, b"")
            except (TransportError, OSError, *errors) as exc:
                raise FetchError(f"{shown}: {_read_failure(exc, self.settings.timeout_seconds)} after {read:,} "
                                 "bytes") from None
            if not chunk:
                return
            read += len(chunk)
            yield chunk


class _Hashes:
    """The BLAKE3 of the bytes fed to it, their SHA-256 when asked for, and their count."""

    def __init__(self, sha256: bool) -> None:
        self.blake3 = blake3.blake3()
        self.sha256 = hashlib.sha256() if sha256 else None
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.blake3.update(chunk)
        if self.sha256 is not None:
            self.sha256.update(chunk)


_S3_CODES = {
    "NoSuchKey": "no such object", "404": "no such object", "NoSuchBucket": "no such bucket",
    "AccessDenied": "access denied (the credentials may not read it)", "403": "access denied",
    "InvalidAccessKeyId": "the access key is not known to the service", "SignatureDoesNotMatch":
    "the secret key does not match the access key",
}


def _read1(raw: Any) -> Iterator[bytes]:
    """The body's bytes as they arrive (urllib3's ``read1``: what one receive gives, not a full buffer), so the
    whole download's deadline is looked at between receives even when a server sends a byte at a time."""
    while chunk := raw.read1(READ_BYTES):
        yield chunk


def _read_failure(exc: BaseException, timeout: float) -> str:
    text = type(exc).__name__
    if isinstance(exc, TimeoutError) or "timeout" in text.lower() or "timed out" in str(exc).lower():
        return f"no bytes for {timeout:g} s ([inputs] timeout_seconds)"
    return f"the connection failed ({text})"


def _length(value: str | None) -> int | None:
    """A Content-Length's value, None when there is none or it is no number (ASCII digits only: ``"²".isdigit()``
    is true, and int() refuses it)."""
    return int(value) if value and value.isascii() and value.isdigit() else None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
