"""Input files in a line's ``set``: ``{"file": "photos/cat.png"}``, ``{"url": "https://…"}``, ``{"s3":
"s3://bucket/key"}`` or an API v2 ``core/ASSET`` reference.

A file comes from a place the operator chose (``InputFiles.roots``): for ``comfysup submit`` the jobs file's
folder and ``[assets] input_roots``, for the broker ``[rabbitmq] inputs_dir`` (none when unset), for the API
none. It is named relative to one of them, never absolute and never with ``..``, reached through no symlink,
and only a regular file is read (opened non-blocking and checked with ``fstat`` first: a FIFO cannot hang
submit or the consumer), its size bounded.

Each file is read and hashed (BLAKE3) once per submit however many lines name it, checked against the size
limits, and replaced in ``set`` by the reference the job stores (comfysup.assets). The reference carries the
hash, so the job's spec hash covers the file's content: the same id submitted again with a changed file is a
changed job, refused like one.

A ``url`` or ``s3`` input (or a ``core/ASSET`` reference whose ``info`` has a ``url``) is fetched at submit
(comfysup.jobs.fetch: the private-address refusal, the size, time and redirect bounds) into a staging folder of
this object, once per submit however many lines name it (a failure too is remembered: a thousand lines of one
dead URL wait for it once), its optional ``"blake3"`` or ``"sha256"`` checked; the submit's transaction copies
it into the asset store, and ``release`` removes the folder once the jobs are inserted (or refused). Such an
input names its job by its reference as written, not by the bytes fetched (comfysup.jobs.identity).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from comfysup import assets, safefs
from comfysup.config import InputsConfig
from comfysup.destinations import is_http_url
from comfysup.jobs.sources import FetchError, s3_parts, where
from comfysup.jobs.values import MAX_URL_CHARS, JobLineError, check_text, did_you_mean
from comfysup.queue import values

if TYPE_CHECKING:
    import threading

    from comfysup.jobs.fetch import Fetched, Fetcher, Progress
    from comfysup.queue.run_values import NewAsset

MIB = 1024 * 1024
REMOTE_KEYS = frozenset({"url", "s3", "sha256", "blake3", "name"})
"""What an input from elsewhere may say: where (one of url, s3), the hash it must have, the file's name."""
_HEX64 = re.compile(r"[0-9a-f]{64}")


