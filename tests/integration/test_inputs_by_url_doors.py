"""Through every door: ``comfysup submit`` (file:line errors), the RabbitMQ consumer (the invalid
queue) and the API (an ``info.url`` in a ``core/ASSET`` reference; 422 ``missing_asset``). The file server is on
127.0.0.1, so each test sets ``[inputs] allow_private`` (and one shows the refusal without it)."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest
from comfy_low.models import ErrorEnvelope
from comfy_low.models import Job as JobModel
from input_server import file_server

from comfysup import assets, records
from comfysup.broker.consumer import Consumer
from comfysup.config import InputsConfig
from comfysup.queue import open_queue
from comfysup.queue.sqlite import SQLiteQueue
from tests.api_support import api_config, running_api
from tests.broker_support import Broker, Running, broker, broker_config, encode, wait_for  # noqa: F401
from tests.cli_support import cli, count_jobs, db_path
from tests.input_images import INVERT, random_png

DATA = random_png(3)


def line(n: int, value: dict[str, Any]) -> str:
    return json.dumps({"id": str(uuid.UUID(int=n)), "workflow": "wf.json", "set": {"1.image": value}})


def submit_folder(tmp_path: Path, lines: list[str], inputs: str = "") -> Path:
    (tmp_path / "wf.json").write_text(json.dumps(INVERT))
    (tmp_path / "jobs.jsonl").write_text("".join(f"{x}\n" for x in lines))
    (tmp_path / "config.toml").write_text(f'[queue]\npath = "var/queue.db"\n{inputs}')
    return tmp_path / "config.toml"


def test_submit_fetches_with_allow_private_and_refuses_without_it(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    with file_server(files={"/in/cat.png": DATA}) as server:
        url = f"{server.url}/in/cat.png"
        config = submit_folder(tmp_path, [line(1, {"url": url}), line(2, {"url": url, "name": "two.png"})])
        code, _, err = cli(capsys, "submit", "--config", str(config), str(tmp_path / "jobs.jsonl"))
        assert code == 2 and server.got == [], err
        assert "jobs.jsonl:1: set '1.image': http://127.0.0.1:" in err and "127.0.0.1 is a loopback address; " \
            "set [inputs] allow_private = true" in err and "jobs.jsonl:2: " in err
        assert count_jobs(tmp_path) == 0
        config.write_text(config.read_text() + "[inputs]\nallow_private = true\n")
        code, out, err = cli(capsys, "submit", "--config", str(config), str(tmp_path / "jobs.jsonl"))
        assert code == 0 and "submitted 2 job(s)" in out, err
        assert server.got == ["/in/cat.png"]
    q = SQLiteQueue(db_path(tmp_path))
    try:
        first, second = (q.reads.get(str(uuid.UUID(int=n))).params["1.image"] for n in (1, 2))
        assert assets.ref_name(first) == "cat.png" and assets.ref_name(second) == "two.png"
        assert assets.ref_hash(first) == assets.ref_hash(second) == assets.hash_bytes(DATA)
        assert q.assets.read_asset(assets.hash_bytes(DATA)) == DATA
    finally:
        q.close()  # the jobs hold the file itself, read from the asset store after the server stopped


def test_the_download_bar_draws_on_a_terminal_only() -> None:
    from comfysup.commands.submit import DownloadBar

    shown, piped = io.StringIO(), io.StringIO()
    for bar in (DownloadBar(shown, terminal_only=False, delay=0), DownloadBar(piped)):
        bar.start("cat.png", 2048)
        bar.advance(1024)
        bar.end()
    assert "fetching cat.png" in shown.getvalue() and "/2.00k" in shown.getvalue()
    assert piped.getvalue() == ""  # a StringIO is no terminal: nothing drawn


def test_the_consumer_fetches_and_sends_a_refused_input_to_the_invalid_queue(tmp_path: Path,
                                                                             broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker)
    config = records.replace(config, inputs=InputsConfig(allow_private=True, timeout_seconds=5.0))
    (tmp_path / "workflows" / "wf.json").write_text(json.dumps(INVERT))
    with file_server(files={"/cat.png": DATA}) as server:
        good = line(1, {"url": f"{server.url}/cat.png"})
        missing = line(2, {"url": f"{server.url}/gone.png"})
        bucket = line(3, {"s3": "s3://secrets/cat.png"})
        broker.publish([good.encode(), missing.encode(), bucket.encode()], ["m1", "m2", "m3"])
        queue = open_queue(config)
        try:
            with Running(Consumer(config, queue)) as consumer:
                wait_for(lambda: consumer.counts["acked"] == 3, what="3 acknowledged")
            got = {props.message_id: json.loads(body) for props, body in
                   broker.drain(broker.names["invalid_queue"], expect=2)}
            assert set(got) == {"m2", "m3"}
            assert "HTTP 404" in got["m2"]["reason"]
            assert "bucket 'secrets' is not one of [inputs] s3_buckets" in got["m3"]["reason"]
            [job] = list(queue.reads.iter_jobs())
            assert assets.ref_hash(job.params["1.image"]) == assets.hash_bytes(DATA)
            assert queue.assets.read_asset(assets.hash_bytes(DATA)) == DATA
            assert consumer._reader is not None and consumer._reader.inputs._staging is None  # staging removed
        finally:
            queue.close()


def test_a_message_redelivered_after_its_urls_content_changed_is_the_same_job(tmp_path: Path,
                                                                               broker: Broker) -> None:  # noqa: F811
    """The consumer inserts a message without an id, then loses its connection before the ack; the URL serves other
    bytes by the redelivery. The message is named by its line as written (the URL), not by the bytes fetched: the
    redelivery is the job already in the queue, not a second job (none runs twice) nor an invalid message."""
    config = broker_config(tmp_path, broker)
    config = records.replace(config, inputs=InputsConfig(allow_private=True, timeout_seconds=5.0))
    (tmp_path / "workflows" / "wf.json").write_text(json.dumps(INVERT))
    with file_server(files={"/cat.png": DATA}) as server:
        body = json.dumps({"workflow": "wf.json", "set": {"1.image": {"url": f"{server.url}/cat.png"}}}).encode()
        cuts: list[int] = []

        def cut_once() -> None:  # committed, not acknowledged: RabbitMQ delivers the message again
            if not cuts:
                cuts.append(1)
                server.files["/cat.png"] = random_png(4)
                raise pika.exceptions.StreamLostError("cut between commit and ack (test)")

        broker.publish([body])
        queue = open_queue(config)
        try:
            with Running(Consumer(config, queue, after_commit=cut_once)) as consumer:
                wait_for(lambda: consumer.counts["acked"] == 1, what="the redelivery acknowledged")
                assert (consumer.counts["inserted"], consumer.counts["existing"]) == (1, 1)
            assert server.got == ["/cat.png", "/cat.png"]  # the redelivery fetched the changed bytes
            [job] = list(queue.reads.iter_jobs())
            assert assets.ref_hash(job.params["1.image"]) == assets.hash_bytes(DATA)
            assert broker.depth(broker.names["invalid_queue"]) == 0
        finally:
            queue.close()


def reference(url: str, **info: Any) -> dict[str, Any]:
    return {"__type": "core/ASSET", "info": {"url": url, **info}}


def test_the_api_fetches_an_asset_reference_by_url_and_refuses_one_it_cannot(tmp_path: Path) -> None:
    config = api_config(tmp_path, sections={"inputs": {"allow_private": True, "timeout_seconds": 5.0}})
    with file_server(files={"/cat.png": DATA}) as server, running_api(config) as url:
        workflow = json.loads(json.dumps(INVERT))
        workflow["1"]["inputs"]["image"] = reference(f"{server.url}/cat.png", file_path="photo.png",
                                                     hash=assets.hash_bytes(DATA))
        answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, timeout=30)
        assert answer.status_code == 201, answer.text
        job = JobModel.model_validate(answer.json())
        bad = json.loads(json.dumps(INVERT))
        bad["1"]["inputs"]["image"] = reference(f"{server.url}/cat.png", hash="sha256:" + "0" * 64)
        refused = httpx.post(f"{url}/api/v2/jobs", json={"workflow": bad}, timeout=30)
        gone = json.loads(json.dumps(INVERT))
        gone["1"]["inputs"]["image"] = reference(f"{server.url}/gone.png")
        missing = httpx.post(f"{url}/api/v2/jobs", json={"workflow": gone}, timeout=30)
        assert server.got == ["/cat.png", "/cat.png", "/gone.png"]
    for answer, why in ((refused, "not the expected"), (missing, "HTTP 404")):
        assert answer.status_code == 422, answer.text
        envelope = ErrorEnvelope.model_validate(answer.json()).error
        assert envelope.code == "missing_asset" and why in envelope.message
        assert envelope.details["missing"][0]["node_id"] == "1"
    queue = open_queue(config)
    try:
        ref = queue.reads.get(job.id).params["1.image"]
        assert assets.ref_name(ref) == "photo.png" and assets.ref_hash(ref) == assets.hash_bytes(DATA)
        assert queue.assets.read_asset(assets.hash_bytes(DATA)) == DATA
        assert len(list(queue.reads.iter_jobs())) == 1
    finally:
        queue.close()


def test_the_api_removes_the_download_of_a_client_that_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API cancels a request whose client has gone (handler_cancellation); the download in its thread goes on
    and must not leave its file in the staging folder when it ends, nor insert a job nobody was told of."""
    from comfysup.api import jobs as app_module

    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    cancelled = threading.Event()
    real = app_module.post_job

    async def watched(request: Any) -> Any:
        try:
            return await real(request)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(app_module, "post_job", watched)
    config = api_config(tmp_path, sections={"inputs": {"allow_private": True, "timeout_seconds": 5.0}})
    with file_server(held={"/slow.png": DATA}) as server, running_api(config) as url:
        workflow = json.loads(json.dumps(INVERT))
        workflow["1"]["inputs"]["image"] = reference(f"{server.url}/slow.png")
        body = json.dumps({"workflow": workflow}).encode()
        host, _, port = url.removeprefix("http://").partition(":")
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(f"POST /api/v2/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert server.asked.wait(10), "the API did not start the download"
        assert cancelled.wait(10), "the API did not cancel the request of the client that left"
        server.go.set()  # the download ends after its request was cancelled
        wait_for(lambda: not any(staging.iterdir()), 10, "the staging folder emptied")
    queue = open_queue(config)
    try:
        assert list(queue.reads.iter_jobs()) == []
    finally:
        queue.close()


def test_the_api_downloads_in_threads_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in the loop's default executor: uploads and the queue file's watch run there, and a few slow URLs
    (each may take [inputs] max_seconds) would hold all of its threads."""
    from comfysup.api.intake import Intake

    threads: list[str] = []
    real = Intake.fetch

    def fetch(self: Intake, body: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(self, body)

    monkeypatch.setattr(Intake, "fetch", fetch)
    with running_api(api_config(tmp_path)) as url:
        httpx.post(f"{url}/api/v2/jobs", json={"workflow": INVERT}, timeout=30)
    assert len(threads) == 1 and threads[0].startswith("comfysup-api-fetch"), threads


def test_the_api_stops_its_downloads_when_it_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download in flight when the API stops ends at its next bytes, not at [inputs] max_seconds: the process
    waits for its threads at exit, and a trickle of a byte now and then would hold the stop for ten minutes."""
    from comfysup.api.intake import Intake

    ended = threading.Event()
    real = Intake.fetch

    def fetch(self: Intake, body: Any) -> Any:
        try:
            return real(self, body)
        finally:
            ended.set()

    monkeypatch.setattr(Intake, "fetch", fetch)
    config = api_config(tmp_path, sections={"inputs": {"allow_private": True, "timeout_seconds": 5.0}})
    with file_server() as server:
        with running_api(config) as url:
            workflow = json.loads(json.dumps(INVERT))
            workflow["1"]["inputs"]["image"] = reference(f"{server.url}/trickle")
            poster = threading.Thread(target=lambda: httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow},
                                                                timeout=60), daemon=True)
            poster.start()
            wait_for(lambda: server.got == ["/trickle"], 10, "the download to start")
        assert ended.wait(10), "the download went on after the API stopped"
        poster.join(10)


