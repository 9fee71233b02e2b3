"""The result store in a bucket ([store] url): the same ``prepare``/``write`` as ResultStore, each file
downloaded to a staging file in ``[store] dir`` (hashed and checked there exactly as on disk), uploaded to
``<prefix>/<job id>/<name>``, confirmed by the service, and only then returned for the job's ``done``.

The key is stable per job and name, so an attempt that died between its upload and its ``done`` is retried by
overwriting the same object, never by adding a second one. The staging file is removed whether the upload
worked or not (a job being downloaded is not done: nothing staged belongs to a recorded result). A service
that does not answer, answers 5xx, or refuses now what it accepted at start is a transient failure of the
result store (an OSError, as a full disk): the job is retried with the usual backoff and is never ``done``
before its objects are confirmed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from comfysup import safefs
from comfysup.config import Config
from comfysup.errors import ConfigError
from comfysup.queue.base import Output
from comfysup.runner.store import PROGRESS_SECONDS, ResultStore, every
from comfysup.storage import s3


class ObjectStore:
    """Outputs uploaded to a bucket through a local staging folder; ``Output.path`` is the object's s3:// URI."""

    def __init__(self, staging: ResultStore, location: s3.Location, settings: s3.Settings, part_bytes: int) -> None:
        self.staging = staging
        self.location = location
        self.settings = settings
        self.part_bytes = part_bytes
        self.root = staging.root

    def job_dir(self, job_id: str) -> Path:
        return self.staging.job_dir(job_id)

    def prepare(self, job_id: str) -> Path:
        """The job's staging folder, emptied of an interrupted attempt's files (ResultStore.prepare). Objects an
        earlier attempt uploaded under the same names are overwritten by this one's; any under other names (a run
        repeated after its server died) are never recorded, and ``comfysup prune`` removes the job's whole
        prefix with it."""
        return self.staging.prepare(job_id)

    def write(self, job_id: str, relative: str, chunks: Iterable[bytes], *, limit_bytes: int | None = None,
              limit_name: str = "[store] max_file_mb", progress: Callable[[], None] | None = None) -> Output:
        """ResultStore.write to the staging folder, then the upload; ``progress`` (the attempt's checkpoint) is
        called during both, so an upload longer than the lease keeps the job, and a cancel, the job's timeout or a
        stop still end it: what it raises ends the upload and propagates as it is."""
        staged = self.staging.write(job_id, relative, chunks, limit_bytes=limit_bytes, limit_name=limit_name,
                                    progress=progress)
        key = self.location.key(job_id, relative)
        try:
            s3.upload(self.client(), self.location.bucket, key, Path(staged.path), staged.size, staged.sha256,
                      self.part_bytes, progress=every(PROGRESS_SECONDS, progress) if progress else None)
        except s3.service_errors() as exc:
            sorted_ = s3.sort_error(exc, f"uploading {self.location.uri(key)}", self.settings)
            # Refused now though the bucket was checked at start (a key rotated, a policy changed): retried like
            # a service that does not answer, so a fixed credential lets the job end done.
            raise sorted_ if isinstance(sorted_, OSError) else s3.Unreachable(str(sorted_)) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged.path)
        return staged._replace(path=self.location.uri(key))

    def finish(self, job_id: str) -> None:
        """The job's staging folder removed once every file is uploaded (best-effort: an empty folder costs only
        an inode, and the next attempt's ``prepare`` empties it anyway)."""
        with contextlib.suppress(OSError):
            root = safefs.open_root(self.root)
            try:
                safefs.remove_tree(root, job_id)
            finally:
                os.close(root)

    def client(self) -> Any:
        try:
            return s3.client(self.settings)
        except s3.Refused as exc:
            raise s3.Unreachable(str(exc)) from None


def result_store(config: Config) -> ResultStore | ObjectStore:
    """[store]'s result store: the folder ``dir``, or the bucket of ``url`` staged through ``dir``."""
    local = ResultStore(config.resolve(config.store.dir), config.store.max_file_mb * 2**20)
    if not config.store.url:
        return local
    return ObjectStore(local, s3.parse(config.store.url), config.store, config.store.multipart_threshold_mb * 2**20)


def check_buckets(config: Config) -> list[str]:
    """Where a runner or a supervisor starts: each configured bucket ([store] url, [assets] url) exists and takes
    the credentials (one HEAD each). Wrong credentials, no such bucket or profile: a ConfigError, said once here
    rather than by every job. A service that does not answer now: a warning returned (jobs wait for it, retried
    with the usual backoff), not a refusal to start."""
    warnings = []
    for section, url in (("store", config.store.url), ("assets", config.assets.url)):
        if not url:
            continue
        where = f"{config.source}: [{section}] url"
        try:
            s3.check_bucket(s3.client(config.store), s3.parse(url), config.store, where)
        except s3.Refused as exc:
            raise ConfigError(str(exc)) from None
        except s3.Unreachable as exc:
            warnings.append(f"{exc.strerror}; jobs that end now are retried until it answers")
    return warnings
