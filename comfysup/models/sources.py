"""Fetching one model file into its partial file: over HTTP(S) with ``Range``, from S3, or copied from a local path.

Every source continues what the partial file holds (``Partial.size`` bytes) rather than starting over, and says
how a failure should be taken: ``Transient`` (the connection broke, a timeout, a 5xx: the pull tries again from
where it stopped) or ``FetchError`` (404, 403, not a regular file, no boto3: trying again cannot help). Network
calls have a connect and a read timeout and follow at most ``MAX_REDIRECTS`` redirects, so a pull never hangs on a
server that stopped answering.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import stat
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import urllib3

from comfysup import __version__
from comfysup.config.models import shown_url
from comfysup.errors import ComfysupError
from comfysup.models.cache import CHUNK, Partial
from comfysup.storage import s3

CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 60.0
"""The longest wait for the next bytes of a download before it is taken as broken (and continued)."""
MAX_REDIRECTS = 5
TOKENS = {"huggingface.co": "HF_TOKEN", "civitai.com": "CIVITAI_API_TOKEN"}
"""Hosts whose gated files need ``Authorization: Bearer <token>``, and the variable that holds it (the names their
own tools read). The token goes to that host alone: urllib3 drops the header when a redirect leaves it (to a CDN,
whose signed URL needs none)."""
Progress = Callable[[int], None]
"""Called with the number of bytes just written (the progress bar's update)."""


class FetchError(ComfysupError):
    """A model file cannot be fetched from its source (trying again would not help)."""


class Transient(Exception):
    """The fetch broke off in a way that a new try may get past (continued from the partial file)."""


def fetch(url: str, part: Partial, progress: Progress, on_total: Callable[[int | None], None]) -> None:
    """Fetch the rest of ``url`` into ``part``; ``on_total`` learns the whole file's size once known."""
    if "://" not in url:
        fetch_local(url, part, progress, on_total)
    elif url.lower().startswith("s3://"):
        fetch_s3(url, part, progress, on_total)
    else:
        fetch_http(url, part, progress, on_total)


# -- HTTP ---------------------------------------------------------------------------------------------------------

_POOLS: dict[str, urllib3.PoolManager] = {}
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def _pool(url: str) -> urllib3.PoolManager:
    """A kept-alive pool, through the proxy the environment names for this URL (``https_proxy``, ``http_proxy``,
    ``no_proxy``, as curl and requests read them): GPU machines often reach the internet only through one."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme.lower(), "")
    if proxy and (urllib.request.proxy_bypass(host) or _loopback(host)):  # as Go's net/http: this machine's own
        proxy = ""
    if proxy not in _POOLS:
        _POOLS[proxy] = urllib3.ProxyManager(proxy) if proxy else urllib3.PoolManager()
    return _POOLS[proxy]


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fetch_http(url: str, part: Partial, progress: Progress, on_total: Callable[[int | None], None]) -> None:
    """GET with ``Range: bytes=<held>-`` (and ``If-Range`` with the validator the first answer gave, so a file that
    changed at the source is sent whole instead of spliced onto the old bytes)."""
    headers = {"User-Agent": f"comfysup/{__version__}", "Accept-Encoding": "identity"}
    host = (urlsplit(url).hostname or "").lower()
    variable = next((v for h, v in TOKENS.items() if host == h or host.endswith("." + h)), "")
    if os.environ.get(variable):
        headers["Authorization"] = f"Bearer {os.environ[variable]}"
    meta = part.read_meta()
    if part.size:
        headers["Range"] = f"bytes={part.size}-"
        etag = meta.get("etag", "")  # a weak ETag may not be used with If-Range (RFC 9110 13.1.5)
        validator = etag if etag and not etag.startswith("W/") else meta.get("last_modified", "")
        if validator:
            headers["If-Range"] = validator
    retries = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=MAX_REDIRECTS,
                            raise_on_redirect=True, raise_on_status=False)
    shown = shown_url(url)
    try:
        resp = _pool(url).request("GET", url, headers=headers, retries=retries, preload_content=False,
                               decode_content=False,
                               timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT))
    except urllib3.exceptions.MaxRetryError as exc:
        if isinstance(exc.reason, urllib3.exceptions.ResponseError):
            raise FetchError(f"{shown}: more than {MAX_REDIRECTS} redirects") from None
        raise Transient(f"{shown}: {_reason(exc.reason)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Transient(f"{shown}: {_reason(exc)}") from None
    try:
        _receive(resp, shown, part, progress, on_total)
    except BaseException:
        resp.close()  # never hand a connection in the middle of a body back to the pool
        raise
    resp.release_conn()


def _receive(resp: Any, shown: str, part: Partial, progress: Progress,
             on_total: Callable[[int | None], None]) -> None:
    if resp.status == 416 and part.size:  # the partial file may already be whole: its hash decides
        _check_whole(resp, shown, part, on_total)
        return
    _check_status(resp.status, shown)
    if resp.status == 206:
        _check_range(resp, shown, part, on_total)
    else:
        _start_whole(resp, part, on_total)
    try:
        for chunk in resp.stream(CHUNK, decode_content=False):
            part.write(chunk)
            progress(len(chunk))
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Transient(f"{shown}: broke off after {part.size} bytes: {_reason(exc)}") from None


def _check_whole(resp: Any, shown: str, part: Partial, on_total: Callable[[int | None], None]) -> None:
    """A 416 to a Range from the partial file's end: whole when the file is as long as held, else started over."""
    found = re.fullmatch(r"bytes \*/(\d+)", resp.headers.get("Content-Range", ""))
    if found and int(found.group(1)) == part.size:
        on_total(part.size)
        return
    held = part.size
    part.restart()
    raise Transient(f"{shown}: the server cannot continue at byte {held}; starting over")


def _check_status(status: int, shown: str) -> None:
    """A status a new try may get past is Transient; one that is no file answer a FetchError saying why."""
    if status in (429, 500, 502, 503, 504):
        raise Transient(f"{shown}: HTTP {status}")
    if status not in (200, 206):
        token = "; set $HF_TOKEN (Hugging Face) or $CIVITAI_API_TOKEN (Civitai) for a gated file"
        hint = {401: "it needs credentials" + token, 403: "access is refused (credentials, or an expired link?)",
                404: "no such file (check the url)", 410: "the file was removed"}.get(status, "not a file answer")
        raise FetchError(f"{shown}: HTTP {status}: {hint}")


def _check_range(resp: Any, shown: str, part: Partial, on_total: Callable[[int | None], None]) -> None:
    """A 206 continues the partial file only from where it ends; any other range starts over."""
    found = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
    if not found or int(found.group(1)) != part.size:
        part.restart()
        raise Transient(f"{shown}: the server sent another range than asked; starting over")
    on_total(int(found.group(3)) if found.group(3) != "*" else None)


def _start_whole(resp: Any, part: Partial, on_total: Callable[[int | None], None]) -> None:
    """A 200: the whole file comes (again), and its validators are kept to continue it later."""
    length = resp.headers.get("Content-Length")
    if part.size:
        part.restart()  # no Range support, or the file changed (If-Range): the whole file comes again
    on_total(int(length) if length and length.isascii() and length.isdigit() else None)  # "²".isdigit()
    part.write_meta({k: v for k, v in (("etag", resp.headers.get("ETag", "")),
                                        ("last_modified", resp.headers.get("Last-Modified", ""))) if v})


def _reason(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else "no answer"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return f"no bytes for {READ_TIMEOUT:g} s"
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return f"no connection within {CONNECT_TIMEOUT:g} s"
    return text.split(": ", 1)[-1] if "Connection" in text else text


# -- S3 -----------------------------------------------------------------------------------------------------------

def s3_client() -> Any:
    """The one S3 client of a pull: boto3's default credentials (environment, ~/.aws, the instance's role) and
    endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for an S3-compatible service), with the timeouts of
    every download of a pull. Refused when boto3 is missing or cannot make a client (an unknown AWS_PROFILE)."""
    return s3.new_client(used_for="s3:// model URLs", connect_timeout=CONNECT_TIMEOUT,
                         read_timeout=READ_TIMEOUT)


def fetch_s3(url: str, part: Partial, progress: Progress, on_total: Callable[[int | None], None],
             client: Any = None) -> None:
    """GetObject with ``Range`` from the partial file's size; the object's ETag is kept to continue only it."""
    try:
        client = client or s3_client()
    except s3.Refused as exc:
        raise FetchError(f"{url}: {exc}") from None
    # botocore is an optional dependency (comfysup[s3]), present once a client was made above.
    from botocore.exceptions import BotoCoreError

    answer = _get_object(client, url, part)
    found = _CONTENT_RANGE.fullmatch(answer.get("ContentRange") or "")
    if part.size and not found:
        part.restart()
    if found and found.group(3) != "*":
        on_total(int(found.group(3)))
    else:
        on_total(answer.get("ContentLength"))
    part.write_meta({"etag": answer.get("ETag", "")})
    try:
        for chunk in answer["Body"].iter_chunks(CHUNK):
            part.write(chunk)
            progress(len(chunk))
    except (BotoCoreError, OSError) as exc:
        raise Transient(f"{url}: broke off after {part.size} bytes: {exc}") from None


def _get_object(client: Any, url: str, part: Partial) -> dict[str, Any]:
    """The answer to GetObject from the partial file's end (only of the object whose ETag it holds), or the
    failure sorted: Transient where a new try may get past it, else FetchError."""
    # botocore is an optional dependency (comfysup[s3]), present once a client was made.
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        ProfileNotFound,
    )

    parts = urlsplit(url)
    request: dict[str, Any] = {"Bucket": parts.netloc, "Key": parts.path.lstrip("/")}
    etag = part.read_meta().get("etag")
    if part.size:
        request["Range"] = f"bytes={part.size}-"
        if etag:
            request["IfMatch"] = etag
    try:
        return client.get_object(**request)
    except ClientError as exc:
        raise _client_error(url, str(exc.response.get("Error", {}).get("Code", "")), exc, part) from None
    except (NoCredentialsError, PartialCredentialsError, NoRegionError, ProfileNotFound) as exc:
        raise FetchError(f"{url}: {exc} (boto3 reads AWS_ACCESS_KEY_ID, ~/.aws or the instance's role)") from None
    except (BotoCoreError, OSError) as exc:
        raise Transient(f"{url}: {exc}") from None


def _client_error(url: str, code: str, exc: Exception, part: Partial) -> Exception:
    """What S3's error ``code`` means for the pull: a range that cannot be continued starts over, a busy service
    is Transient, anything else a FetchError."""
    if code in ("InvalidRange", "PreconditionFailed", "412", "416") and part.size:
        part.restart()
        return Transient(f"{url}: the object cannot be continued at that byte (changed?); starting over")
    if code in ("SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "500", "503"):
        return Transient(f"{url}: {code}")
    return FetchError(f"{url}: {code or exc}")


# -- a local file -------------------------------------------------------------------------------------------------

def fetch_local(path: str, part: Partial, progress: Progress, on_total: Callable[[int | None], None]) -> None:
    """Copy a regular file; a FIFO, a device or a folder is refused (opened without blocking, so never waited on).
    A link to a regular file is followed, unlike safefs.open_regular's: the path is the operator's own choice, and
    Hugging Face's cache holds every downloaded file as a link into its blobs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise FetchError(f"{path}: cannot open: {exc.strerror}") from None
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FetchError(f"{path}: not a regular file; a local url names a model file on this machine")
        os.set_blocking(fd, True)
        if part.size > info.st_size:
            part.restart()
        on_total(info.st_size)
        os.lseek(fd, part.size, os.SEEK_SET)
        while chunk := os.read(fd, CHUNK):
            part.write(chunk)
            progress(len(chunk))