def test_the_api_stops_fetching_once_a_jobs_inputs_pass_its_bound(tmp_path: Path) -> None:
    files = {f"/{n}.png": bytes([n]) * 3000 for n in range(3)}
    config = api_config(tmp_path, sections={"inputs": {"allow_private": True, "timeout_seconds": 5.0},
                                            "assets": {"max_file_mb": 1, "max_job_mb": 1}})
    config = records.replace(config, assets=records.replace(config.assets, max_job_mb=5000 / 2**20))
    with file_server(files=files) as server, running_api(config) as url:
        workflow = json.loads(json.dumps(INVERT))
        for n, (node, key) in enumerate((("1", "image"), ("2", "image"), ("3", "filename_prefix"))):
            workflow[node]["inputs"][key] = reference(f"{server.url}/{n}.png")
        answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, timeout=30)
        assert server.got == ["/0.png", "/1.png"]
    assert answer.status_code == 422, answer.text
    assert "are more than 5,000 bytes together ([assets] max_job_mb)" in answer.json()["error"]["message"]


def test_a_reused_key_names_its_job_after_its_url_is_gone(tmp_path: Path) -> None:
    """A client that retries a POST it got no answer to (same Idempotency-Key) is told the key's job (keys are
    single-use: 422 idempotency_key_reuse with details.job_id), even when the URL it named has expired since (a
    presigned link): not missing_asset, which would hide that its job exists."""
    config = api_config(tmp_path, sections={"inputs": {"allow_private": True, "timeout_seconds": 5.0}})
    with file_server(files={"/cat.png": DATA}) as server, running_api(config) as url:
        workflow = json.loads(json.dumps(INVERT))
        workflow["1"]["inputs"]["image"] = reference(f"{server.url}/cat.png")
        key = {"Idempotency-Key": "retry-me-1"}
        first = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, headers=key, timeout=30)
        assert first.status_code == 201, first.text
        fetched = len(server.got)
        server.files.clear()  # the link expired
        again = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, headers=key, timeout=30)
        assert len(server.got) == fetched  # the retry's key was known: nothing fetched again for a refusal
        other = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, headers={"Idempotency-Key": "new"},
                           timeout=30)
    assert again.status_code == 422, again.text
    error = again.json()["error"]
    assert error["code"] == "idempotency_key_reuse" and error["details"]["job_id"] == first.json()["id"]
    assert other.status_code == 422 and other.json()["error"]["code"] == "missing_asset"  # a new job needs it


