"""The asset store: jobs' input files, each content once, written in the transaction that inserts the jobs.

On SQLite the bytes are files in a folder next to the queue (``assets/<2 hex>/<hex>``); on PostgreSQL they
are rows of ``asset_chunks`` (a few MiB each) unless ``[assets] dir`` names a folder every machine mounts. A
file is written (temporary name, fsync, rename) before its row, inside the submit's transaction: a crash
leaves at most a file without a row, which nothing reads and ``prune`` removes; never a row without bytes,
nor jobs without their inputs. The bytes are hashed again while they are copied, so a file changed between
validation and insert is refused rather than stored under the old hash.

A mixin of comfysup.queue.core.SQLQueue: the SQL is in sql/queries.sql (``asset_*``, ``server_assets``, …).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import blake3

from comfysup.assets import HASH_PREFIX
from comfysup.errors import QueueError
from comfysup.queue.base import NewAsset, NewJob

CHUNK_BYTES = 4 * 1024 * 1024


class AssetMissing(QueueError):
    """A job names an input file by its hash that the asset store does not hold."""


class AssetStore:
    """Input files for SQLQueue (see the module docstring)."""

    sql: dict[str, str]
    assets_dir: Path | None = None
    """The folder of input files; None: in the database (PostgreSQL only)."""

    def _transaction(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _time(self, now: float | None) -> float | None:
        raise NotImplementedError

    # -- submit ----------------------------------------------------------------------------------------------

    def _insert_assets(self, cur: Any, batch: Sequence[NewJob], at: float | None, seen: set[str]) -> None:
        """Store each job's input files (once per content, ``seen`` across the submit) and link them."""
        for job in batch:
            for asset in job.assets:
                if asset.hash not in seen:
                    self._store(cur, asset, at)
                    seen.add(asset.hash)
                cur.execute(self.sql["insert_job_asset"], (asset.hash, job.id))

    def _store(self, cur: Any, asset: NewAsset, at: float | None) -> None:
        if cur.execute(self.sql["asset_size"], (asset.hash,)).fetchone() is not None:
            return
        if asset.path is None:
            raise AssetMissing(f"input {asset.hash} ({asset.name or 'no name'}) is not in the asset store; "
                               "submit the file itself ({\"file\": \"path\"}) or upload it first")
        size = self._write_file(asset) if self.assets_dir is not None else self._write_chunks(cur, asset)
        cur.execute(self.sql["insert_asset"], (asset.hash, size, asset.name, at if at is not None else _now()))

    def _path(self, digest: str) -> Path:
        assert self.assets_dir is not None
        hexa = digest.removeprefix(HASH_PREFIX)
        return self.assets_dir / hexa[:2] / hexa

    def _write_file(self, asset: NewAsset) -> int:
        target = self._path(asset.hash)
        if target.is_file() and target.stat().st_size == asset.size:
            return asset.size  # left by a submit that rolled back, or stored by another queue: same content
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out:
                size = self._copy(asset, out.write)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size

    def _write_chunks(self, cur: Any, asset: NewAsset) -> int:
        n = 0

        def write(data: bytes) -> None:
            nonlocal n
            cur.execute(self.sql["insert_asset_chunk"], (asset.hash, n, data))
            n += 1

        return self._copy(asset, write)

    @staticmethod
    def _copy(asset: NewAsset, write: Any) -> int:
        """Copy the file in chunks through ``write``, hashing it again; QueueError when it changed."""
        hasher, size = blake3.blake3(), 0
        assert asset.path is not None
        with open(asset.path, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                hasher.update(chunk)
                size += len(chunk)
                write(chunk)
        if HASH_PREFIX + hasher.hexdigest() != asset.hash:
            raise QueueError(f"{asset.path} changed while it was being submitted; nothing was submitted")
        return size

    # -- the runner's side -----------------------------------------------------------------------------------

    def read_asset(self, digest: str) -> bytes:
        """An input file's bytes (the runner uploads them)."""
        rows = self._transaction(_fetch, self.sql["asset_size"], (digest,), write=False)
        if not rows:
            raise AssetMissing(f"input {digest} is not in the asset store (pruned while a job needed it?)")
        if self.assets_dir is not None:
            try:
                return self._path(digest).read_bytes()
            except FileNotFoundError:
                raise AssetMissing(f"input {digest}: its file {self._path(digest)} is missing") from None
        chunks = self._transaction(_fetch, self.sql["asset_chunks"], (digest,), write=False)
        return b"".join(bytes(r[0]) for r in chunks)

    def assets_needed(self) -> set[str]:
        """The hashes of the input files that queued and running jobs need."""
        return {r[0] for r in self._transaction(_fetch, self.sql["assets_needed"], (), write=False)}

    def server_assets(self, server: str) -> dict[str, tuple[str, int, float]]:
        """What ``server`` (machine/runner) was given: hash → (name there, size, last used)."""
        rows = self._transaction(_fetch, self.sql["server_assets"], (server,), write=False)
        return {r[0]: (r[1], int(r[2]), float(r[3])) for r in rows}

    def record_upload(self, server: str, digest: str, name: str, size: int, now: float) -> None:
        self._transaction(_run, self.sql["record_upload"], (server, digest, name, size, now))

    def touch_upload(self, server: str, digest: str, now: float) -> None:
        self._transaction(_run, self.sql["touch_upload"], (now, server, digest))

    def forget_upload(self, server: str, digest: str) -> None:
        self._transaction(_run, self.sql["forget_upload"], (server, digest))

    def asset_totals(self) -> dict[str, int]:
        """Input files stored, their bytes, and uploads to servers (status and metrics)."""
        row = self._transaction(_fetch, self.sql["asset_totals"], (), write=False)[0]
        return {"assets": int(row[0]), "bytes": int(row[1]), "uploads": int(row[2])}

    # -- prune -----------------------------------------------------------------------------------------------

    def prune_assets(self) -> tuple[int, int]:
        """Remove the input files no remaining job needs: (how many, their bytes). Rows first, then files."""
        gone: list[tuple[str, int]] = self._transaction(self._prune_assets)
        if self.assets_dir is not None:
            for digest, _size in gone:
                self._path(digest).unlink(missing_ok=True)
        return len(gone), sum(size for _d, size in gone)

    def _prune_assets(self, cur: Any) -> list[tuple[str, int]]:
        cur.execute(self.sql["prune_job_assets"])
        gone = []
        for digest, size in cur.execute(self.sql["unreferenced_assets"]).fetchall():
            if cur.execute(self.sql["delete_asset"], (digest, digest)).rowcount:
                cur.execute(self.sql["delete_asset_chunks"], (digest,))
                gone.append((digest, int(size)))
        return gone


def _fetch(cur: Any, sql: str, args: Iterable[Any]) -> list[Any]:
    return cur.execute(sql, tuple(args)).fetchall()


def _run(cur: Any, sql: str, args: Iterable[Any]) -> None:
    cur.execute(sql, tuple(args))


def _now() -> float:
    import time

    return time.time()
