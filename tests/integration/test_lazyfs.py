"""tests/lazyfs.py, the filesystem that forgets what was not fsynced: each test writes through a real mount,
cuts the power, mounts again and looks. Each would fail on an ordinary filesystem (it keeps everything) or on
one that forgets too much (a synced write or entry that does not come back)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from lazyfs import PAGE, LazyMount


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def power_cycle(lazy: LazyMount) -> dict:
    answer = lazy.cut()
    lazy.mount()
    return answer


def test_unsynced_writes_are_forgotten_and_synced_ones_kept(lazy: LazyMount) -> None:
    disk = lazy.mountpoint
    (disk / "kept").write_bytes(b"A" * 10_000)
    fsync(disk / "kept")
    fsync(disk)
    with open(disk / "kept", "r+b") as f:  # overwrite a page, grow the file: neither synced
        f.seek(5000)
        f.write(b"B" * 8000)
    (disk / "unsynced").write_bytes(b"never synced")
    assert (disk / "kept").read_bytes()[5000:5001] == b"B"
    answer = power_cycle(lazy)
    assert (disk / "kept").read_bytes() == b"A" * 10_000
    assert not (disk / "unsynced").exists()
    assert answer["pages_undone"] >= 1


def test_a_synced_file_needs_its_folder_synced_to_keep_its_name(lazy: LazyMount) -> None:
    disk = lazy.mountpoint
    (disk / "sub").mkdir()
    (disk / "sub" / "data").write_bytes(b"payload")
    fsync(disk / "sub" / "data")
    fsync(disk / "sub")  # the file's entry, but not the folder's own entry in the root
    power_cycle(lazy)
    assert not (disk / "sub").exists()
    (disk / "sub").mkdir()
    (disk / "sub" / "data").write_bytes(b"payload")
    (disk / "sub" / "empty").write_bytes(b"written, never synced")
    fsync(disk / "sub" / "data")
    fsync(disk / "sub")
    fsync(disk)
    power_cycle(lazy)
    assert (disk / "sub" / "data").read_bytes() == b"payload"
    assert (disk / "sub" / "empty").read_bytes() == b""  # its entry is durable, its data never was


def test_a_rename_is_durable_only_once_its_folder_is_synced(lazy: LazyMount) -> None:
    disk = lazy.mountpoint
    (disk / "final").write_bytes(b"old")
    fsync(disk / "final")
    fsync(disk)
    (disk / ".final.part").write_bytes(b"new")
    fsync(disk / ".final.part")
    os.replace(disk / ".final.part", disk / "final")
    power_cycle(lazy)
    assert (disk / "final").read_bytes() == b"old"  # the replaced file came back from the grave
    assert not (disk / ".final.part").exists()
    (disk / ".final.part").write_bytes(b"new")
    fsync(disk / ".final.part")
    os.replace(disk / ".final.part", disk / "final")
    fsync(disk)
    power_cycle(lazy)
    assert sorted(os.listdir(disk)) == ["final"] and (disk / "final").read_bytes() == b"new"


def test_an_unlink_and_a_truncate_are_undone_without_a_sync(lazy: LazyMount) -> None:
    disk = lazy.mountpoint
    for name in ("gone", "short"):
        (disk / name).write_bytes(name.encode() * 3000)
        fsync(disk / name)
    fsync(disk)
    (disk / "gone").unlink()
    os.truncate(disk / "short", 10)
    power_cycle(lazy)
    assert (disk / "gone").read_bytes() == b"gone" * 3000
    assert (disk / "short").read_bytes() == b"short" * 3000


def test_the_cut_kills_every_process_that_uses_the_mount(lazy: LazyMount, tmp_path: Path) -> None:
    disk = lazy.mountpoint
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); "
                               "print('open', flush=True); time.sleep(60)", str(disk / "held")],
                              stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    try:
        answer = power_cycle(lazy)
        assert holder.wait(10) == -9 and holder.pid in answer["killed"]
        assert bystander.poll() is None  # not on the mount: not killed
    finally:
        bystander.kill()
        bystander.wait()


def test_sqlite_keeps_its_full_commits_and_loses_the_others_whole(lazy: LazyMount) -> None:
    db = lazy.mountpoint / "queue.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (n INTEGER, pad TEXT)")
    for n in range(50):
        conn.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 3000))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for n in range(50, 80):
        conn.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 3000))
    conn.execute("PRAGMA synchronous = OFF")  # commits that never reach the disk
    for n in range(80, 120):
        conn.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 3000))
    reader = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
                               "print(c.execute('SELECT count(*) FROM t').fetchone()[0], flush=True); time.sleep(60)",
                               str(db)], stdout=subprocess.PIPE)
    assert reader.stdout is not None and reader.stdout.readline() == b"120\n"  # the -shm is shared, mapped
    conn.close()
    power_cycle(lazy)
    assert reader.wait(10) == -9
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*), max(n) FROM t").fetchone() == (80, 79)
    finally:
        conn.close()


def test_a_cut_that_keeps_some_unsynced_pages_never_loses_a_synced_one(lazy: LazyMount) -> None:
    disk = lazy.mountpoint
    (disk / "f").write_bytes(b"A" * PAGE * 64)
    fsync(disk / "f")
    fsync(disk)
    with open(disk / "f", "r+b") as f:
        f.write(b"B" * PAGE * 64)
    answer = lazy.cut(keep=0.5, seed=3)
    lazy.mount()
    pages = [(disk / "f").read_bytes()[n * PAGE:(n + 1) * PAGE] for n in range(64)]
    assert set(pages) == {b"A" * PAGE, b"B" * PAGE}  # some written back, some not: never anything else
    assert answer["pages_kept"] == pages.count(b"B" * PAGE) and 0 < answer["pages_kept"] < 64