def test_the_api_refuses_a_private_url_without_allow_private(tmp_path: Path) -> None:
    config = api_config(tmp_path)
    with file_server(files={"/cat.png": DATA}) as server, running_api(config) as url:
        workflow = json.loads(json.dumps(INVERT))
        workflow["1"]["inputs"]["image"] = reference(f"{server.url}/cat.png")
        answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow}, timeout=30)
        assert server.got == []
    assert answer.status_code == 422
    error = ErrorEnvelope.model_validate(answer.json()).error
    assert error.code == "missing_asset" and "127.0.0.1 is a loopback address" in error.message


def test_a_body_refused_on_its_face_fetches_nothing(tmp_path: Path) -> None:
    """A field no job has, a reserved one, bad metadata or priority: refused before any of its URLs is fetched
    (a download of up to [assets] max_job_mb for a request that fails anyway)."""
    config = api_config(tmp_path, sections={"inputs": {"allow_private": True, "timeout_seconds": 5.0}})
    with file_server(files={"/cat.png": DATA}) as server, running_api(config) as url:
        workflow = json.loads(json.dumps(INVERT))
        workflow["1"]["inputs"]["image"] = reference(f"{server.url}/cat.png")
        for extra, code in (({"bogus": 1}, "invalid_request"), ({"inputs": {}}, "invalid_workflow"),
                            ({"metadata": {"k": 1}}, "metadata_invalid"), ({"priority": "high"}, "invalid_request"),
                            ({"extra_data": None}, "invalid_request")):
            answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": workflow, **extra}, timeout=30)
            assert answer.json()["error"]["code"] == code, (extra, answer.text)
        assert server.got == []


