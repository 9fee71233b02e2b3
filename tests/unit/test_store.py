"""The result store: hostile names refused, nothing outside the job folder, no partial final names."""

import hashlib
import os

import pytest

from comfysup.runner.store import PNG_END, PNG_SIGNATURE, Incomplete, ResultStore, TooLarge, UnsafeName, safe_relative

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
    png = PNG_SIGNATURE + b"abcdef" + PNG_END
    out = store.write(JOB, "sub/a.png", [png[:7], png[7:13], png[13:]])
    assert out.size == len(png) and out.sha256 == hashlib.sha256(png).hexdigest()
    assert (tmp_path / "store" / JOB / "sub" / "a.png").read_bytes() == png
    assert oct((tmp_path / "store" / JOB).stat().st_mode & 0o777) == "0o700"
    assert not list((tmp_path / "store").rglob("*.part"))


def test_a_part_file_left_by_a_killed_write_is_replaced_and_a_symlink_there_is_never_followed(tmp_path):
    store = ResultStore(tmp_path / "store", max_file_bytes=1 << 20)
    folder = store.prepare(JOB)
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"not ours")
    (folder / ".a.png.part").write_bytes(b"half of an earlier write")
    (folder / ".b.png.part").symlink_to(outside)
    png = PNG_SIGNATURE + b"abcdef" + PNG_END
    for name in ("a.png", "b.png"):
        assert store.write(JOB, name, [png]).size == len(png)
        assert (folder / name).read_bytes() == png
    assert outside.read_bytes() == b"not ours"
    assert sorted(p.name for p in folder.iterdir()) == ["a.png", "b.png"]


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


@pytest.mark.parametrize(("name", "body", "ok"), [
    ("a.png", PNG_SIGNATURE + b"x" + PNG_END, True),
    ("a.png", (PNG_SIGNATURE + b"x" + PNG_END)[:-1], False),  # cut one byte short
    ("a.png", b"<html>not an image</html>", False),
    ("a.PNG", PNG_SIGNATURE + PNG_END, True),
    ("a.jpg", b"\xff\xd8 jpeg \xff\xd9", True),
    ("a.jpeg", b"\xff\xd8 jpeg", False),
    ("a.webp", b"RIFF" + (8).to_bytes(4, "little") + b"WEBPVP8 ", True),
    ("a.webp", b"RIFF" + (80).to_bytes(4, "little") + b"WEBPVP8 ", False),
    ("a.mp4", b"anything", True),  # not a type that is checked
    ("a.bin", b"", True),
])
def test_images_must_be_whole(tmp_path, name, body, ok):
    store = ResultStore(tmp_path / "store", max_file_bytes=1 << 20)
    store.prepare(JOB)
    if ok:
        assert store.write(JOB, name, [body[:5], body[5:]]).size == len(body)
    else:
        with pytest.raises(Incomplete, match="the download was cut or garbled"):
            store.write(JOB, name, [body])
        assert list((tmp_path / "store" / JOB).iterdir()) == []  # no final name, no .part left
