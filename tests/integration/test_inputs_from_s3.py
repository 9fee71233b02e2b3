"""{"s3": "s3://bucket/key"} inputs fetched at submit from a real S3 server (SeaweedFS,
tests/s3_support.py) with boto3's credentials from the environment or an AWS profile and [inputs]
s3_endpoint_url; what S3 answers wrong said per line; the buckets a door may read bounded."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from s3_support import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, aws_env  # noqa: F401  (seaweed: conftest.py)

from comfysup import assets
from comfysup.config import InputsConfig
from comfysup.jobs import JobsFile
from comfysup.queue.sqlite import SQLiteQueue
from tests.cli_support import cli, db_path
from tests.input_images import INVERT, random_png

DATA = random_png(7)
pytestmark = pytest.mark.timeout(120)  # the session's first test waits for weed mini (a few seconds)


def write_jobs(folder: Path, values: list[dict]) -> Path:
    (folder / "wf.json").write_text(json.dumps(INVERT))
    path = folder / "jobs.jsonl"
    path.write_text("".join(json.dumps({"id": str(uuid.UUID(int=n)), "workflow": "wf.json",
                                        "set": {"1.image": v}}) + "\n" for n, v in enumerate(values, start=1)))
    return path


def settings(server: SeaweedS3, **more: object) -> InputsConfig:
    return InputsConfig(s3_endpoint_url=server.endpoint, s3_region=REGION, timeout_seconds=10.0, **more)


@pytest.mark.usefixtures("aws_env")
def test_an_s3_input_is_stored_and_what_s3_refuses_is_said_per_line(tmp_path: Path, seaweed: SeaweedS3) -> None:
    bucket = seaweed.bucket()
    seaweed.client().put_object(Bucket=bucket, Key="in/cat.png", Body=DATA)
    seaweed.client().put_object(Bucket=bucket, Key="in/big.png", Body=b"x" * 5000)
    path = write_jobs(tmp_path, [{"s3": f"s3://{bucket}/in/cat.png"}, {"s3": f"s3://{bucket}/in/missing.png"},
                                 {"s3": f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/cat.png"},
                                 {"s3": f"s3://{bucket}/in/big.png"}])
    jobs = JobsFile(path, remote=settings(seaweed), max_input_bytes=4000)
    try:
        found = [f"{p.line}: {p.message}" for p in jobs.validate().problems]
    finally:
        jobs.close()
    assert len(found) == 3, found
    assert found[0].startswith("2: ") and "/in/missing.png: no such object" in found[0]
    assert found[1].startswith("3: ") and "no such bucket" in found[1]
    assert found[2].startswith("4: ") and "is 5,000 bytes; an input file may have at most 4,000" in found[2]
    path = write_jobs(tmp_path, [{"s3": f"s3://{bucket}/in/cat.png"}])
    q = SQLiteQueue(tmp_path / "queue.db")
    jobs = JobsFile(path, remote=settings(seaweed))
    try:
        assert jobs.validate().ok
        assert q.intake.submit(jobs.jobs()).inserted == 1
    finally:
        jobs.close()
    ref = q.reads.get(str(uuid.UUID(int=1))).params["1.image"]
    assert assets.ref_name(ref) == "cat.png" and assets.ref_hash(ref) == assets.hash_bytes(DATA)
    assert q.assets.read_asset(assets.hash_bytes(DATA)) == DATA
    q.close()


def test_credentials_come_from_an_aws_profile_and_wrong_ones_are_said(tmp_path: Path, seaweed: SeaweedS3,
                                                                      aws_env: None,  # noqa: F811
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = seaweed.bucket()
    seaweed.client().put_object(Bucket=bucket, Key="cat.png", Body=DATA)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[render]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
                           f"[wrong]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = not-it\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    path = write_jobs(tmp_path, [{"s3": f"s3://{bucket}/cat.png", "blake3": assets.hash_bytes(DATA)}])
    for profile, problem in (("render", None), ("wrong", "the secret key does not match the access key")):
        monkeypatch.setenv("AWS_PROFILE", profile)
        jobs = JobsFile(path, remote=settings(seaweed))
        try:
            found = [p.message for p in jobs.validate().problems]
        finally:
            jobs.close()
        assert found == ([] if problem is None else [f"set '1.image': s3://{bucket}/cat.png: {problem}"])


@pytest.mark.usefixtures("aws_env")
def test_submit_reads_its_endpoint_from_the_config_and_doors_read_only_named_buckets(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, seaweed: SeaweedS3) -> None:
    bucket = seaweed.bucket()
    seaweed.client().put_object(Bucket=bucket, Key="cat.png", Body=DATA)
    path = write_jobs(tmp_path, [{"s3": f"s3://{bucket}/cat.png"}])
    config = tmp_path / "config.toml"
    config.write_text(f'[queue]\npath = "var/queue.db"\n[inputs]\ns3_endpoint_url = "{seaweed.endpoint}"\n'
                      f's3_region = "{REGION}"\n')
    code, out, err = cli(capsys, "submit", "--config", str(config), str(path))
    assert code == 0 and "submitted 1 job(s)" in out, err
    q = SQLiteQueue(db_path(tmp_path))
    assert q.assets.read_asset(assets.hash_bytes(DATA)) == DATA
    q.close()
    # The broker and the API read no bucket unless [inputs] s3_buckets names it (their callers would read with
    # this machine's credentials); comfysup submit, run by its user, reads any.
    for allowed, expected in (((), "is not one of [inputs] s3_buckets (none"), (("other",), "(other)"),
                              ((bucket,), None)):
        jobs = JobsFile(path, remote=settings(seaweed), s3_buckets=allowed)
        try:
            found = [p.message for p in jobs.validate().problems]
        finally:
            jobs.close()
        assert (found == []) if expected is None else (expected in found[0]), found