class InputFiles:
    """Resolves the file values of every line of one jobs file (relative to ``base_dir``)."""

    def __init__(self, base_dir: Path, roots: tuple[Path, ...] | None = None, where: str = "the jobs file's folder",
                 max_file_bytes: int = 100 * MIB, max_job_bytes: int = 512 * MIB, remote: InputsConfig | None = None,
                 s3_buckets: tuple[str, ...] | None = None, progress: Progress | None = None,
                 stored: Callable[[str], int | None] | None = None, stopping: threading.Event | None = None) -> None:
        self.base_dir = base_dir
        self.roots: tuple[Path, ...] = (base_dir,) if roots is None else roots
        """The folders an input file may come from (the first that has it); ``base_dir`` alone when none are given.
        Empty: none, file inputs are refused (``where`` says why)."""
        self.where = where
        """The roots as a person reads them, for messages."""
        self.max_file_bytes = max_file_bytes
        self.max_job_bytes = max_job_bytes
        self.remote = remote if remote is not None else InputsConfig()
        """How ``url`` and ``s3`` inputs are fetched ([inputs])."""
        self.s3_buckets = s3_buckets
        """The buckets an ``s3`` input may name; None: any the credentials reach (comfysup submit's own user)."""
        self.progress = progress
        """Shown while an input downloads (comfysup submit on a terminal)."""
        self.stored = stored
        """The asset store's size of a content by hash (None: not held): an input from elsewhere whose ``blake3``
        the store holds already is not fetched again (a file submitted again, a URL since gone)."""
        self.stopping = stopping
        """Set when the service stops (the API's): a download in flight ends at its next bytes."""
        self._seen: dict[tuple[str, int, int, int], NewAsset] = {}
        self._fetched: dict[str, Fetched | str] = {}
        """By source: the fetched file, or why it could not be fetched."""
        self._staging: str | None = None
        self._staging_pid = 0
        self._fetcher: Fetcher | None = None

    def resolve(self, params: dict[str, Any],
                until: float | None = None) -> tuple[dict[str, Any], tuple[NewAsset, ...]]:
        """``params`` with each file value replaced by its reference, and the assets they name; its downloads end by
        ``until`` (default: ``[inputs] max_seconds`` from now), and stop once the files pass ``max_job_bytes``."""
        if not any(isinstance(v, dict) for v in params.values()):
            return params, ()
        out, found, total, reasons = dict(params), {}, 0, []
        until = until if until is not None else time.monotonic() + self.remote.max_seconds  # the line's downloads
        for key, value in params.items():
            if not isinstance(value, dict):
                continue
            if total > self.max_job_bytes:
                break  # refused already: nothing more is read or downloaded for this line
            try:
                if set(value) == {"file"}:
                    asset = self._file(key, value["file"])
                elif (source := remote_source(value)) is not None:
                    asset = self._remote(key, source, until)
                elif value.get("__type") == assets.ASSET_TYPE:
                    asset = self._reference(key, value)
                else:
                    continue  # another object value: ComfyUI's own business (checked as any value)
            except JobLineError as exc:  # every input's problem is reported, not only the first
                reasons += exc.reasons
                continue
            out[key] = assets.reference(asset.hash, asset.name, asset.size)
            if asset.hash not in found:
                found[asset.hash] = asset
                total += asset.size
        if total > self.max_job_bytes:
            reasons.append(f"the job's input files are {total:,} bytes together; at most {self.max_job_bytes:,} "
                           "([assets] max_job_mb)")
        if reasons:
            raise JobLineError(*reasons)
        return out, tuple(found.values())

    def _file(self, key: str, value: Any) -> NewAsset:
        if not isinstance(value, str) or not value:
            raise JobLineError(f"set {key!r}: \"file\" must be a path relative to {self.where}")
        check_text(value, f"set {key!r}: file")
        if not self.roots:
            raise JobLineError(f"set {key!r}: file {value!r}: {self.where}; send the file some other way "
                               "(a core/ASSET reference to an upload)")
        relative = value.replace("\\", "/")
        if PurePosixPath(relative).is_absolute() or ".." in PurePosixPath(relative).parts:
            raise JobLineError(f"set {key!r}: file {value!r}: an input file is named relative to {self.where}, "
                               "with no .. and no absolute path")
        relative = "/".join(p for p in PurePosixPath(relative).parts if p != ".")
        fd, root = self._open(key, value, relative)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            ident = (str(root / relative), st.st_dev, st.st_ino, st.st_mtime_ns)
            known = self._seen.get(ident)
            if known is not None and known.size == st.st_size:
                return known
            if st.st_size > self.max_file_bytes:
                raise JobLineError(self._too_large(key, value, st.st_size))
            try:
                digest, size = assets.hash_stream(f, self.max_file_bytes)
            except ValueError:
                raise JobLineError(self._too_large(key, value, st.st_size)) from None
            except OSError as exc:
                raise JobLineError(f"set {key!r}: {value} cannot be read ({exc.strerror})") from None
        asset = self._seen[ident] = values.NewAsset(digest, size, PurePosixPath(relative).name, str(root / relative))
        return asset

    def _open(self, key: str, value: str, relative: str) -> tuple[int, Path]:
        """The file below the first root that has it, opened (see comfysup.safefs.open_beneath), and that root."""
        for root in self.roots:
            try:
                return safefs.open_beneath(root, relative), root
            except FileNotFoundError:
                continue
            except safefs.Escapes as exc:
                raise JobLineError(f"set {key!r}: file {value!r}: {exc.strerror}; an input file is a regular "
                                   f"file below {self.where}, reached through no symlink") from None
            except NotADirectoryError:
                raise JobLineError(f"set {key!r}: no such file {value} (a part of it is a file, not a folder)") \
                    from None
            except IsADirectoryError:
                raise JobLineError(f"set {key!r}: {value} is a folder, not a file") from None
            except PermissionError:
                raise JobLineError(f"set {key!r}: {value} cannot be read (permission denied)") from None
        raise JobLineError(f"set {key!r}: no such file {value} (relative to {self.where})")

    def _too_large(self, key: str, value: str, size: int) -> str:
        return (f"set {key!r}: {value} is {size:,} bytes; an input file may have at most {self.max_file_bytes:,} bytes "
                "([assets] max_file_mb)")

    def _reference(self, key: str, value: dict[str, Any]) -> NewAsset:
        info = value.get("info")
        digest = info.get("hash") if isinstance(info, dict) else None
        if not assets.is_hash(digest):
            raise JobLineError(f"set {key!r}: a core/ASSET reference needs info.hash \"blake3:<64 hex digits>\"")
        name = info.get("file_path") or info.get("name") or ""
        if not isinstance(name, str):
            raise JobLineError(f"set {key!r}: info.file_path must be a string")
        size = info.get("size", 0)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            size = 0
        return values.NewAsset(str(digest), size, PurePosixPath(check_text(name, "file_path").replace("\\", "/")).name)

    # -- inputs from elsewhere -------------------------------------------------------------------------------

    def _remote(self, key: str, value: dict[str, Any], until: float) -> NewAsset:
        source, expected, name = self._remote_shape(key, value)
        if expected.keys() == {"blake3"} and self.stored is not None and (size := self.stored(
                digest := assets.HASH_PREFIX + expected["blake3"])) is not None:
            return values.NewAsset(digest, size, name)  # held: named by its hash, as an upload's reference is
        fetched = self._fetch(key, source, name, "sha256" in expected, until)
        got = {"blake3": fetched.blake3.removeprefix(assets.HASH_PREFIX), "sha256": fetched.sha256}
        wrong = [f"set {key!r}: {where(source)} has {algorithm} {got[algorithm]}, not the expected {digest}: the "
                 "file changed, or the expected hash is wrong" for algorithm, digest in expected.items()
                 if got[algorithm] != digest]
        if wrong:
            raise JobLineError(*wrong)
        return values.NewAsset(fetched.blake3, fetched.size, name, fetched.path)

    def _remote_shape(self, key: str, value: dict[str, Any]) -> tuple[str, dict[str, str], str]:
        """The source, the expected hashes (bare hex by algorithm) and the file name of an input from elsewhere;
        JobLineError with every problem of its shape (nothing is fetched for a reference that is wrong)."""
        reasons = _unknown_remote_keys(key, value)
        if "url" in value and "s3" in value:
            reasons.append(f"set {key!r}: give \"url\" or \"s3\", not both")
        kind = "url" if "url" in value else "s3"
        source = value[kind]
        if not isinstance(source, str) or not source or len(source) > MAX_URL_CHARS:
            reasons.append(f"set {key!r}: \"{kind}\" must be " + ("an https:// URL" if kind == "url" else
                           "s3://bucket/key") + f" of at most {MAX_URL_CHARS} characters")
            raise JobLineError(*reasons)
        check_text(source, f"set {key!r}: {kind}")
        expected = _expected_hashes(key, value, reasons)
        name = value.get("name", _name_of(source))
        reasons += _name_problems(key, name)
        if kind == "url" and not (source.startswith(("http://", "https://")) and is_http_url(source)):
            reasons.append(f"set {key!r}: url {where(source)} is not an http:// or https:// URL"
                           + ("; write {\"s3\": \"s3://…\"} for a bucket" if source.startswith("s3://") else ""))
        if kind == "s3":
            reasons += self._bucket_problems(key, source)
        if reasons:
            raise JobLineError(*reasons)
        return source, expected, name

    def _bucket_problems(self, key: str, source: str) -> list[str]:
        try:
            bucket, _ = s3_parts(source)
        except FetchError as exc:
            return [f"set {key!r}: s3 {exc}"]
        if self.s3_buckets is not None and bucket not in self.s3_buckets:
            allowed = ", ".join(self.s3_buckets) or "none: it is empty, and this door reads no bucket unless named"
            return [f"set {key!r}: s3 bucket {bucket!r} is not one of [inputs] s3_buckets ({allowed})"]
        return []

    def _fetch(self, key: str, source: str, name: str, sha256: bool, until: float) -> Fetched:
        """The source's file, fetched once per submit (its SHA-256 only when a line expects one); a failure,
        remembered, is the same reason every time."""
        known = self._fetched.get(source)
        if known is None:
            if self._fetcher is None:
                # Imported here, not at the top: comfysup.jobs.fetch loads requests and urllib3, which would about
                # double every submit's start-up; only a line with an input from elsewhere needs them.
                from comfysup.jobs.fetch import Fetcher

                self._fetcher = Fetcher(self.remote, self.max_file_bytes, self.progress, self.stopping)
            try:
                if time.monotonic() > until:  # not remembered: another line has time of its own
                    raise JobLineError(f"set {key!r}: {where(source)}: not fetched: the job's inputs took more "
                                       f"than {self.remote.max_seconds:g} s together ([inputs] max_seconds)")
                known = self._fetcher.fetch(source, self._staged_name(), name, sha256, until)
            except FetchError as exc:
                known = str(exc)
            self._fetched[source] = known
        if isinstance(known, str):
            raise JobLineError(f"set {key!r}: {known}")
        if sha256 and not known.sha256:
            known = self._fetched[source] = known.with_sha256()
        return known

    def _staged_name(self) -> str:
        if self._staging is None or self._staging_pid != os.getpid():
            self._staging, self._staging_pid = tempfile.mkdtemp(prefix="comfysup-inputs-"), os.getpid()
        return os.path.join(self._staging, str(len(self._fetched)))

    def release(self) -> None:
        """Remove the fetched files (once the jobs that name them are inserted or refused) and forget them: the
        next submit fetches again. Only by the process that fetched them (not a forked reader of the file)."""
        if self._staging is not None and self._staging_pid == os.getpid():
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
            self._fetched.clear()


