"""comfysup.runner.outputs: the per-job prefix, the names the store keeps, and what counts as a whole file."""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import pytest

from comfysup.runner import outputs

JOB = "00000001-0000-0000-0000-000000000000"


def png(width: int = 4) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = b"".join(b"\x00" + b"\x80\x80\x80" * width for _ in range(width))
    return (outputs.PNG_MAGIC + chunk(b"IHDR", struct.pack(">IIBBBBB", width, width, 8, 2, 0, 0, 0))
            + chunk(b"tEXt", b"prompt\x00{}") + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def whole(path: Path, **kw: object) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return outputs.complete(fd, path.name, **kw)  # type: ignore[arg-type]
    finally:
        os.close(fd)


def test_a_png_is_whole_only_with_its_iend_as_the_last_bytes(tmp_path: Path) -> None:
    data = png()
    path = tmp_path / "a_00001_.png"
    path.write_bytes(data)
    assert whole(path)
    for cut in (0, 8, 20, len(data) // 2, len(data) - 12, len(data) - 1):
        path.write_bytes(data[:cut])
        assert not whole(path), cut
    path.write_bytes(data + b"\x00")  # trailing bytes: not what ComfyUI writes
    assert not whole(path)
    path.write_bytes(b"\x00" * len(data))
    assert not whole(path)


def test_another_file_is_whole_when_non_empty_quiet_and_not_growing(tmp_path: Path) -> None:
    path = tmp_path / "a_00001_.webp"
    path.write_bytes(b"")
    assert not whole(path, sleep=lambda s: None)
    path.write_bytes(b"RIFF....WEBP")
    assert not whole(path, sleep=lambda s: None), "modified just now: may still be written"
    old = time.time() - 10
    os.utime(path, (old, old))
    assert whole(path, sleep=lambda s: None)

    def grows(seconds: float) -> None:
        with path.open("ab") as f:
            f.write(b"more")

    os.utime(path, (old, old))
    assert not whole(path, sleep=grows)


def test_output_prefixes_move_into_the_jobs_folder_and_the_store_keeps_the_original_names() -> None:
    workflow = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "cats/tabby"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "ComfyUI"}},
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    p = outputs.plan(workflow, JOB)
    assert p.workflow["2"]["inputs"]["filename_prefix"] == f"comfysup/{JOB}/cats/tabby"
    assert p.workflow["3"]["inputs"]["filename_prefix"] == f"comfysup/{JOB}/ComfyUI"
    assert workflow["2"]["inputs"]["filename_prefix"] == "cats/tabby", "the submitted workflow is not changed"
    assert p.adoptable and [(e.node, e.subfolder) for e in p.expected] == [("2", "cats"), ("3", "")]
    assert outputs.store_name(f"comfysup/{JOB}/cats", JOB) == "cats"
    assert outputs.store_name(f"comfysup/{JOB}", JOB) == ""
    assert outputs.store_name("cats", JOB) == "cats"


