"""``kill -9`` of ``comfysup submit`` at random moments: the queue holds all of the file or none of it.

The real command runs as a subprocess on a 5,000-line file, each time into a fresh queue, and is
killed with SIGKILL after a random delay spread over its whole run (start-up, validation, insert,
commit), until 20 runs were killed before they finished. A second set of kills is triggered by the
size of the write-ahead log, so some surely land inside the insert transaction. After each kill the
database must open, pass ``PRAGMA integrity_check``, and hold 0 or 5,000 jobs.

The delays come from a seeded random; the seed is printed (rerun a failure with KILL_SEED=<seed>).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from cli_support import REPO, TRIVIAL, kill_submit, write_config

LINES = 5_000
TIME_KILLS = 20
WAL_KILLS = 6
PARALLEL = 2
INSERT_WAL_BYTES = 256 * 1024
"""More WAL than creating the schema writes (about 80 KiB): a kill past it landed inside the insert."""


def _jobs_file(directory: Path) -> Path:
    (directory / "wf.json").write_text(json.dumps(TRIVIAL))
    path = directory / "jobs.jsonl"
    with open(path, "w") as f:
        for n in range(LINES):
            f.write(json.dumps({"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kill/{n}")), "workflow": "wf.json",
                                "set": {"1.color": n, "3.filename_prefix": f"k{n}"},
                                "meta": {"n": n, "note": "x" * 100}}) + "\n")
    return path


def _start(run_dir: Path, jobs: Path) -> subprocess.Popen[bytes]:
    config = write_config(run_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "comfysup", "submit", "--config", str(config), str(jobs)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _inspect(run_dir: Path) -> int:
    """Jobs in the queue after the kill (0 when the database was never created); checks integrity."""
    path = run_dir / "var" / "queue.db"
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "jobs" not in tables:
            return 0
        count = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        if "job_specs" in tables:  # a job and its workflow are inserted together or not at all
            assert conn.execute("SELECT count(*) FROM job_specs").fetchone()[0] == count
        return count
    finally:
        conn.close()


def _wal_size(run_dir: Path) -> int:
    try:
        return (run_dir / "var" / "queue.db-wal").stat().st_size
    except FileNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_during_submit_leaves_all_or_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("KILL_SEED") or random.SystemRandom().randrange(2**32))
    print(f"kill seed {seed} (rerun with KILL_SEED={seed})")
    rng = random.Random(seed)
    jobs = _jobs_file(tmp_path)

    # Two submits run side by side (two cores), for the calibration as for every kill: half the wall time.
    started = time.monotonic()
    calibration = [_start(tmp_path / f"calibration-{n}", jobs) for n in range(PARALLEL)]
    for proc in calibration:
        assert proc.wait(timeout=120) == 0, proc.communicate()[1].decode()
    full_seconds = time.monotonic() - started
    assert _inspect(tmp_path / "calibration-0") == LINES
    full_bytes = (tmp_path / "calibration-0" / "var" / "queue.db").stat().st_size

    outcomes: list[tuple[str, float, int, int, bool]] = []
    for i in range(0, TIME_KILLS * 2, PARALLEL):
        if sum(1 for o in outcomes if o[4]) >= TIME_KILLS:
            break
        run_dirs = [tmp_path / f"time-{i + n}" for n in range(PARALLEL)]
        delays = [rng.uniform(0.0, full_seconds * 1.05) for _ in run_dirs]
        procs = [_start(run_dir, jobs) for run_dir in run_dirs]
        begun = time.monotonic()
        for delay, proc, run_dir in sorted(zip(delays, procs, run_dirs, strict=True), key=lambda x: x[0]):
            time.sleep(max(0.0, delay - (time.monotonic() - begun)))  # the random moment, not a wait for anything
            wal = _wal_size(run_dir)
            killed = kill_submit(proc)
            outcomes.append((f"after {delay:.3f} s", delay, wal, _inspect(run_dir), killed))

    for i in range(0, WAL_KILLS, PARALLEL):
        run_dirs = [tmp_path / f"wal-{n}" for n in range(i, min(i + PARALLEL, WAL_KILLS))]
        thresholds = [rng.uniform(INSERT_WAL_BYTES, full_bytes * 0.9) for _ in run_dirs]
        procs = [_start(run_dir, jobs) for run_dir in run_dirs]
        pending = list(zip(thresholds, procs, run_dirs, strict=True))
        while pending:
            time.sleep(0.0005)  # polling the WALs: each kill is triggered by its WAL's size
            for item in list(pending):
                threshold, proc, run_dir = item
                if proc.poll() is None and _wal_size(run_dir) < threshold:
                    continue
                wal = _wal_size(run_dir)
                killed = kill_submit(proc)
                outcomes.append((f"at WAL {threshold / 1e6:.1f} MB", 0.0, wal, _inspect(run_dir), killed))
                pending.remove(item)

    for moment, _, wal, count, killed in outcomes:
        print(f"{moment:>18}: WAL {wal / 1e6:5.2f} MB, {'killed' if killed else 'finished'}, {count} jobs")
    counts = [count for _, _, _, count, _ in outcomes]
    assert all(c in (0, LINES) for c in counts), f"a partial submit: {counts} (seed {seed})"
    during_insert = [o for o in outcomes if o[4] and o[3] == 0 and o[2] > INSERT_WAL_BYTES]
    assert len(during_insert) >= WAL_KILLS // 2, f"too few kills landed inside the insert (seed {seed})"
    assert sum(1 for o in outcomes if o[4]) >= TIME_KILLS + WAL_KILLS // 2

    # A queue left by a kill takes the same file afterwards, whole.
    survivor = next(tmp_path / f"wal-{i}" for i in range(WAL_KILLS) if _inspect(tmp_path / f"wal-{i}") == 0)
    rerun = _start(survivor, jobs)
    assert rerun.wait(timeout=120) == 0, rerun.communicate()[1].decode()
    assert _inspect(survivor) == LINES