def _unknown_remote_keys(key: str, value: dict[str, Any]) -> list[str]:
    """A problem for each key an input from elsewhere may not have, with the nearest one it may."""
    reasons = []
    for unknown in sorted(value.keys() - REMOTE_KEYS):
        hint = did_you_mean(unknown, REMOTE_KEYS)
        reasons.append(f"set {key!r}: unknown key {unknown!r} of an input from elsewhere; "
                       f"{hint + ' ' if hint else ''}it may have {', '.join(sorted(REMOTE_KEYS))}")
    return reasons


def _expected_hashes(key: str, value: dict[str, Any], reasons: list[str]) -> dict[str, str]:
    """The hashes an input from elsewhere must have, bare lowercase hex by algorithm; each that is not 64 hex
    digits is a problem added to ``reasons``."""
    expected = {}
    for algorithm in ("blake3", "sha256"):
        if algorithm not in value:
            continue
        digest = value[algorithm]
        digest = digest.lower().removeprefix(f"{algorithm}:") if isinstance(digest, str) else ""
        if _HEX64.fullmatch(digest):
            expected[algorithm] = digest
        else:
            reasons.append(f"set {key!r}: \"{algorithm}\" must be 64 hex digits (or \"{algorithm}:<hex>\")")
    return expected


def _name_problems(key: str, name: Any) -> list[str]:
    """What is wrong with the file name an input from elsewhere is stored under (none: [])."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        return [f"set {key!r}: \"name\" must be a file name, like cat.png (its suffix tells ComfyUI's loaders the "
                "kind of file)"]
    check_text(name, f"set {key!r}: name")
    return []


def remote_source(value: dict[str, Any]) -> dict[str, Any] | None:
    """The input from elsewhere a ``set`` value names (``{"url"|"s3": …}``, or a ``core/ASSET`` reference by
    ``info.url``), as ``{"url"|"s3": …}``; None for any other value (a file, an uploaded asset, ComfyUI's own)."""
    if value.get("__type") == assets.ASSET_TYPE:
        info = value.get("info")
        return remote_value(info) if isinstance(info, dict) and "url" in info and "id" not in info else None
    return value if "url" in value or "s3" in value else None


def remote_value(info: dict[str, Any]) -> dict[str, Any]:
    """A ``core/ASSET`` reference's ``info`` with a ``url`` (and no ``id``: the API's AssetReference extended by the
    Asset schema's own ``url``) as an input from elsewhere: ``url`` (or ``s3`` for ``s3://``), its ``hash``
    (``blake3:<hex>`` or ``sha256:<hex>``) as ``blake3`` or ``sha256``, ``file_path`` as its ``name``."""
    url = info.get("url")
    value: dict[str, Any] = {"s3" if isinstance(url, str) and url.startswith("s3://") else "url": url}
    digest = info.get("hash")
    if isinstance(digest, str) and digest:
        algorithm, _, hexa = digest.partition(":")
        value[algorithm if algorithm in ("blake3", "sha256") and hexa else "blake3"] = digest
    if info.get("file_path"):
        value["name"] = info["file_path"]
    return value


def _name_of(source: str) -> str:
    """The file name a URL's path or an S3 key ends with (``cat.png``); ``input`` when it ends with none."""
    try:
        path = urlsplit(source).path if not source.startswith("s3://") else source.partition("//")[2]
    except ValueError:  # no URL ("http://[::1"): refused as one by the shape's check, not a traceback here
        return "input"
    name = unquote(PurePosixPath(path).name) if path.strip("/") else ""
    return name if name and not {"/", "\\", "\0"} & set(name) and name not in (".", "..") else "input"
