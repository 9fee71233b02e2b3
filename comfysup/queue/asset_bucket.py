"""The asset store's contents in a bucket ([assets] url): ``<prefix>/<2 hex>/<blake3 hex>``, so machines
on one PostgreSQL queue share input files through the bucket rather than through the database's chunks or a
mounted folder.

The same promise as the folder (comfysup.queue.assets): the object is stored and confirmed before the row that
says it exists is committed (a crash leaves at most an object without a row, never a row without its bytes);
the bytes are hashed again while they are copied to a staging file, so a file changed since validation is
refused; and they are hashed again after they are read back, so the runner never uploads damaged bytes to a
server under the old hash. A content stored by another machine (the same key, the same size) is not uploaded
again.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from comfysup.assets import HASH_PREFIX
from comfysup.errors import QueueError
from comfysup.storage import s3

PART_BYTES = 64 * 2**20
"""Inputs are at most [assets] max_file_mb (100 MiB by default): larger ones go up in parts of this size."""


class AssetBucket:
    """Put, get, read a range of and delete contents by their BLAKE3 hash."""

    def __init__(self, location: s3.Location, settings: s3.Settings) -> None:
        self.location = location
        self.settings = settings

    def key(self, digest: str) -> str:
        hexa = digest.removeprefix(HASH_PREFIX)
        return self.location.key(hexa[:2], hexa)

    def uri(self, digest: str) -> str:
        return self.location.uri(self.key(digest))

    def _client(self) -> Any:
        return s3.client(self.settings)

    def _failed(self, exc: BaseException, doing: str, digest: str) -> QueueError:
        return QueueError(str(s3.sort_error(exc, f"{doing} input {digest} at {self.uri(digest)}", self.settings)))

    def put(self, digest: str, size: int, copy: Callable[[Callable[[bytes], Any]], int]) -> int:
        """Store the content ``copy`` writes (through the hash check it makes) unless the bucket holds it already;
        confirmed before this returns. QueueError when the service refuses or does not answer: the submit's
        transaction is rolled back, nothing is half-submitted."""
        try:
            head = self._client().head_object(Bucket=self.location.bucket, Key=self.key(digest))
            if head.get("ContentLength") == size:
                return size  # stored by another machine, or by a submit that rolled back: the same content
        except Exception as exc:
            if not _missing(exc):
                raise self._failed(exc, "storing", digest) from None
        fd, tmp = tempfile.mkstemp(prefix=".comfysup-input-")
        try:
            sha = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                def write(data: bytes) -> None:
                    sha.update(data)
                    out.write(data)

                stored = copy(write)
            try:
                s3.upload(self._client(), self.location.bucket, self.key(digest), Path(tmp), stored, sha.hexdigest(),
                          PART_BYTES)
            except Exception as exc:
                raise self._failed(exc, "storing", digest) from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        return stored

    def get(self, digest: str, size: int) -> bytes | None:
        """The content's bytes (at most ``size`` + 1 read), None when the bucket does not hold it."""
        try:
            answer = self._client().get_object(Bucket=self.location.bucket, Key=self.key(digest))
            return bytes(answer["Body"].read(size + 1))
        except Exception as exc:
            if _missing(exc):
                return None
            raise self._failed(exc, "reading", digest) from None

    def read_range(self, digest: str, start: int, length: int) -> bytes | None:
        """``length`` bytes from ``start`` (b"" past the end), None when the bucket does not hold it."""
        try:
            answer = self._client().get_object(Bucket=self.location.bucket, Key=self.key(digest),
                                               Range=f"bytes={start}-{start + length - 1}")
            return bytes(answer["Body"].read())
        except Exception as exc:
            if _status(exc) == 416:
                return b""
            if _missing(exc):
                return None
            raise self._failed(exc, "reading", digest) from None

    def delete(self, digests: Iterable[str]) -> None:
        """Best-effort, after the rows are gone (as the folder's unlink): one that stays is only space."""
        keys = [{"Key": self.key(d)} for d in digests]
        for start in range(0, len(keys), s3.DELETE_BATCH):
            try:
                self._client().delete_objects(Bucket=self.location.bucket,
                                              Delete={"Objects": keys[start:start + s3.DELETE_BATCH], "Quiet": True})
            except Exception:  # the rows are gone: an object left costs space, not correctness
                pass


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _missing(exc: BaseException) -> bool:
    response = getattr(exc, "response", None) or {}
    return _status(exc) == 404 or response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")
