"""At submit: {"file": ...} and core/ASSET values in set become stored, hashed references; a changed
file under an existing id is refused like a changed job; size limits; one stored copy for many lines."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from comfysup import assets
from comfysup.jobs import JobsFile
from comfysup.queue.base import SubmitConflict
from comfysup.queue.sqlite import SQLiteQueue

WORKFLOW = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inv"}},
}


def write_jobs(folder: Path, lines: list[dict]) -> Path:
    (folder / "wf.json").write_text(json.dumps(WORKFLOW))
    path = folder / "jobs.jsonl"
    path.write_text("".join(json.dumps({"workflow": "wf.json", **line}) + "\n" for line in lines))
    return path


def job_id(n: int) -> str:
    return str(uuid.UUID(int=n))


def submit(path: Path, q: SQLiteQueue, **kwargs) -> int:
    jobs = JobsFile(path, **kwargs)
    checked = jobs.validate()
    assert checked.ok, [p.message for p in checked.problems]
    return q.intake.submit(jobs.jobs()).inserted


def test_a_file_in_set_is_stored_once_and_the_job_keeps_its_reference(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    data = b"\x89PNG not really" * 100
    (tmp_path / "photos" / "cat.png").write_bytes(data)
    path = write_jobs(tmp_path, [{"id": job_id(n), "set": {"1.image": {"file": "photos/cat.png"}}}
                                 for n in range(1, 51)])
    q = SQLiteQueue(tmp_path / "var" / "queue.db")
    assert submit(path, q) == 50
    digest = assets.hash_bytes(data)
    record = q.reads.get(job_id(7))
    ref = record.params["1.image"]
    assert assets.is_reference(ref) and assets.ref_hash(ref) == digest and assets.ref_name(ref) == "cat.png"
    assert q.assets.read_asset(digest) == data
    assert q.assets.asset_totals() == {"assets": 1, "bytes": len(data), "uploads": 0}
    stored = list((tmp_path / "var" / "assets").rglob("*"))
    assert [p.name for p in stored if p.is_file()] == [digest.removeprefix("blake3:")]


def test_a_changed_file_under_an_existing_id_is_refused_like_a_changed_job(tmp_path: Path) -> None:
    (tmp_path / "cat.png").write_bytes(b"one")
    path = write_jobs(tmp_path, [{"id": job_id(1), "set": {"1.image": {"file": "cat.png"}}}])
    q = SQLiteQueue(tmp_path / "queue.db")
    assert submit(path, q) == 1
    assert submit(path, q) == 0  # the same file again: nothing new
    (tmp_path / "cat.png").write_bytes(b"two")
    with pytest.raises(SubmitConflict):
        submit(path, q)
    assert q.assets.asset_totals()["assets"] == 1  # the changed file was not stored either


def test_size_limits_per_file_and_per_job(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"x" * 600)
    (tmp_path / "b.png").write_bytes(b"y" * 600)
    path = write_jobs(tmp_path, [{"id": job_id(1), "set": {"1.image": {"file": "a.png"}}}])
    problems = JobsFile(path, max_input_bytes=500).validate().problems
    assert "at most 500 bytes" in problems[0].message and "max_file_mb" in problems[0].message
    two = dict(WORKFLOW, **{"4": {"class_type": "LoadImage", "inputs": {"image": "x.png"}}})
    (tmp_path / "wf.json").write_text(json.dumps(two))
    (tmp_path / "jobs.jsonl").write_text(json.dumps(
        {"id": job_id(2), "workflow": "wf.json", "set": {"1.image": {"file": "a.png"}, "4.image": {"file": "b.png"}}})
        + "\n")
    problems = JobsFile(path, max_job_input_bytes=1000).validate().problems
    assert "1,200 bytes together" in problems[0].message


def test_a_missing_file_is_a_line_problem(tmp_path: Path) -> None:
    path = write_jobs(tmp_path, [{"id": job_id(1), "set": {"1.image": {"file": "nope.png"}}}])
    problems = JobsFile(path).validate().problems
    assert problems and "no such file nope.png" in problems[0].message


def test_an_api_v2_asset_reference_names_a_stored_file(tmp_path: Path) -> None:
    (tmp_path / "cat.png").write_bytes(b"meow")
    digest = assets.hash_bytes(b"meow")
    path = write_jobs(tmp_path, [{"id": job_id(1), "set": {"1.image": {"file": "cat.png"}}}])
    q = SQLiteQueue(tmp_path / "queue.db")
    submit(path, q)
    ref = {"__type": "core/ASSET", "info": {"id": str(uuid.uuid4()), "hash": digest, "file_path": "cat.png"}}
    path = write_jobs(tmp_path, [{"id": job_id(2), "set": {"1.image": ref}}])
    assert submit(path, q) == 1
    assert assets.ref_hash(q.reads.get(job_id(2)).params["1.image"]) == digest
    bad = write_jobs(tmp_path, [{"id": job_id(3), "set": {"1.image": {"__type": "core/ASSET", "info": {"hash": "x"}}}}])
    assert "blake3:<64 hex digits>" in JobsFile(bad).validate().problems[0].message


def test_the_bundled_image_to_image_examples_validate(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[2] / "comfysup" / "data" / "examples"
    jobs = JobsFile(examples / "image-to-image.jsonl")
    assert jobs.validate().ok
    q = SQLiteQueue(tmp_path / "queue.db")
    assert q.intake.submit(jobs.jobs()).inserted == 2
    assert q.assets.asset_totals()["assets"] == 2