@pytest.mark.parametrize("prefix", [["5", 0], "/abs/x", "../x", "a/../../x", "%date:yyyy%/x", ""])
def test_a_prefix_that_cannot_move_as_it_is_is_left_alone_and_the_job_is_not_adopted(prefix: object) -> None:
    workflow = {"2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}}}
    p = outputs.plan(workflow, JOB)
    assert p.workflow["2"]["inputs"]["filename_prefix"] == prefix
    assert not p.adoptable


def test_a_model_saver_keeps_its_prefix_its_files_are_not_results() -> None:
    workflow = {"9": {"class_type": "CheckpointSave", "inputs": {"filename_prefix": "checkpoints/mine"}}}
    p = outputs.plan(workflow, JOB)
    assert p.workflow == workflow and not p.adoptable


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "output" / "comfysup" / JOB
    folder.mkdir(parents=True)
    return folder


def test_the_folder_is_adopted_only_when_every_output_node_left_a_whole_file(tmp_path: Path) -> None:
    workflow = {
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "cats/tabby"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "dog"}},
    }
    expected = outputs.plan(workflow, JOB).expected
    folder = _folder(tmp_path)
    out = tmp_path / "output"
    assert outputs.scan(out, JOB, expected) is None, "nothing there yet"
    (folder / "cats").mkdir()
    (folder / "cats" / "tabby_00001_.png").write_bytes(png())
    assert outputs.scan(out, JOB, expected) is None, "the second node left nothing"
    (folder / "dog_00001_.png").write_bytes(png()[:-5])
    assert outputs.scan(out, JOB, expected) is None, "the second node's file is cut short"
    (folder / "dog_00001_.png").write_bytes(png())
    found = outputs.scan(out, JOB, expected)
    assert found is not None and sorted(f.relative for f in found) == ["cats/tabby_00001_.png", "dog_00001_.png"]
    assert b"".join(outputs.read(out, JOB, "cats/tabby_00001_.png")) == png()
    outputs.remove(out, JOB)
    assert not folder.exists() and (tmp_path / "output" / "comfysup").is_dir()
    outputs.remove(out, JOB)  # gone already: nothing to do


def test_two_nodes_with_one_prefix_need_two_files(tmp_path: Path) -> None:
    node = {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "same"}}
    expected = outputs.plan({"2": node, "3": node}, JOB).expected
    folder = _folder(tmp_path)
    (folder / "same_00001_.png").write_bytes(png())
    assert outputs.scan(tmp_path / "output", JOB, expected) is None
    (folder / "same_00002_.png").write_bytes(png())
    assert outputs.scan(tmp_path / "output", JOB, expected) is not None


def test_no_symlink_is_followed_by_the_scan_or_the_removal(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "dog_00001_.png").write_bytes(png())
    (tmp_path / "output" / "comfysup").mkdir(parents=True)
    (tmp_path / "output" / "comfysup" / JOB).symlink_to(elsewhere)
    expected = outputs.plan({"3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "dog"}}}, JOB).expected
    assert outputs.scan(tmp_path / "output", JOB, expected) is None
    outputs.remove(tmp_path / "output", JOB)
    assert (elsewhere / "dog_00001_.png").exists(), "removed the link, not what it points to"
    assert not (tmp_path / "output" / "comfysup" / JOB).is_symlink()


@pytest.mark.timeout(10)
def test_a_local_read_takes_the_file_and_falls_back_to_view_for_anything_it_cannot_open(tmp_path: Path) -> None:
    """outputs.read_or: the job's file from the server's output folder; /view (``otherwise``) for a missing file, a
    symlink or a FIFO planted under the name (opened non-blocking: it cannot hold the runner until written to)."""
    folder = tmp_path / "output" / "comfysup" / JOB
    folder.mkdir(parents=True)
    (folder / "dog_00001_.png").write_bytes(png())
    (folder / "link_00001_.png").symlink_to(folder / "dog_00001_.png")
    os.mkfifo(folder / "fifo_00001_.png")
    asked: list[str] = []

    def view(name: str) -> object:
        return lambda: (asked.append(name), [b"from /view"])[1]

    def read(name: str) -> bytes:
        return b"".join(outputs.read_or(tmp_path / "output", JOB, name, view(name)))

    assert read("dog_00001_.png") == png() and asked == []
    assert read("gone_00001_.png") == b"from /view"
    assert read("link_00001_.png") == b"from /view"
    assert read("fifo_00001_.png") == b"from /view"
    assert asked == ["gone_00001_.png", "link_00001_.png", "fifo_00001_.png"]
    assert outputs.in_job_folder(f"comfysup/{JOB}/sub", JOB) == "sub"
    assert outputs.in_job_folder(f"comfysup/{JOB}", JOB) == ""
    assert outputs.in_job_folder(f"comfysup/{JOB}x", JOB) is None and outputs.in_job_folder("other", JOB) is None
