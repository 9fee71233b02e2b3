"""Every door hands out URLs for outputs in a bucket: ``show``, ``results --csv``, webhooks and broker
results (one body), the API (presigned ``url`` in the job, a 302 from the content route that comfy-sdk follows),
the status page's file links (307); ``comfysup prune`` deletes the pruned jobs' objects. One job, run once against
the real S3 server."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from comfy_sdk import Comfy

from comfysup.commands import results, show
from comfysup.config import Config
from comfysup.observability.webhooks import record_body
from comfysup.queue.base import JobRecord
from comfysup.runner.loop import Runner
from comfysup.runner.objectstore import result_store
from comfysup.runner.options import RunnerOptions
from comfysup.runner.uploader import Uploader
from comfysup.storage.links import Links, origin
from fake_comfy import FakeComfy
from tests.api_support import api_config, running_api
from tests.runner_helpers import ROOT, job_id, submit, trivial_job
from tests.s3_support import SeaweedS3

pytestmark = pytest.mark.timeout(90)


@dataclass
class Done:
    config: Config
    job: JobRecord
    bucket: str
    data: bytes


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedS3) -> Iterator[Done]:
    tmp = tmp_path_factory.mktemp("doors")
    bucket = seaweed.bucket("doors")
    store = {"dir": str(tmp / "staging"), **seaweed.store_section(f"s3://{bucket}/out", url_ttl_seconds=600)}
    config = api_config(tmp, {"store": store, "runner": {"poll_seconds": 0.2, "heartbeat_seconds": 0.5}})
    with FakeComfy(base_directory=tmp / "fake", node_ms=5) as fake:
        queue = submit(Path(config.source), [trivial_job(1)])
        assert Runner(config, "cpu0", fake.url, RunnerOptions(until_empty=True)).run()["done"] == 1
    Uploader(config, queue, result_store(config)).run_once()  # type: ignore[arg-type]  # the outbox: storing → done
    job = queue.reads.get(job_id(1))
    assert job.state == "done"
    queue.close()
    [output] = job.outputs
    yield Done(config, job, bucket, seaweed.objects(bucket)[f"out/{job.id}/{output.name}"])


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read()


def test_show_and_results_give_the_location_and_a_presigned_url(done: Done) -> None:
    links = Links(done.config.store)
    before = time.time()
    [shown] = show.as_dict(done.job, False, [], links)["outputs"]
    assert shown["location"] == shown["path"] == f"s3://{done.bucket}/out/{done.job.id}/{shown['name']}"
    assert before + 600 <= shown["url_expires_at"] <= time.time() + 600
    body = fetch(shown["url"])
    assert body == done.data and hashlib.sha256(body).hexdigest() == shown["sha256"]
    assert f"    url      {shown['url'].split('?')[0]}" in show.render(done.job, False, [], links)
    row = results.row(done.job, [], True, links)
    assert row["locations"] == shown["path"] and fetch(row["urls"]) == done.data
    assert row["url_expires_at"].endswith("Z")


def test_webhooks_and_broker_results_carry_the_url(done: Done) -> None:
    [file] = record_body(done.job, Links(done.config.store))["files"]
    assert file["location"].startswith(f"s3://{done.bucket}/") and fetch(file["url"]) == done.data


def test_the_api_hands_out_presigned_urls_and_redirects_the_content_route(
        done: Done, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_api(done.config) as url:
        body = httpx.get(f"{url}/api/v2/jobs/{done.job.id}").json()
        [output] = body["outputs"]
        assert output["url"].startswith(done.config.store.endpoint_url) and fetch(output["url"]) == done.data
        assert output["url_expires_at"].endswith("Z")
        content = httpx.get(f"{url}/api/v2/assets/{output['id']}/content", follow_redirects=False)
        assert content.status_code == 302 and fetch(content.headers["Location"]) == done.data
        monkeypatch.setenv("COMFY_BASE_URL", url)
        with Comfy() as client:
            [sdk_output] = client.jobs.get(done.job.id).get_outputs("3")
            assert sdk_output.to_bytes() == done.data


def test_the_status_pages_file_link_redirects_to_the_bucket(done: Done) -> None:
    from comfysup.observability.web import App
    from comfysup.queue import open_queue

    queue = open_queue(done.config, create=False)
    try:
        app = App(queue, None, lambda: None, done.config.resolve(done.config.store.dir),  # type: ignore[arg-type]
                  links=Links(done.config.store), image_origin=origin(done.config.store, done.config.store.url))
        assert f"img-src 'self' {done.config.store.endpoint_url};" in app.page_csp  # thumbnails from the bucket
        [output] = done.job.outputs
        answer = app.get(f"/files/{done.job.id}/{output.name}")
        assert answer.status == 307 and fetch(answer.headers["Location"]) == done.data
        assert app.get(f"/files/{done.job.id}/other.png").status == 404
    finally:
        queue.close()


def test_prune_deletes_the_pruned_jobs_objects(done: Done, seaweed: SeaweedS3) -> None:
    """Last in this module: it removes the job the others read."""
    assert seaweed.objects(done.bucket)
    answer = subprocess.run([sys.executable, "-m", "comfysup", "prune", "--config", done.config.source,
                             "--done-before", "0m"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert answer.returncode == 0, answer.stderr
    assert f"deleted 1 object(s) of the removed jobs from s3://{done.bucket}/out" in answer.stdout
    assert seaweed.objects(done.bucket) == {}
