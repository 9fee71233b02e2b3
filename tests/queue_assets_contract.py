"""The asset store's part of the queue contract, mixed into ``QueueContract`` so that both backends
run it: input files stored once per content in the submit's transaction, read back, kept while a job needs
them, the servers' copies recorded, and prune removing what no job references."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from comfysup import assets, records
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
        jobs = [records.replace(make_job(n), assets=(cat,)) for n in range(30)]
        assert q.intake.submit(jobs, now=T0).inserted == 30
        assert self.count(q, "assets") == 1
        assert self.count(q, "job_assets") == 30
        assert q.assets.read_asset(cat.hash) == data
        assert q.assets.asset_totals() == {"assets": 1, "bytes": len(data), "uploads": 0}
        assert q.assets.assets_needed() == {cat.hash}

    def test_a_reference_to_an_asset_not_stored_refuses_the_whole_submit(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        missing = NewAsset(assets.hash_bytes(b"never stored"), 12, "x.png")
        with pytest.raises(QueueError, match="not in the asset store"):
            q.intake.submit([make_job(1), records.replace(make_job(2), assets=(missing,))], now=T0)
        assert q.reads.states([make_job(1).id]) == {}

    def test_a_reference_to_a_stored_asset_is_accepted(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        cat = asset_file(tmp_path, b"PNG bytes")
        q.intake.submit([records.replace(make_job(1), assets=(cat,))], now=T0)
        ref = NewAsset(cat.hash, cat.size, "cat.png")
        assert q.intake.submit([records.replace(make_job(2), assets=(ref,))], now=T0).inserted == 1
        assert self.count(q, "job_assets") == 2

    def test_servers_copies_are_recorded_and_counted(self, q: Any, tmp_path: Path) -> None:
        cat = asset_file(tmp_path, b"bytes")
        q.assets.record_upload("host1/gpu0", cat.hash, "abc.png", 5, T0)
        q.assets.record_upload("host1/gpu0", cat.hash, "abc.png", 5, T0 + 1)
        q.assets.touch_upload("host1/gpu0", cat.hash, T0 + 5)
        assert q.assets.server_assets("host1/gpu0") == {cat.hash: ("abc.png", 5, T0 + 5)}
        assert q.assets.asset_totals()["uploads"] == 2
        q.assets.forget_upload("host1/gpu0", cat.hash)
        assert q.assets.server_assets("host1/gpu0") == {}

    def test_prune_removes_assets_no_job_references(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        kept, gone = asset_file(tmp_path, b"kept", "a.png"), asset_file(tmp_path, b"gone!", "b.png")
        q.intake.submit([records.replace(make_job(1), assets=(kept,)),
                         records.replace(make_job(2), assets=(gone,))], now=T0)
        q.intake.cancel([make_job(2).id], now=T0 + 1)
        assert q.assets.prune_assets() == (0, 0)  # job 2 has ended but is still in the queue
        q.intake.prune(T0 + 10)
        assert q.assets.prune_assets() == (1, 5)
        assert self.count(q, "assets") == 1
        assert q.assets.read_asset(kept.hash) == b"kept"
        with pytest.raises(QueueError):
            q.assets.read_asset(gone.hash)

    # -- assets uploaded through the API ----------------------------------------------------------

    def test_an_upload_is_a_record_over_one_stored_content(self, q: Any, tmp_path: Path) -> None:
        cat = asset_file(tmp_path, b"PNG cat")
        first, new = q.assets.add_api_asset(cat, "image/png", 3600.0, key="k1", now=T0)
        second, new2 = q.assets.add_api_asset(cat._replace(name="again.png"), "image/png", 3600.0, now=T0)
        assert (new, new2) == (True, False)
        assert first.id != second.id and first.hash == second.hash == cat.hash
        assert (first.size, first.file_path, first.expires_at) == (7, "cat.png", T0 + 3600.0)
        assert self.count(q, "assets") == 1 and self.count(q, "api_assets") == 2
        assert q.assets.api_asset(first.id) == first and q.assets.api_asset("no-such-id") is None
        assert q.assets.has_asset(cat.hash) and not q.assets.has_asset(assets.hash_bytes(b"other"))

    def test_an_upload_key_is_single_use(self, q: Any, tmp_path: Path) -> None:
        """The spec's reject-on-duplicate: a key seen before is UploadConflict naming its record, the same upload
        or another, and nothing of the second is stored."""
        from comfysup.queue.assets import UploadConflict

        cat, dog = asset_file(tmp_path, b"cat", "cat.png"), asset_file(tmp_path, b"dog", "dog.png")
        first, _ = q.assets.add_api_asset(cat, "image/png", 3600.0, key="k1", now=T0)
        for again in (cat, dog):
            with pytest.raises(UploadConflict) as refused:
                q.assets.add_api_asset(again, "image/png", 3600.0, key="k1", now=T0 + 5)
            assert refused.value.asset_id == first.id
        assert not q.assets.has_asset(dog.hash) and self.count(q, "api_assets") == 1

    @pytest.mark.timeout(60)
    def test_two_processes_uploading_with_one_key_at_once_make_one_record(self, q: Any, tmp_path: Path) -> None:
        """Two API processes (two queues on one database) given the same upload and key at the same moment: one
        record, one of them answered it and the other UploadConflict (on PostgreSQL both may look before either
        inserts: the unique key decides)."""
        import threading

        from comfysup.queue.assets import UploadConflict

        other = self.make_queue(tmp_path)
        try:
            rounds, answers, errors = 12, [], []
            barrier = threading.Barrier(2)

            def upload(queue: Any, n: int, name: str) -> None:
                cat = asset_file(tmp_path, f"cat {n}".encode(), f"{name}-{n}.png")
                cat = cat._replace(name="cat.png")
                barrier.wait()
                try:
                    record, _ = queue.assets.add_api_asset(cat, "image/png", 3600.0, key=f"key-{n}", now=T0)
                    answers.append((n, record.id))
                except UploadConflict as exc:
                    answers.append((n, exc))
                except Exception as exc:  # the finding is any other error at all
                    errors.append(exc)

            for n in range(rounds):
                threads = [threading.Thread(target=upload, args=(queue, n, name))
                           for queue, name in ((q, "a"), (other, "b"))]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
            assert not errors, errors
            for n in range(rounds):
                won = [a for k, a in answers if k == n and isinstance(a, str)]
                lost = [a for k, a in answers if k == n and isinstance(a, UploadConflict)]
                assert len(won) == len(lost) == 1, (n, answers)
                assert lost[0].asset_id in (None, won[0])
            assert self.count(q, "api_assets") == rounds
        finally:
            other.close()

    def test_minting_from_a_hash_reuses_a_live_record_and_extends_it(self, q: Any, tmp_path: Path) -> None:
        cat = asset_file(tmp_path, b"cat")
        first, _ = q.assets.add_api_asset(cat, "image/png", 100.0, now=T0)
        same, minted = q.assets.mint_api_asset(cat.hash, "cat.png", "image/png", 500.0, now=T0 + 10)
        assert (same.id, minted, same.expires_at) == (first.id, False, T0 + 510.0)
        assert q.assets.api_asset(first.id).expires_at == T0 + 510.0
        other, minted = q.assets.mint_api_asset(cat.hash, "renamed.png", "image/png", 500.0, now=T0 + 10)
        assert minted and other.id != first.id and other.size == 3
        assert q.assets.mint_api_asset(assets.hash_bytes(b"never"), "x.png", "image/png", 500.0, now=T0) is None

    def test_prune_keeps_a_live_upload_and_removes_an_expired_unreferenced_one(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        fresh, old = asset_file(tmp_path, b"fresh", "a.png"), asset_file(tmp_path, b"old!", "b.png")
        used = asset_file(tmp_path, b"used by a job", "c.png")
        kept, _ = q.assets.add_api_asset(fresh, "image/png", 3600.0, now=T0)
        gone, _ = q.assets.add_api_asset(old, "image/png", 10.0, now=T0)
        referenced, _ = q.assets.add_api_asset(used, "image/png", 10.0, now=T0)
        q.intake.submit([records.replace(make_job(1), assets=(NewAsset(used.hash, used.size, "c.png"),))],
                        now=T0 + 1)
        assert q.assets.prune_assets(now=T0 + 5) == (0, 0)
        assert q.assets.prune_assets(now=T0 + 60) == (1, 4)
        assert q.assets.api_asset(gone.id) is None and q.assets.api_asset(referenced.id) is None  # both records expired
        assert q.assets.api_asset(kept.id) == kept
        assert q.assets.read_asset(fresh.hash) == b"fresh" and q.assets.read_asset(used.hash) == b"used by a job"
        with pytest.raises(QueueError):
            q.assets.read_asset(old.hash)

    def test_deleting_an_upload_keeps_content_a_job_needs(self, q: Any, tmp_path: Path) -> None:
        from tests.queue_contract import make_job

        lone, shared = asset_file(tmp_path, b"lone", "a.png"), asset_file(tmp_path, b"shared", "b.png")
        a, _ = q.assets.add_api_asset(lone, "image/png", 3600.0, now=T0)
        b, _ = q.assets.add_api_asset(shared, "image/png", 3600.0, now=T0)
        q.intake.submit([records.replace(make_job(1), assets=(NewAsset(shared.hash, shared.size, "b.png"),))],
                        now=T0)
        assert q.assets.delete_api_asset(a.id) and q.assets.delete_api_asset(b.id)
        assert not q.assets.delete_api_asset(a.id)
        assert not q.assets.has_asset(lone.hash) and q.assets.read_asset(shared.hash) == b"shared"
        path = q.assets.asset_file(lone.hash)
        assert path is None or not path.exists()

    def test_prune_removes_temporary_files_a_killed_copy_left(self, q: Any, tmp_path: Path) -> None:
        folder = q.assets.asset_file(assets.hash_bytes(b"x"))
        if folder is None:
            pytest.skip("this backend keeps inputs in the database")
        root = folder.parent.parent
        (root / "ab").mkdir(parents=True, exist_ok=True)
        old = [root / ".api-upload-old", root / "ab" / ".incoming-old"]
        fresh = [root / ".api-upload-fresh", root / "ab" / ".incoming-fresh"]
        for path in old + fresh:
            path.write_bytes(b"partial")
        for path in old:
            os.utime(path, (T0, T0))
        q.assets.prune_assets(now=T0 + 2 * 86400)
        assert [p.exists() for p in old + fresh] == [False, False, True, True]