@pytest.mark.timeout(60)
def test_a_job_runs_from_the_stored_copy_after_its_url_is_gone(tmp_path: Path) -> None:
    """Fetched at submit, the input is the job's own: the file server stopped, the runner still uploads it to
    ComfyUI (fake_comfy's LoadImage reads real pixels) and every output pixel is the inverse of its input."""
    from comfysup.jobs import JobsFile
    from comfysup.runner.loop import Runner
    from comfysup.runner.options import RunnerOptions
    from fake_comfy import FakeComfy
    from fake_comfy.uploads import decode_png
    from tests.input_images import expected_inverse
    from tests.runner_helpers import config_of, write_config

    config = write_config(tmp_path)
    (tmp_path / "wf.json").write_text(json.dumps(INVERT))
    with file_server(files={"/cat.png": DATA}) as server:
        (tmp_path / "jobs.jsonl").write_text(line(1, {"url": f"{server.url}/cat.png"}) + "\n")
        jobs = JobsFile(tmp_path / "jobs.jsonl", remote=InputsConfig(allow_private=True))
        queue = SQLiteQueue(tmp_path / "queue.db")
        try:
            assert jobs.validate().ok
            queue.intake.submit(jobs.jobs())
        finally:
            jobs.close()
    fake = FakeComfy(base_directory=tmp_path / "fake", node_ms=1)
    fake.start()
    try:
        Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    finally:
        fake.stop()
    job = queue.reads.get(str(uuid.UUID(int=1)))
    assert job.state == "done", job.reason
    (out,) = job.outputs
    _w, _h, _c, inverted = decode_png(Path(out.path).read_bytes())
    assert list(inverted) == [expected_inverse(v) for v in decode_png(DATA)[3]]
    queue.close()


