"""Delivery of a job's input files to the runner's server, just before its POST /prompt.

Each input goes into the server's input folder as ``comfysup/<blake3 hex>.<ext>`` (POST /upload/image,
``overwrite=true``) and the workflow names it so (comfysup.assets). A name made of the content's hash means a
server never serves an old image for a changed input from its cache, and a file already there under that name
is the right one:

- a server ``comfysup run`` launched: its input folder is on this machine, so "already there" is looked up on
  disk (a missing or short file is uploaded again), and the folder is kept under ``[assets] server_cache_mb``:
  least recently used first, never a file a queued or running job needs, never one of the job being posted;
- any other server: what this runner's queue recorded it uploaded there (``server_assets``) is trusted.

An upload is part of the attempt: a refused connection, a reset or a 5xx is transient (retried with the
attempt's backoff), a 413 or 400 permanent; the error is raised before anything is posted, so catch-up's
guarantee stands (nothing posted, nothing run). A POST /prompt refused because an input recorded as uploaded is
not on the server (``Invalid image file: comfysup/<hash>…``: a server comfysup did not launch, its input
folder wiped) is transient: the record is forgotten and the retry uploads it again (:meth:`stale`). Every
upload is recorded in the queue (counted in status and metrics).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comfysup import assets
from comfysup.comfy import ComfyClient, ComfyError, MalformedAnswer, PermanentError, PromptRejected
from comfysup.queue.assets import AssetMissing
from comfysup.queue.base import Queue, host_name

log = logging.getLogger(__name__)

_MISSING = re.compile(rf"Invalid image file: {assets.UPLOAD_SUBFOLDER}/([0-9a-f]{{64}})")
"""LoadImage's (and LoadImageMask's) validation error for a file that is not in the input folder, as ComfyUI
0.3.64 answers it (uploads.json: 400 custom_validation_failed ``image - Invalid image file: <name>``)."""


class StaleUpload(ComfyError):
    """Transient: the server no longer has an input this runner's queue recorded it uploaded there (its input
    folder wiped, the server replaced); the record is forgotten and the next attempt uploads it again."""

    kind = "input_missing"


class InputDelivery:
    """One server's copy of the inputs, for one runner (kept by its Station)."""

    def __init__(self, queue: Queue, client: ComfyClient, server: str, input_dir: Path | None,
                 cache_bytes: int, wall: Any = time.time) -> None:
        self.queue = queue
        self.client = client
        self.key = f"{host_name()}/{server}"
        """The server as server_assets names it: runner names repeat across machines (two gpu0s)."""
        self.folder = input_dir / assets.UPLOAD_SUBFOLDER if input_dir is not None else None
        self.cache_bytes = cache_bytes
        self.wall = wall
        self.uploaded = 0
        """Uploads this runner made (the log and tests; the queue keeps the durable count)."""
        self.over = False
        """The last eviction left the folder above cache_bytes (files of queued or running jobs are kept)."""

    def workflow(self, workflow: dict[str, Any]) -> dict[str, Any]:
        """``workflow`` with each input file on the server and named as ComfyUI expects; unchanged without."""
        refs = {assets.ref_hash(r): r for _n, _i, r in assets.references(workflow)}
        if not refs:
            return workflow
        known = self.queue.assets.server_assets(self.key) if self.folder is None else {}
        names: dict[str, str] = {}
        for digest, ref in refs.items():
            name = assets.upload_name(digest, assets.ref_name(ref))
            names[digest] = name
            size = ref["info"].get("size")
            if self._has(digest, name, size if isinstance(size, int) and size > 0 else None, known):
                self.queue.assets.touch_upload(self.key, digest, self.wall())
                continue
            try:
                data = self.queue.assets.read_asset(digest)
            except AssetMissing as exc:
                raise PermanentError(str(exc), "input_missing") from None
            got, subfolder, _kind = self.client.upload_image(name, data, assets.UPLOAD_SUBFOLDER)
            if (got, subfolder) != (name, assets.UPLOAD_SUBFOLDER):
                raise MalformedAnswer(f"POST /upload/image stored {subfolder}/{got} instead of "
                                      f"{assets.UPLOAD_SUBFOLDER}/{name}")
            self.uploaded += 1
            self.queue.assets.record_upload(self.key, digest, name, len(data), self.wall())
            log.info("uploaded input %s (%s, %s bytes) to %s", digest, assets.ref_name(ref), f"{len(data):,}",
                     self.key, extra={"event": "uploaded"})
        if self.folder is not None:
            self._evict(keep=set(names.values()))
        return assets.with_names(workflow, names)

    def stale(self, rejected: PromptRejected) -> StaleUpload | None:
        """A 400 that names one of comfysup's uploads as a missing file: the upload records of those inputs
        are forgotten (the retry uploads them again) and the failure becomes transient. Nothing else is
        changed: any other 400 stays permanent. A server whose input folder this runner sees needs no
        record (its files are looked up on disk), but a file deleted between that look and the POST is the
        same story, so it is treated alike."""
        hexes = set(_MISSING.findall(rejected.reason))
        if not hexes:
            return None
        for hex_digest in sorted(hexes):
            self.queue.assets.forget_upload(self.key, assets.HASH_PREFIX + hex_digest)
        log.warning("%s no longer has input(s) %s that were uploaded there: uploading again on the retry",
                    self.key, ", ".join(sorted(hexes)), extra={"event": "stale_upload"})
        return StaleUpload(f"the server no longer has an uploaded input ({rejected.reason}); it is uploaded "
                           "again on the next attempt")

    def _has(self, digest: str, name: str, size: int | None, known: Mapping[str, tuple[str, int, float]]) -> bool:
        if self.folder is None:
            return digest in known and known[digest][0] == name
        try:
            stat = (self.folder / name).stat()
        except OSError:
            return False
        if (size is not None and stat.st_size != size) or stat.st_size == 0:
            return False  # an upload cut short by a crash: sent again (overwrite)
        os.utime(self.folder / name)  # the LRU's clock: its last use
        return True

    def trim(self) -> None:
        """After a job ended: what the last eviction had to keep for it may go now. With a job queued behind
        the running one ([runner] queue_ahead) two jobs' inputs are on the server at once, and no later post may come to
        evict them."""
        if self.over and self.folder is not None:
            self._evict(keep=set())

    def _evict(self, keep: set[str]) -> None:
        """Remove the least recently used uploads beyond ``cache_bytes`` (never those in ``keep`` or needed by a
        queued or running job)."""
        try:
            files = [(e.stat().st_mtime, e.stat().st_size, e.name) for e in os.scandir(self.folder) if e.is_file()]
        except OSError:
            return
        total = sum(size for _m, size, _n in files)
        self.over = total > self.cache_bytes
        if not self.over:
            return
        needed = {assets.upload_name(d, "")[:64] for d in self.queue.assets.assets_needed()}
        for _mtime, size, name in sorted(files):
            if total <= self.cache_bytes:
                break
            if name in keep or name[:64] in needed:
                continue
            try:
                os.unlink(self.folder / name)  # type: ignore[operator]
            except OSError:
                continue
            total -= size
            self.over = total > self.cache_bytes
            self.queue.assets.forget_upload(self.key, assets.HASH_PREFIX + name[:64])
            log.info("removed input %s from %s (server_cache_mb)", name, self.key, extra={"event": "evicted"})
