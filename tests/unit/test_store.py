"""The result store: hostile names refused, nothing outside the job folder, no partial final names."""

import hashlib
import os

import pytest

from comfysup.runner.store import ResultStore, TooLarge, UnsafeName, safe_relative

JOB = "00000000-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    ("filename", "subfolder"),
    [("../x.png", ""), ("/etc/passwd", ""), ("a/b.png", ""), ("a\\b.png", ""), ("x\0.png", ""), ("..", ""),
     ("ok.png", "../up"), ("ok.png", "/abs"), ("ok.png", "a/../../b"), ("", ""), ("ok.png", "~root")],
)
def test_unsafe_names_are_refused(filename, subfolder):
    with pytest.raises(UnsafeName, match="unsafe output name"):
        safe_relative(filename, subfolder)


def test_safe_names_keep_their_subfolder():
    assert safe_relative("a_00001_.png", "") == "a_00001_.png"
    assert safe_relative("a_00001_.png", "batch/one") == "batch/one/a_00001_.png"


def test_write_renames_complete_files_and_hashes_them(tmp_path):
    store = ResultStore(tmp_path / "store", max_file_bytes=1 << 20)
    store.prepare(JOB)
    out = store.write(JOB, "sub/a.png", [b"abc", b"def"])
    assert out.size == 6 and out.sha256 == hashlib.sha256(b"abcdef").hexdigest()
    assert (tmp_path / "store" / JOB / "sub" / "a.png").read_bytes() == b"abcdef"
    assert oct((tmp_path / "store" / JOB).stat().st_mode & 0o777) == "0o700"
    assert not list((tmp_path / "store").rglob("*.part"))


def test_a_failing_stream_leaves_no_final_name(tmp_path):
    store = ResultStore(tmp_path, max_file_bytes=1 << 20)
    store.prepare(JOB)

    def chunks():
        yield b"partial"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        store.write(JOB, "a.png", chunks())
    assert os.listdir(tmp_path / JOB) == []


def test_size_cap(tmp_path):
    store = ResultStore(tmp_path, max_file_bytes=10)
    store.prepare(JOB)
    with pytest.raises(TooLarge):
        store.write(JOB, "a.png", [b"x" * 6, b"x" * 6])
    assert os.listdir(tmp_path / JOB) == []


def test_a_symlink_planted_in_the_job_folder_cannot_redirect_a_write(tmp_path):
    store = ResultStore(tmp_path / "store", max_file_bytes=1 << 20)
    folder = store.prepare(JOB)
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / "sub").symlink_to(outside)
    with pytest.raises(UnsafeName):
        store.write(JOB, "sub/a.png", [b"x"])
    assert list(outside.iterdir()) == []
