"""The durability model of tests/lazyfs.py on a plain folder, without FUSE (so it is checked where FUSE is
missing too): the operations are done as the filesystem does them, the model told first, then the durable tree
is rebuilt and compared."""

from __future__ import annotations

import os
import random
from pathlib import Path

from lazyfs import PAGE, Durable


def model(tmp_path: Path) -> Durable:
    (tmp_path / "root").mkdir()
    (tmp_path / "grave").mkdir()
    (tmp_path / "root" / "old").write_bytes(b"O" * (3 * PAGE))
    return Durable(tmp_path / "root", tmp_path / "grave")


def write(m: Durable, path: Path, data: bytes, offset: int = 0, *, new: bool = False) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    ident = m.ident(os.fstat(fd).st_ino)
    if new:
        m.created(ident)
    m.before_write(ident, fd, offset, len(data))
    os.pwrite(fd, data, offset)
    os.close(fd)
    return ident


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_only_synced_data_and_names_are_rebuilt(tmp_path: Path) -> None:
    m = model(tmp_path)
    root = tmp_path / "root"
    write(m, root / "old", b"N" * 10, PAGE + 5)  # an overwrite, never synced
    synced = write(m, root / "new", b"kept", new=True)
    m.synced(synced)
    write(m, root / "lost", b"gone", new=True)
    m.dir_synced(root)  # "new" and "lost" named; only "new"'s data synced
    (root / "sub").mkdir()
    write(m, root / "sub" / "x", b"x", new=True)  # a folder never synced in its parent
    counts = m.restore(tmp_path / "after")
    assert tree(tmp_path / "after") == {"old": b"O" * (3 * PAGE), "new": b"kept", "lost": b""}
    assert counts["pages_undone"] == 1


def test_a_replaced_file_comes_back_from_the_grave(tmp_path: Path) -> None:
    m = model(tmp_path)
    root = tmp_path / "root"
    part = write(m, root / ".old.part", b"replacement", new=True)
    m.synced(part)
    m.keep(root / "old")  # what the rename does first: the durable "old" is about to lose its last name
    os.replace(root / ".old.part", root / "old")
    assert list(tree(tmp_path / "grave").values()) == [b"O" * (3 * PAGE)]  # kept while a durable name needs it
    m.restore(tmp_path / "after")
    assert tree(tmp_path / "after") == {"old": b"O" * (3 * PAGE)}


def test_keep_lets_a_share_of_the_unsynced_pages_through(tmp_path: Path) -> None:
    m = model(tmp_path)
    write(m, tmp_path / "root" / "old", b"N" * (3 * PAGE))
    counts = m.restore(tmp_path / "after", keep=0.5, rng=random.Random(5))
    data = (tmp_path / "after" / "old").read_bytes()
    pages = {data[n * PAGE:(n + 1) * PAGE] for n in range(3)}
    assert pages <= {b"O" * PAGE, b"N" * PAGE} and counts["pages_undone"] + counts["pages_kept"] == 3
