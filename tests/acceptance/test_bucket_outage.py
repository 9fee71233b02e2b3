"""The bucket goes away while jobs finish: ``comfysup run`` with outputs in a bucket (SeaweedFS), the S3 server
stopped while 20 jobs run on the fakes. The GPU (fake) keeps executing them during the outage: each ends with its
outputs staged (``storing``, shown by ``comfysup status`` with the upload outbox's oldest age), spending one
attempt and no retry; the supervisor is restarted mid-outage; once the bucket is back every job is ``done`` with
every object confirmed and hashed, none dead, none executed twice.

The default suite holds the bucket down about ten seconds (the restart included); the ``chaos`` mark runs the
same for two minutes.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from comfysup.cli import main as cli
from tests.s3_support import SeaweedS3
from tests.supervisor_support import Supervised, executions, job, wait_for

JOBS = 20


def bucket_down_while_jobs_finish(tmp: Path, server: SeaweedS3, capsys: pytest.CaptureFixture[str],
                                  down_seconds: float) -> dict[str, float]:
    bucket = server.bucket("outage")
    store = server.store_section(f"s3://{bucket}/out", dir="var/staging", upload_base_delay_seconds=0.2,
                                 upload_max_delay_seconds=2.0)
    sup = Supervised(tmp, node_ms=20.0, runner={"attempts": 2}, extra_sections={"store": store, "api": {"listen": ""}})
    try:
        proc = sup.start()
        sup.wait_ready(proc, seconds=30)
        server.stop()
        down_at = time.monotonic()
        ids = sup.submit([job(n) for n in range(JOBS)])
        staged = wait_for(lambda: (jobs := sup.jobs(ids)) and all(j.state == "storing" for j in jobs.values()) and jobs,
                          60, f"{JOBS} jobs staged while the bucket is down", sup.describe)
        all_staged_after = time.monotonic() - down_at
        capsys.readouterr()
        assert cli(["status", "--json", "--config", str(sup.config_path)]) == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["counts"]["storing"], status["counts"]["dead"], status["counts"]["done"]) == (JOBS, 0, 0)
        uploads = status["outboxes"]["uploads"]
        assert uploads["items"] == JOBS and uploads["bytes"] > 0 and uploads["oldest_age_seconds"] > 0
        assert cli(["status", "--config", str(sup.config_path)]) == 0
        text = capsys.readouterr().out
        assert f"storing {JOBS}" in text and f"outboxes: uploads {JOBS} (" in text and "oldest " in text
        assert all(j.attempt == 1 and [a.outcome for a in j.attempts] == ["storing"] for j in staged.values())
        slots = sup.state()["slots"]  # type: ignore[index]
        assert sum(executions(s["url"], i) for s in slots for i in ids) == JOBS  # each executed once, all while down
        assert sup.stop(proc) == 0  # restarted mid-outage: the outbox is the queue's rows and the staged files
        proc = sup.start()
        sup.wait_ready(proc, seconds=30)
        time.sleep(max(0.0, down_seconds - (time.monotonic() - down_at)))  # the outage itself, held this long
        server.start()
        up_at = time.monotonic()
        done = sup.wait_terminal(ids, seconds=60)
        back_after = time.monotonic() - up_at
        assert {j.state for j in done.values()} == {"done"}, {j.id: (j.state, j.reason) for j in done.values()}
        objects = server.objects(bucket)
        for record in done.values():
            assert record.attempt == 1 and record.outputs
            for output in record.outputs:
                key = output.path.removeprefix(f"s3://{bucket}/")
                assert hashlib.sha256(objects[key]).hexdigest() == output.sha256
        slots = sup.state()["slots"]  # type: ignore[index]
        assert sum(executions(s["url"], i) for s in slots for i in ids) == 0  # none executed again after the restart
        assert not list((tmp / "var" / "staging").rglob("*.png"))
        assert sup.stop(proc) == 0
        return {"down_s": round(time.monotonic() - down_at - back_after, 1), "all_staged_after_s":
                round(all_staged_after, 1), "all_done_after_restart_s": round(back_after, 1)}
    finally:
        sup.cleanup()
        if server.process is None or server.process.poll() is not None:
            server.start()  # the session's server, for the tests after this one


@pytest.mark.timeout(120)
def test_a_bucket_down_while_jobs_finish_spends_no_attempt_and_keeps_the_gpu_busy(
        tmp_path: Path, s3_server: SeaweedS3, capsys: pytest.CaptureFixture[str]) -> None:
    bucket_down_while_jobs_finish(tmp_path, s3_server, capsys, down_seconds=8.0)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_bucket_down_two_minutes_while_jobs_finish(tmp_path: Path, s3_server: SeaweedS3,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    figures = bucket_down_while_jobs_finish(tmp_path, s3_server, capsys, down_seconds=120.0)
    print(f"bucket outage of two minutes: {figures}")