def test_the_consumer_answers_heartbeats_while_an_input_downloads() -> None:
    """pika's BlockingConnection answers the broker's heartbeats only inside process_data_events: a download
    longer than two heartbeats would lose the connection and have its batch redelivered. The consumer's
    progress hook lets the connection run every KEEPALIVE_SECONDS of a download, no more often."""
    from comfysup.broker import consumer as module

    class Connection:
        calls = 0

        def process_data_events(self, time_limit: float) -> None:
            assert time_limit == 0
            Connection.calls += 1

    clock = [100.0]
    keep = module.KeepAlive(clock=lambda: clock[0])
    keep.start("cat.png", None)  # no connection yet: nothing to do
    keep.connection = Connection()  # type: ignore[assignment]
    keep.start("cat.png", 10_000)
    for _ in range(10):
        keep.advance(1000)  # within the same instant: one call was enough
    assert Connection.calls == 1
    clock[0] += module.KEEPALIVE_SECONDS
    keep.advance(1000)
    keep.end()
    assert Connection.calls == 2


def test_submit_to_rabbitmq_checks_url_inputs_before_it_publishes(tmp_path: Path, broker: Broker,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = broker_config(tmp_path, broker)
    (tmp_path / "workflows" / "wf.json").write_text(json.dumps(INVERT))
    names = "\n".join(f'{k} = "{v}"' for k, v in broker.names.items())
    (tmp_path / "config.toml").write_text(f'[queue]\npath = "{tmp_path / "queue.db"}"\n[inputs]\nallow_private = '
                                          f'true\n[rabbitmq]\nurl = "{config.rabbitmq.url}"\nworkflows_dir = '
                                          f'"workflows"\n{names}\n')
    with file_server(files={"/cat.png": DATA}) as server:
        (tmp_path / "bad.jsonl").write_text(line(1, {"url": f"{server.url}/cat.png"}) + "\n"
                                            + line(2, {"url": f"{server.url}/gone.png"}) + "\n")
        code, _, err = cli(capsys, "submit", "--config", str(tmp_path / "config.toml"), "--to", "rabbitmq",
                           str(tmp_path / "bad.jsonl"))
        assert code == 2 and "bad.jsonl:2: set '1.image'" in err and "HTTP 404" in err, err
        broker.declare()
        assert broker.depth(broker.names["queue"]) == 0  # nothing of a file with a bad line
        (tmp_path / "good.jsonl").write_text(line(1, {"url": f"{server.url}/cat.png"}) + "\n")
        code, out, err = cli(capsys, "submit", "--config", str(tmp_path / "config.toml"), "--to", "rabbitmq",
                             str(tmp_path / "good.jsonl"))
        assert code == 0 and "published 1 job(s)" in out, err
        assert broker.depth(broker.names["queue"]) == 1
