"""The asset store in a bucket ([assets] url): the asset store's contract, run on SQLite and on
PostgreSQL with the contents in a real S3 server, so machines on one PostgreSQL share input files through the
bucket; and the bytes are in the bucket, not in the database's chunks nor in a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)
from queue_assets_contract import T0, AssetsContract, asset_file

from comfysup import records
from comfysup.queue.asset_bucket import AssetBucket
from comfysup.queue.postgres import PostgresQueue
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.storage import s3
from tests.s3_support import SeaweedS3


class Settings:
    def __init__(self, server: SeaweedS3) -> None:
        section = server.store_section("")
        self.endpoint_url, self.region = str(section["endpoint_url"]), str(section["region"])
        self.profile = ""
        self.access_key_id, self.secret_access_key = str(section["access_key_id"]), str(section["secret_access_key"])


class BucketAssets(AssetsContract):
    @pytest.fixture(autouse=True)
    def _bucket(self, s3_server: SeaweedS3) -> None:
        self.server = s3_server
        self.bucket = AssetBucket(s3.Location(s3_server.bucket("assets"), "inputs"), Settings(s3_server))

    def with_bucket(self, queue: Any) -> Any:
        queue.assets.asset_bucket = self.bucket
        return queue

def cat_bytes(asset: Any) -> bytes:
    return Path(asset.path).read_bytes()


class TestSQLiteBucketAssets(BucketAssets):
    def make_queue(self, tmp_path: Path) -> SQLiteQueue:
        tmp_path.mkdir(exist_ok=True)
        return self.with_bucket(SQLiteQueue(tmp_path / "queue.db"))

    def count(self, q: SQLiteQueue, table: str) -> int:  # type: ignore[override]
        return q.db._read(f"SELECT count(*) FROM {table}")[0][0]

    @pytest.fixture
    def q(self, tmp_path: Path) -> Any:
        queue = self.make_queue(tmp_path)
        yield queue
        queue.close()


class TestPostgresBucketAssets(BucketAssets):
    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:  # noqa: F811
        self.url = pg_url

    def make_queue(self, tmp_path: Path) -> PostgresQueue:
        return self.with_bucket(PostgresQueue(self.url))

    def count(self, q: PostgresQueue, table: str) -> int:  # type: ignore[override]
        return q.db._scalar(f"SELECT count(*) FROM {table}")

    @pytest.fixture
    def q(self, tmp_path: Path) -> Any:
        queue = self.make_queue(tmp_path)
        yield queue
        queue.close()

    def test_the_bytes_are_in_the_bucket_and_another_machine_reads_them(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        cat = asset_file(tmp_path, b"PNG cat from machine A")
        q.intake.submit([records.replace(make_job(1), assets=(cat,))], now=T0)
        hexa = cat.hash.removeprefix("blake3:")
        assert self.server.objects(self.bucket.location.bucket) == {f"inputs/{hexa[:2]}/{hexa}": cat_bytes(cat)}
        assert self.count(q, "asset_chunks") == 0
        other = self.make_queue(tmp_path)  # another machine: the database and the bucket are all it shares
        try:
            assert other.assets.read_asset(cat.hash) == b"PNG cat from machine A"
            assert other.assets.asset_chunk(cat.hash, 0) == b"PNG cat from machine A"
        finally:
            other.close()
