"""Outputs in a bucket ([store] url), against a real S3 server (SeaweedFS, tests/s3_support.py).

The attempt stages the outputs and records the job ``storing``; the machine's uploader (comfysup.runner.uploader)
makes it ``done`` once every object is confirmed in the bucket with the hash recorded for it. A bucket that does
not answer spends no attempt (the job is never done early, never dead-lettered by it); wrong credentials or a
missing bucket are said at start, never by a credential's value.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from comfysup.config import load_config
from comfysup.errors import ConfigError
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.loop import Runner
from comfysup.runner.objectstore import ObjectStore, check_buckets, result_store
from comfysup.runner.options import RunnerOptions
from comfysup.runner.uploader import Uploader
from comfysup.storage import s3
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, job_id, submit, trivial_job
from tests.s3_support import SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.timeout(90)


def s3_config(tmp: Path, store: dict[str, Any], **runner: Any) -> Path:
    settings = {"attempts": 2, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
                "timeout_seconds": 20.0, "poll_seconds": 0.2, "lease_seconds": 10.0, "heartbeat_seconds": 0.5,
                "http_timeout_seconds": 5.0, **runner}
    doc = {"queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "staging"), **store},
           "comfyui": {"gpus": "cpu:1"}, "runner": settings}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path


def test_a_done_job_has_every_output_confirmed_in_the_bucket_and_nothing_left_staged(
        tmp_path: Path, s3_server: SeaweedS3) -> None:
    bucket = s3_server.bucket("outputs")
    path = s3_config(tmp_path, s3_server.store_section(f"s3://{bucket}/renders/prod"))
    config = load_config(str(path), env={})
    assert check_buckets(config) == []
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        queue = submit(path, [trivial_job(1), trivial_job(2)])
        counts = Runner(config, "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert counts["done"] == 2  # the runner's part is over: the jobs wait for the uploader
    assert {queue.reads.get(job_id(n)).state for n in (1, 2)} == {"storing"}
    assert s3_server.objects(bucket) == {}
    uploader = Uploader(config, queue, result_store(config))  # type: ignore[arg-type]
    uploader.run_once()
    assert uploader.uploaded == 2
    stored = s3_server.objects(bucket)
    for n in (1, 2):
        job = queue.reads.get(job_id(n))
        assert job.state == "done" and job.outputs and len(job.attempts) == 1
        for output in job.outputs:
            key = f"renders/prod/{job_id(n)}/{output.name}"
            assert output.path == f"s3://{bucket}/{key}"
            assert hashlib.sha256(stored[key]).hexdigest() == output.sha256 and len(stored[key]) == output.size
    assert len(stored) == sum(len(queue.reads.get(job_id(n)).outputs) for n in (1, 2))  # nothing else in the bucket
    assert not any((tmp_path / "staging").iterdir())  # each staging folder removed once uploaded


def test_a_bucket_that_does_not_answer_spends_no_attempt_and_the_files_wait_staged(
        tmp_path: Path, s3_server: SeaweedS3) -> None:
    """A closed port stands for a service that is down: the job ran once, its attempt ended with the files
    staged (storing, not retried, not dead); each upload that fails only says why and backs off."""
    closed = s3_server.store_section("s3://nowhere/p", endpoint_url="http://127.0.0.1:9",
                                     upload_base_delay_seconds=0.01, upload_max_delay_seconds=0.02)
    path = s3_config(tmp_path, closed, attempts=2)
    config = load_config(str(path), env={})
    [warning] = check_buckets(config)  # said at start, but not a refusal: the service may come back
    assert "s3://nowhere/p" in warning and "cannot reach the service" in warning
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        queue = submit(path, [trivial_job(1)])
        counts = Runner(config, "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
        assert fake.stats()["prompts"][job_id(1)]["executed"] == 1
    now = [0.0]
    uploader = Uploader(config, queue, result_store(config), clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(3):
        wait = uploader.run_once()
        assert 0 <= wait <= 0.02
        now[0] += 0.02  # the backoff passed
    job = queue.reads.get(job_id(1))
    assert (job.state, job.attempt, counts["dead"]) == ("storing", 1, 0)
    assert "cannot store the output in the bucket: uploading s3://nowhere/p/" in (job.reason or "")
    assert [Path(o.path).is_file() for o in job.outputs] == [True] and job.staged_in == str(tmp_path / "staging" /
                                                                                             job_id(1))
    assert uploader.plan.failures == 3 and uploader.uploaded == 0


def test_a_job_waiting_past_upload_give_up_hours_is_dead_with_why_and_its_files_go(
        tmp_path: Path, s3_server: SeaweedS3) -> None:
    closed = s3_server.store_section("s3://nowhere/p", endpoint_url="http://127.0.0.1:9", upload_give_up_hours=1.0)
    path = s3_config(tmp_path, closed)
    config = load_config(str(path), env={})
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        queue = submit(path, [trivial_job(1)])
        Runner(config, "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    uploader = Uploader(config, queue, result_store(config))  # type: ignore[arg-type]
    uploader.run_once()
    later = Uploader(config, queue, result_store(config), wall=lambda: time.time() + 3601)  # type: ignore[arg-type]
    later.run_once()
    job = queue.reads.get(job_id(1))
    assert job.state == "dead" and job.reason is not None
    assert job.reason.startswith("could not store the outputs in the bucket for 1 h ([store] upload_give_up_hours)"
                                 ", last: cannot store the output in the bucket")
    assert not (tmp_path / "staging" / job_id(1)).exists()


@pytest.mark.parametrize("problem", ["secret", "bucket"])
def test_wrong_credentials_or_a_missing_bucket_are_refused_at_start_without_showing_the_secret(
        tmp_path: Path, s3_server: SeaweedS3, problem: str) -> None:
    bucket = s3_server.bucket("refused")
    wrong_secret = "not-the-secret-" + SECRET_KEY[::-1]
    section = (s3_server.store_section(f"s3://{bucket}/x", secret_access_key=wrong_secret) if problem == "secret"
               else s3_server.store_section("s3://no-such-bucket-here/x"))
    config = load_config(str(s3_config(tmp_path, section)), env={})
    with pytest.raises(ConfigError) as caught:
        check_buckets(config)
    message = str(caught.value)
    assert "[store] url" in message and str(tmp_path / "config.toml") in message
    assert ("credentials are refused" if problem == "secret" else "no such bucket") in message
    assert wrong_secret not in message and SECRET_KEY not in message and wrong_secret[:8] not in message


def test_a_large_output_goes_up_in_parts_and_its_presigned_url_serves_its_bytes(
        tmp_path: Path, s3_server: SeaweedS3) -> None:
    bucket = s3_server.bucket("parts")
    section = s3_server.store_section(f"s3://{bucket}", multipart_threshold_mb=5)
    config = load_config(str(s3_config(tmp_path, section)), env={})
    store = result_store(config)
    assert isinstance(store, ObjectStore)
    body = os.urandom(11 * 2**20 + 123)  # three parts of 5 MiB
    job = job_id(7)
    store.prepare(job)
    staged = store.write(job, "clips/video.mp4", iter([body[i:i + 2**20] for i in range(0, len(body), 2**20)]))
    store.finish(job)
    assert staged.path == str(tmp_path / "staging" / job / "clips" / "video.mp4")
    output = store.upload(job, staged)
    assert output.path == f"s3://{bucket}/{job}/clips/video.mp4" and output.sha256 == hashlib.sha256(body).hexdigest()
    head = s3_server.client().head_object(Bucket=bucket, Key=f"{job}/clips/video.mp4")
    assert head["ETag"].endswith('-3"')  # uploaded as three parts
    assert head["Metadata"][s3.SHA256_METADATA] == output.sha256
    url = s3.presign(s3.client(config.store), output.path, 60)
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == body
    store.forget(job)
    assert not (tmp_path / "staging" / job).exists()
    assert s3.delete_prefixes(s3.client(config.store), [s3.job_prefix(output.path, job)]) == 1
    assert s3_server.objects(bucket) == {}


def test_comfysup_work_refuses_to_start_with_a_missing_bucket(tmp_path: Path, s3_server: SeaweedS3) -> None:
    """Said once, before any runner claims a job, and the command exits: not a dead letter per job."""
    path = s3_config(tmp_path, s3_server.store_section("s3://no-such-bucket-at-all/x"))
    submit(path, [trivial_job(1)])
    answer = comfysup("work", "--config", str(path), "--server", "a=http://127.0.0.1:9", "--until-empty",
                      timeout=60)
    assert answer.returncode != 0
    assert "[store] url s3://no-such-bucket-at-all/x: no such bucket" in answer.stderr
    assert SECRET_KEY not in answer.stderr + answer.stdout
    queue = SQLiteQueue(tmp_path / "queue.db")
    assert queue.reads.get(job_id(1)).state == "queued" and queue.reads.get(job_id(1)).attempt == 0


def test_comfysup_work_uploads_through_its_own_thread_and_ends_with_every_job_done(
        tmp_path: Path, s3_server: SeaweedS3) -> None:
    bucket = s3_server.bucket("work")
    path = s3_config(tmp_path, s3_server.store_section(f"s3://{bucket}/w"))
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        queue = submit(path, [trivial_job(1), trivial_job(2), trivial_job(3)])
        answer = comfysup("work", "--config", str(path), "--server", f"a={fake.url}", "--until-empty", timeout=60)
    assert answer.returncode == 0, answer.stderr[-2000:]
    jobs = queue.reads.get_many([job_id(n) for n in (1, 2, 3)])
    assert {j.state for j in jobs} == {"done"} and all(o.path.startswith(f"s3://{bucket}/w/") for j in jobs
                                                       for o in j.outputs)
    assert len(s3_server.objects(bucket)) == 3
