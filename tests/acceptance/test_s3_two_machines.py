"""Two machines on one PostgreSQL queue with outputs and inputs in a bucket: jobs submitted on machine A
(its API, comfy-sdk; and ``comfysup submit`` with an input file) run on machine B (``comfysup run``), B is
stopped, and A still hands out every output: comfy-sdk's ``to_bytes()`` follows A's redirect to the bucket, with
no machine-to-machine streaming. B never had the input file: it came through the bucket."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from comfy_sdk import Comfy
from input_images import INVERT, random_png
from pg_support import pg_url  # noqa: F401  (a fixture)

from comfysup.cli import main as cli
from comfysup.queue import open_queue
from tests.api_support import api_config, running_api
from tests.s3_support import SeaweedS3
from tests.supervisor_support import Supervised, wait_for

ROOT = Path(__file__).resolve().parents[2]
TRIVIAL = ROOT / "examples" / "workflows" / "trivial.json"


@pytest.mark.timeout(120)
def test_outputs_of_machine_b_are_served_by_machine_a_after_b_stopped(
        tmp_path: Path, s3_server: SeaweedS3, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    bucket = s3_server.bucket("fleet")
    store = s3_server.store_section(f"s3://{bucket}/outputs")
    inputs = {"url": f"s3://{bucket}/inputs"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    b = Supervised(tmp_path / "b", extra_sections={"queue": {"url": pg_url}, "store": {"dir": "var/staging", **store},
                                                   "assets": inputs, "api": {"listen": ""}})
    a = api_config(tmp_path / "a", {"store": {"dir": str(tmp_path / "a" / "store"), **store}, "assets": inputs},
                   queue_url=pg_url)
    picture = tmp_path / "a" / "photo.png"
    picture.write_bytes(random_png(33, width=8, height=8))
    (tmp_path / "a" / "invert.json").write_text(json.dumps(INVERT))
    line = {"id": "0d7e4f1a-0000-4000-8000-000000000001", "workflow": "invert.json",
            "set": {"1.image": {"file": "photo.png"}, "3.filename_prefix": "inverted"}}
    (tmp_path / "a" / "jobs.jsonl").write_text(json.dumps(line) + "\n")
    assert cli(["submit", "--config", a.source, str(tmp_path / "a" / "jobs.jsonl")]) == 0  # on A: input → bucket
    try:
        proc = b.start(env={"COMFYSUP_HOSTNAME": "machine-b"})
        b.wait_ready(proc, seconds=30)
        with running_api(a) as url:
            monkeypatch.setenv("COMFY_BASE_URL", url)
            with Comfy() as client:
                job = client.run(client.workflows.from_file(TRIVIAL), timeout=60)
                assert job.status == "succeeded"
            queue = open_queue(a)
            try:
                inverted = wait_for(lambda: (j := queue.reads.get(line["id"])).state == "done" and j, 30,
                                    "the job with an input to end", b.describe)
                records = {j.id: j for j in queue.reads.get_many([job.id, line["id"]])}
            finally:
                queue.close()
            assert b.stop(proc) == 0
            assert {r.machine for r in records.values()} == {"machine-b"}
            with Comfy() as client:  # B is gone: A serves both jobs' outputs from the bucket
                for job_id in (job.id, line["id"]):
                    [output] = client.jobs.get(job_id).get_outputs("3")
                    data = output.to_bytes()
                    [recorded] = records[job_id].outputs
                    assert recorded.path.startswith(f"s3://{bucket}/outputs/{job_id}/")
                    assert hashlib.sha256(data).hexdigest() == recorded.sha256 and data.startswith(b"\x89PNG")
        assert inverted.outputs and not list((tmp_path / "b" / "var" / "staging").rglob("*.png"))
    finally:
        b.cleanup()
