"""The asset store: jobs' input files, each content once, written in the transaction that inserts the jobs.

On SQLite the bytes are files in a folder next to the queue (``assets/<2 hex>/<hex>``); on PostgreSQL they
are rows of ``asset_chunks`` (a few MiB each) unless ``[assets] dir`` names a folder every machine mounts. A
file is written (temporary name, fsync, rename) before its row, inside the submit's transaction: a crash
leaves at most a file without a row, which nothing reads and ``prune`` removes; never a row without bytes,
nor jobs without their inputs. The bytes are hashed again while they are copied, so a file changed between
validation and insert is refused rather than stored under the old hash.

Assets uploaded through the Comfy API v2 are records (``api_assets``: a random id, the name and
content type the client gave, a retention deadline) over the same stored contents: a record keeps its content
from prune until it expires, so a client can upload first and submit the job that references it later; the job
then keeps the content itself, like any job's input.

A role of the queue over its database (comfysup.queue.db): the SQL is in sql/queries.sql (``asset_*``, ``api_asset*``,
``server_assets``, …).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comfysup.errors import QueueError
from comfysup.queue import asset_files as files
from comfysup.queue import values
from comfysup.queue.asset_files import CHUNK_BYTES, AssetMissing
from comfysup.queue.asset_ids import new_asset_id
from comfysup.queue.base import NewJob
from comfysup.queue.db import Role, SQLDb, in_transaction
from comfysup.queue.tenants import DEFAULT
from comfysup.queue.values import ApiAsset, NewAsset

if TYPE_CHECKING:
    from comfysup.queue.asset_bucket import AssetBucket



class UploadConflict(QueueError):
    """An upload's Idempotency-Key was used before (keys are single-use); ``asset_id`` is that upload's record."""

    def __init__(self, asset_id: str | None) -> None:
        super().__init__("this Idempotency-Key was used before" + (f", for asset {asset_id}" if asset_id else ""))
        self.asset_id = asset_id


def _api_asset(row: Any) -> ApiAsset:
    return values.ApiAsset(str(row["id"]), str(row["hash"]), int(row["size"]), str(row["file_path"]),
                           str(row["content_type"]), float(row["created_at"]), float(row["expires_at"]),
                           str(row["tenant"]))


class Assets(Role):
    """The queue's input files (see the module docstring)."""

    asset_bucket: AssetBucket | None = None
    """[assets] url: new contents go to the bucket; one stored before it was set is still read from the folder or
    the database."""

    def __init__(self, db: SQLDb, assets_dir: Path | None) -> None:
        super().__init__(db)
        self.assets_dir = assets_dir
        """The folder of input files; None: in the database (PostgreSQL only)."""

    # -- submit ----------------------------------------------------------------------------------------------

    def insert_assets(self, cur: Any, batch: Sequence[NewJob], at: float | None, seen: set[str]) -> None:
        """Store each job's input files (once per content, ``seen`` across the submit) and link them."""
        for job in batch:
            for asset in job.assets:
                if asset.hash not in seen:
                    self.store(cur, asset, at)
                    seen.add(asset.hash)
                cur.execute(self.db.sql["insert_job_asset"], {"hash": asset.hash, "job_id": job.id})

    def store(self, cur: Any, asset: NewAsset, at: float | None) -> None:
        if cur.execute(self.db.sql["asset_size"], {"hash": asset.hash}).fetchone() is not None:
            return
        if asset.path is None:
            raise AssetMissing(f"input {asset.hash} ({asset.name or 'no name'}) is not in the asset store; "
                               "submit the file itself ({\"file\": \"path\"}) or upload it first")
        if self.asset_bucket is not None:
            size = self.asset_bucket.put(asset.hash, asset.size, lambda write: files.copy(asset, write))
        elif self.assets_dir is not None:
            size = files.write_file(self.assets_dir, asset)
        else:
            size = self._write_chunks(cur, asset)
        cur.execute(self.db.sql["insert_asset"], {"hash": asset.hash, "size": size, "name": asset.name,
                                                  "stored_at": at if at is not None else _now()})

    def _write_chunks(self, cur: Any, asset: NewAsset) -> int:
        n = 0

        def write(data: bytes) -> None:
            nonlocal n
            cur.execute(self.db.sql["insert_asset_chunk"], {"hash": asset.hash, "n": n, "data": data})
            n += 1

        return files.copy(asset, write)

    # -- the runner's side -----------------------------------------------------------------------------------

    def read_asset(self, digest: str) -> bytes:
        """An input file's bytes (the runner uploads them)."""
        rows = self.db.transaction(_fetch, self.db.sql["asset_size"], {"hash": digest}, write=False)
        if not rows:
            raise AssetMissing(f"input {digest} is not in the asset store (pruned while a job needed it?)")
        size = int(rows[0]["size"])
        in_bucket = self.asset_bucket.get(digest, size) if self.asset_bucket is not None else None
        if in_bucket is not None:
            data = in_bucket
        elif self.assets_dir is not None:
            data = files.read_file(self.assets_dir, digest, size)
        else:
            chunks = self.db.transaction(_fetch, self.db.sql["asset_chunks"], {"hash": digest}, write=False)
            data = b"".join(bytes(r["data"]) for r in chunks)
        files.check_hash(data, digest)
        return data

    def assets_needed(self) -> set[str]:
        """The hashes of the input files that queued and running jobs need."""
        return {r["hash"] for r in self.db.transaction(_fetch, self.db.sql["assets_needed"], {}, write=False)}

    def server_assets(self, server: str) -> dict[str, tuple[str, int, float]]:
        """What ``server`` (machine/runner) was given: hash → (name there, size, last used)."""
        rows = self.db.transaction(_fetch, self.db.sql["server_assets"], {"server": server}, write=False)
        return {r["hash"]: (r["name"], int(r["size"]), float(r["used_at"])) for r in rows}

    def record_upload(self, server: str, digest: str, name: str, size: int, now: float) -> None:
        self.db.transaction(_run, self.db.sql["record_upload"], {"server": server, "hash": digest, "name": name,
                                                                 "size": size, "used_at": now})

    def touch_upload(self, server: str, digest: str, now: float) -> None:
        self.db.transaction(_run, self.db.sql["touch_upload"], {"used_at": now, "server": server, "hash": digest})

    def forget_upload(self, server: str, digest: str) -> None:
        self.db.transaction(_run, self.db.sql["forget_upload"], {"server": server, "hash": digest})

    def asset_totals(self) -> dict[str, int]:
        """Input files stored, their bytes, and uploads to servers (status and metrics)."""
        row = self.db.transaction(_fetch, self.db.sql["asset_totals"], {}, write=False)[0]
        return {"assets": int(row["assets"]), "bytes": int(row["bytes"]), "uploads": int(row["uploads"])}

    # -- assets uploaded through the API -------------------------------------------------------

    @in_transaction()
    def add_api_asset(self, cur: Any, asset: NewAsset, content_type: str, retention_seconds: float,
                      key: str | None = None, now: float | None = None, tenant: str = DEFAULT
                      ) -> tuple[ApiAsset, bool]:
        """Store ``asset`` (its bytes at ``asset.path``, hashed again while copied) unless its content is already
        stored, and mint a record over it, in one durable transaction: ``(record, created_new)``. ``key`` (the
        upload's Idempotency-Key) is single-use, held by the record's unique ``idem_key``: one seen before, or
        committed by another upload while this one ran, is UploadConflict and nothing is stored."""
        at = time.time() if now is None else now
        self._check_key(cur, key)
        created_new = cur.execute(self.db.sql["asset_size"], {"hash": asset.hash}).fetchone() is None
        self.store(cur, asset, at)
        record = values.ApiAsset(new_asset_id(), asset.hash, asset.size, asset.name, content_type, at,
                                 at + retention_seconds, tenant)
        if key is None:
            cur.execute(self.db.sql["insert_api_asset"], _api_asset_row(record, None))
        elif cur.execute(self.db.sql["insert_keyed_api_asset"], _api_asset_row(record, key)).fetchone() is None:
            # Another process committed an upload with this key since we looked (PostgreSQL, READ COMMITTED: the
            # insert waited for it). Raising rolls back what this transaction stored.
            self._check_key(cur, key)
            raise UploadConflict(None)
        return record, created_new

    def _check_key(self, cur: Any, key: str | None) -> None:
        """UploadConflict when an upload holds ``key`` already."""
        row = None if key is None else cur.execute(self.db.sql["api_asset_by_key"], {"key": key}).fetchone()
        if row is not None:
            raise UploadConflict(_api_asset(row).id)

    @in_transaction()
    def mint_api_asset(self, cur: Any, digest: str, file_path: str, content_type: str, retention_seconds: float,
                       now: float | None = None, tenant: str = DEFAULT) -> tuple[ApiAsset, bool] | None:
        """A record over content already stored (``POST /assets/from-hash``): ``(record, minted)``; a live record
        of the same content, name and tenant is answered instead of a new one (its deadline extended, never shortened).
        None when the content is not stored."""
        at = time.time() if now is None else now
        until = at + retention_seconds
        size = cur.execute(self.db.sql["asset_size"], {"hash": digest}).fetchone()
        if size is None:
            return None
        row = cur.execute(self.db.sql["api_asset_same"],
                          {"hash": digest, "file_path": file_path, "at": at, "tenant": tenant}).fetchone()
        if row is not None:
            known = _api_asset(row)
            cur.execute(self.db.sql["extend_api_asset"], {"until": until, "id": known.id})
            return values.ApiAsset(**{**known._asdict(), "expires_at": max(known.expires_at, until)}), False
        record = values.ApiAsset(new_asset_id(), digest, int(size["size"]), file_path, content_type, at, until,
                                 tenant)
        cur.execute(self.db.sql["insert_api_asset"], _api_asset_row(record, None))
        return record, True

    def api_asset(self, asset_id: str) -> ApiAsset | None:
        """The record (expired or not: the caller decides) or None."""
        rows = self.db.transaction(_fetch, self.db.sql["api_asset"], {"id": asset_id}, write=False)
        return _api_asset(rows[0]) if rows else None

    def has_asset(self, digest: str) -> bool:
        return self.asset_size(digest) is not None

    def asset_size(self, digest: str) -> int | None:
        """The stored content's size, or None when the store does not hold it."""
        rows = self.db.transaction(_fetch, self.db.sql["asset_size"], {"hash": digest}, write=False)
        return int(rows[0]["size"]) if rows else None

    def delete_api_asset(self, asset_id: str) -> bool:
        """Remove the record; its content too when no job and no other record needs it. False: no such record."""
        found: tuple[bool, list[tuple[str, int]]] = self.db.transaction(self._delete_api_asset, asset_id)
        self._unlink(found[1])
        return found[0]

    def _delete_api_asset(self, cur: Any, asset_id: str) -> tuple[bool, list[tuple[str, int]]]:
        row = cur.execute(self.db.sql["delete_api_asset"], {"id": asset_id}).fetchone()
        if row is None:
            return False, []
        size = cur.execute(self.db.sql["asset_size"], {"hash": row["hash"]}).fetchone()
        return True, self._drop_unreferenced(cur, [(row["hash"], size["size"] if size else 0)])

    def asset_file(self, digest: str) -> Path | None:
        """Where a stored content's bytes are on this machine; None when they are chunks in the database."""
        path = files.path_of(self.assets_dir, digest) if self.assets_dir is not None else None
        return None if path is not None and self.asset_bucket is not None and not path.is_file() else path

    def asset_chunk(self, digest: str, n: int) -> bytes:
        """Chunk ``n`` (CHUNK_BYTES each but the last) of a content kept in the database or the bucket; b"" past
        its end."""
        if self.asset_bucket is not None:
            data = self.asset_bucket.read_range(digest, n * CHUNK_BYTES, CHUNK_BYTES)
            if data is not None:
                return data
        rows = self.db.transaction(_fetch, self.db.sql["asset_chunk"], {"hash": digest, "n": n}, write=False)
        return bytes(rows[0]["data"]) if rows else b""

    # -- prune -----------------------------------------------------------------------------------------------

    def prune_assets(self, now: float | None = None) -> tuple[int, int]:
        """Remove API upload records past their retention, then the input files no remaining job needs and no
        record keeps: (how many files, their bytes). Rows first, then files."""
        at = time.time() if now is None else now
        gone: list[tuple[str, int]] = self.db.transaction(self._prune_assets, at)
        self._unlink(gone)
        files.sweep(self.assets_dir, at)
        return len(gone), sum(size for _d, size in gone)

    def _prune_assets(self, cur: Any, at: float) -> list[tuple[str, int]]:
        cur.execute(self.db.sql["prune_job_assets"])
        cur.execute(self.db.sql["prune_api_assets"], {"at": at})
        rows = cur.execute(self.db.sql["unreferenced_assets"]).fetchall()
        return self._drop_unreferenced(cur, [(r["hash"], r["size"]) for r in rows])

    def _drop_unreferenced(self, cur: Any, candidates: Iterable[Any]) -> list[tuple[str, int]]:
        gone = []
        for digest, size in candidates:
            if cur.execute(self.db.sql["delete_asset"], {"hash": digest}).rowcount:
                cur.execute(self.db.sql["delete_asset_chunks"], {"hash": digest})
                gone.append((digest, int(size)))
        return gone

    def _unlink(self, gone: Iterable[tuple[str, int]]) -> None:
        gone = list(gone)
        if self.asset_bucket is not None:
            self.asset_bucket.delete(digest for digest, _size in gone)
        if self.assets_dir is not None:
            for digest, _size in gone:
                files.path_of(self.assets_dir, digest).unlink(missing_ok=True)


def _fetch(cur: Any, sql: str, args: Mapping[str, Any]) -> list[Any]:
    return cur.execute(sql, args).fetchall()


def _run(cur: Any, sql: str, args: Mapping[str, Any]) -> None:
    cur.execute(sql, args)


def _api_asset_row(record: ApiAsset, key: str | None) -> dict[str, Any]:
    """The parameters of ``insert_api_asset`` (and its keyed twin) for a record."""
    return {"id": record.id, "hash": record.hash, "file_path": record.file_path, "content_type": record.content_type,
            "created_at": record.created_at, "expires_at": record.expires_at, "idem_key": key, "tenant": record.tenant}


def _now() -> float:
    return time.time()

