"""What comfysup makes durable survives a power cut: the lazy filesystem (tests/lazyfs.py) forgets every write
and every name that was not fsynced, so each of these fails where a folder made for a durable file is not
synced in its parent (the store's root and job folder, the queue's folder, the asset folder)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import blake3
import tomli_w
from input_images import INVERT, random_png
from lazyfs import LazyMount
from supervisor_support import REPO, job

from comfysup.runner.store import ResultStore


def power_cycle(lazy: LazyMount) -> None:
    lazy.cut()
    lazy.mount()


def test_a_stored_file_survives_with_its_job_folder_and_the_store_made_for_it(lazy: LazyMount) -> None:
    store = ResultStore(lazy.mountpoint / "var" / "results", 2**20)
    image = random_png(7, width=4, height=4)
    store.prepare("job-1")
    out = store.write("job-1", "out.png", [image])
    power_cycle(lazy)
    assert (lazy.mountpoint / "var" / "results" / "job-1" / "out.png").read_bytes() == image
    assert out.size == len(image)


def test_an_acknowledged_submit_survives_with_its_queue_folder_and_its_input_file(lazy: LazyMount,
                                                                                tmp_path: Path) -> None:
    (tmp_path / "invert.json").write_text(json.dumps(INVERT))
    image = random_png(8, width=4, height=4, pad=20_000)
    (tmp_path / "in.png").write_bytes(image)
    spec = {**job(1), "workflow": "invert.json", "set": {"1.image": {"file": "in.png"}}}
    (tmp_path / "jobs.jsonl").write_text(json.dumps(spec) + "\n")
    config = tmp_path / "config.toml"  # the queue in a folder it makes, on the lazy disk
    config.write_bytes(tomli_w.dumps({"queue": {"path": "disk/var/queue.db"}}).encode())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "comfysup", "submit", "--config", str(config),
                           str(tmp_path / "jobs.jsonl")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    power_cycle(lazy)
    queue = lazy.mountpoint / "var" / "queue.db"
    conn = sqlite3.connect(f"file:{queue}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT id FROM jobs").fetchall() == [(spec["id"],)]
    finally:
        conn.close()
    hexa = blake3.blake3(image).hexdigest()
    assert (lazy.mountpoint / "var" / "assets" / hexa[:2] / hexa).read_bytes() == image
