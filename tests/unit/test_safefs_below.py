"""safefs.open_below and remove_tree as the runner uses them: the root may be a symlink, nothing below it is
followed, and a root that is not a folder stays an OSError of the store (not an unsafe job)."""

import errno
import os
from pathlib import Path

import pytest

from comfysup import safefs
from comfysup.runner import outputs
from comfysup.runner.store import PNG_END, PNG_SIGNATURE, ResultStore, UnsafeFolder

JOB = "00000000-0000-0000-0000-000000000007"
PNG = PNG_SIGNATURE + b"x" + PNG_END


@pytest.mark.timeout(10)
def test_open_below_follows_the_root_s_links_and_never_the_name(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "job").mkdir(parents=True)
    (tmp_path / "root").symlink_to(real)  # the operator's choice: a link is fine for the root
    fd = safefs.open_below(tmp_path / "root", "job")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(real / "job"))
    finally:
        os.close(fd)
    (real / "link").symlink_to(real / "job")
    (real / "file").write_bytes(b"x")
    for name in ("link", "file"):
        with pytest.raises(safefs.Escapes):
            safefs.open_below(tmp_path / "root", name)
    for name in ("", ".", "..", "a/b"):
        with pytest.raises(safefs.Escapes):
            safefs.open_below(tmp_path / "root", name)
    with pytest.raises(FileNotFoundError):
        safefs.open_below(tmp_path / "root", "missing")
    (tmp_path / "not-a-folder").write_bytes(b"x")
    with pytest.raises(NotADirectoryError) as raised:  # the root itself: not Escapes, whose name is the job's
        safefs.open_below(tmp_path / "not-a-folder", "job")
    assert not isinstance(raised.value, safefs.Escapes) and raised.value.errno == errno.ENOTDIR


@pytest.mark.timeout(10)
def test_the_store_writes_under_a_root_that_is_a_link_and_refuses_a_job_folder_replaced_by_one(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    (tmp_path / "store").symlink_to(tmp_path / "disk")
    store = ResultStore(tmp_path / "store", max_file_bytes=1 << 20)
    store.prepare(JOB)
    assert store.write(JOB, "a.png", [PNG]).size == len(PNG)
    assert (tmp_path / "disk" / JOB / "a.png").read_bytes() == PNG
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(tmp_path / "disk" / JOB, tmp_path / "moved")  # replaced between prepare and write
    (tmp_path / "disk" / JOB).symlink_to(outside)
    with pytest.raises(UnsafeFolder, match="is a symlink"):
        store.write(JOB, "b.png", [PNG])
    assert list(outside.iterdir()) == []
    (tmp_path / "file-root").write_bytes(b"x")
    with pytest.raises(NotADirectoryError) as raised:  # a store root that is a file: the store's failure, retried
        ResultStore(tmp_path / "file-root", max_file_bytes=1 << 20).write(JOB, "a.png", [PNG])
    assert not isinstance(raised.value, UnsafeFolder)


@pytest.mark.timeout(10)
def test_a_comfysup_folder_replaced_by_a_link_is_neither_read_nor_emptied(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / JOB
    elsewhere.mkdir(parents=True)
    (elsewhere / "dog_00001_.png").write_bytes(PNG)
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "comfysup").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(safefs.Escapes):
        b"".join(outputs.read(tmp_path / "output", JOB, "dog_00001_.png"))
    with pytest.raises(safefs.Escapes):
        outputs.remove(tmp_path / "output", JOB)
    assert (elsewhere / "dog_00001_.png").read_bytes() == PNG


@pytest.mark.timeout(10)
def test_remove_tree_removes_links_as_links_and_every_kind_of_file(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_bytes(b"keep")
    job = tmp_path / "out" / "comfysup" / JOB
    (job / "sub" / "deeper").mkdir(parents=True)
    (job / "a.png").write_bytes(PNG)
    (job / "sub" / "deeper" / "b.png").write_bytes(PNG)
    (job / "dirlink").symlink_to(target)
    (job / "sub" / "filelink").symlink_to(target / "keep")
    (job / "sub" / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(job / "fifo")
    outputs.remove(tmp_path / "out", JOB)
    assert not job.exists() and not job.is_symlink()
    assert (target / "keep").read_bytes() == b"keep"
    (tmp_path / "out" / "comfysup" / JOB).symlink_to(target)  # the job's folder itself a link: only it goes
    outputs.remove(tmp_path / "out", JOB)
    assert not (tmp_path / "out" / "comfysup" / JOB).is_symlink() and (target / "keep").exists()
    outputs.remove(tmp_path / "out", JOB)  # nothing there: nothing to do
    outputs.remove(tmp_path / "nothing", JOB)
