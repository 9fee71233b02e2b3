"""The result store in a bucket ([store] url): the same ``prepare``/``write`` as ResultStore, each file
downloaded to a staging file in ``[store] dir`` (hashed, checked and fsynced there exactly as on disk). The attempt
ends with the job recorded ``storing`` (``staged_in``): the uploads go through an outbox, this machine's uploader
(comfysup.runner.uploader), which sends each file to ``<prefix>/<job id>/<name>``, has it confirmed by the
service, and only then makes the job ``done``. A bucket that does not answer spends no attempt of the job and
keeps no GPU waiting.

The key is stable per job and name, so an upload repeated (an uploader restarted mid-upload) overwrites the same
object with the same bytes, never adding a second one.
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
from comfysup.runner.store import ResultStore
from comfysup.storage import s3


class ObjectStore:
    """Outputs uploaded to a bucket through a local staging folder; ``Output.path`` is the object's s3:// URI."""

    def __init__(self, staging: ResultStore, location: s3.Location, settings: s3.Settings, part_bytes: int) -> None:
        self.staging = staging
        self.location = location
        self.settings = settings
        self.part_bytes = part_bytes
        self.root = staging.root
        self._root_durable = False
        """The staging folder's entry in its parent fsynced by this process (once: it is made once)."""

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
        """ResultStore.write to the staging folder: the file complete, hashed and fsynced under its final name
        there; ``Output.path`` is where it waits. The uploader sends it once the job is recorded storing."""
        return self.staging.write(job_id, relative, chunks, limit_bytes=limit_bytes, limit_name=limit_name,
                                  progress=progress)

    def finish(self, job_id: str) -> None:
        """Every file of the job is staged: the job's folder entry made durable too (each file's own entry is
        fsynced as it is renamed), and once per process the staging folder's own entry in its parent, so the files
        outlive a power cut once the job is recorded storing."""
        root = safefs.open_root(self.root)
        try:
            os.fsync(root)
        finally:
            os.close(root)
        if not self._root_durable:
            parent = os.open(Path(self.root).parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(parent)
            finally:
                os.close(parent)
            self._root_durable = True

    def staged_in(self, job_id: str) -> str | None:
        """Where the job's files wait for the bucket (recorded with the job: ``comfysup show`` says it)."""
        return str(self.job_dir(job_id))

    def upload(self, job_id: str, staged: Output) -> Output:
        """One staged file sent to its key and confirmed; the Output with its s3:// path. The service's errors are
        sorted: an OSError (``s3.Unreachable``) for one that does not answer and for a refusal now of what was
        accepted at start (a key rotated, a policy changed: a fixed credential lets the job end done)."""
        key = self.location.key(job_id, staged.name)
        try:
            s3.upload(self.client(), self.location.bucket, key, Path(staged.path), staged.size, staged.sha256,
                      self.part_bytes)
        except s3.service_errors() as exc:
            sorted_ = s3.sort_error(exc, f"uploading {self.location.uri(key)}", self.settings)
            raise sorted_ if isinstance(sorted_, OSError) else s3.Unreachable(str(sorted_)) from None
        return staged._replace(path=self.location.uri(key))

    def forget(self, job_id: str) -> None:
        """The job's staging folder removed (its job ended: done, cancelled, given up); best-effort."""
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
            warnings.append(f"{exc.strerror}; the outputs of jobs that end now wait in the staging folder until it "
                            "answers")
    return warnings
