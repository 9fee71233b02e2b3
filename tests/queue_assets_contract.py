"""The asset store's part of the queue contract (issue 17), mixed into ``QueueContract`` so that both backends
run it: input files stored once per content in the submit's transaction, read back, kept while a job needs
them, the servers' copies recorded, and prune removing what no job references."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from comfysup import assets
from comfysup.errors import QueueError
from comfysup.queue.base import NewAsset, Queue

T0 = 1_700_000_000.0


def asset_file(tmp_path: Path, data: bytes, name: str = "cat.png") -> NewAsset:
    path = tmp_path / name
    path.write_bytes(data)
    return NewAsset(assets.hash_bytes(data), len(data), name, str(path))


class AssetsContract:
    def count(self, q: Queue, table: str) -> int:
        raise NotImplementedError

    def test_an_input_file_is_stored_once_however_many_jobs_use_it(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        data = bytes(range(256)) * 40_000  # 10 MB: more than one chunk in the database
        cat = asset_file(tmp_path, data)
        jobs = [dataclasses.replace(make_job(n), assets=(cat,)) for n in range(30)]
        assert q.submit(jobs, now=T0).inserted == 30
        assert self.count(q, "assets") == 1
        assert self.count(q, "job_assets") == 30
        assert q.read_asset(cat.hash) == data
        assert q.asset_totals() == {"assets": 1, "bytes": len(data), "uploads": 0}
        assert q.assets_needed() == {cat.hash}

    def test_a_reference_to_an_asset_not_stored_refuses_the_whole_submit(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        missing = NewAsset(assets.hash_bytes(b"never stored"), 12, "x.png")
        with pytest.raises(QueueError, match="not in the asset store"):
            q.submit([make_job(1), dataclasses.replace(make_job(2), assets=(missing,))], now=T0)
        assert q.states([make_job(1).id]) == {}

    def test_a_reference_to_a_stored_asset_is_accepted(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        cat = asset_file(tmp_path, b"PNG bytes")
        q.submit([dataclasses.replace(make_job(1), assets=(cat,))], now=T0)
        ref = NewAsset(cat.hash, cat.size, "cat.png")
        assert q.submit([dataclasses.replace(make_job(2), assets=(ref,))], now=T0).inserted == 1
        assert self.count(q, "job_assets") == 2

    def test_servers_copies_are_recorded_and_counted(self, q: Any, tmp_path: Path) -> None:
        cat = asset_file(tmp_path, b"bytes")
        q.record_upload("host1/gpu0", cat.hash, "abc.png", 5, T0)
        q.record_upload("host1/gpu0", cat.hash, "abc.png", 5, T0 + 1)
        q.touch_upload("host1/gpu0", cat.hash, T0 + 5)
        assert q.server_assets("host1/gpu0") == {cat.hash: ("abc.png", 5, T0 + 5)}
        assert q.asset_totals()["uploads"] == 2
        q.forget_upload("host1/gpu0", cat.hash)
        assert q.server_assets("host1/gpu0") == {}

    def test_prune_removes_assets_no_job_references(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        kept, gone = asset_file(tmp_path, b"kept", "a.png"), asset_file(tmp_path, b"gone!", "b.png")
        q.submit([dataclasses.replace(make_job(1), assets=(kept,)), dataclasses.replace(make_job(2), assets=(gone,))],
                 now=T0)
        q.cancel([make_job(2).id], now=T0 + 1)
        assert q.prune_assets() == (0, 0)  # job 2 has ended but is still in the queue
        q.prune(T0 + 10)
        assert q.prune_assets() == (1, 5)
        assert self.count(q, "assets") == 1
        assert q.read_asset(kept.hash) == b"kept"
        with pytest.raises(QueueError):
            q.read_asset(gone.hash)
