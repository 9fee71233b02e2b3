"""The Comfy API v2 driven by Comfy's own client, comfy-sdk, exactly as its README shows; every body
validated against the SDK's generated models (comfy_low.models, from comfy-api-proxy's spec/openapi.yaml)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from comfy_low.models import ErrorEnvelope, JobWorkflowResponse
from comfy_low.models import Job as JobModel
from comfy_sdk import Comfy
from comfy_sdk.exceptions import IdempotencyKeyReuse

from comfysup.queue import open_queue
from tests.api_support import api_config, running_api, working

ROOT = Path(__file__).resolve().parents[2]
TRIVIAL = ROOT / "examples" / "workflows" / "trivial.json"
GRAPH = json.loads(TRIVIAL.read_text())


def test_run_then_outputs_to_bytes_as_the_sdk_readme_shows(api: Any) -> None:
    url, runner, _ = api
    stop = threading.Event()
    worker = working(runner, stop)
    try:
        with Comfy() as client:
            workflow = client.workflows.from_file(TRIVIAL)
            workflow.set_input("1", "width", 32)
            job = client.run(workflow, timeout=30)
            assert job.status == "succeeded"
            [output] = job.get_outputs("3")
            assert output.to_bytes().startswith(b"\x89PNG")
            assert output.to_bytes(range=(0, 3)) == b"\x89PNG"
            assert job.get_workflow().graph["1"]["inputs"]["width"] == 32
    finally:
        stop.set()
        worker.join(5)
    body = httpx.get(f"{url}/api/v2/jobs/{job.id}").json()
    model = JobModel.model_validate(body)
    assert model.metrics is not None and model.metrics["execution_ms"] is not None
    assert model.progress is not None and model.progress.value == 1.0
    assert body["urls"]["self"] == f"{url}/api/v2/jobs/{job.id}"  # absolute, from the address the client used
    assert body["outputs"][0]["url"] == f"{url}/api/v2/assets/{body['outputs'][0]['id']}/content"
    assert str(uuid.UUID(body["outputs"][0]["id"])) == body["outputs"][0]["id"]  # outputs are assets: a UUID
    forged = httpx.get(f"{url}/api/v2/jobs/{job.id}", headers={"X-Forwarded-Host": "evil.example",
                                                              "X-Forwarded-Proto": "https",
                                                              "Forwarded": "host=evil.example;proto=https"})
    assert "evil.example" not in forged.text and forged.json()["urls"] == body["urls"]


def test_every_answer_validates_against_the_sdks_models(api: Any) -> None:
    url, runner, _ = api
    answer = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH, "metadata": {"client": "acme"},
                                                   "priority": 5, "extra_data": {"api_key_comfy_org": "sk-secret"}})
    assert answer.status_code == 201, answer.text
    job = JobModel.model_validate(answer.json())
    assert job.status.value == "queued" and job.progress is None and job.error is None
    assert "sk-secret" not in answer.text
    flow = httpx.get(f"{url}/api/v2/jobs/{job.id}/workflow")
    assert JobWorkflowResponse.model_validate(flow.json()).format.value == "api"
    assert "sk-secret" not in flow.text
    claim = runner.claim()
    runner.queue.leases.set_progress(claim, {"phase": "running", "node": 2, "nodes": 3, "cached": 0, "node_id": "2",
                                      "class_type": "KSampler", "step": 5, "steps": 20})
    running = JobModel.model_validate(httpx.get(f"{url}/api/v2/jobs/{job.id}").json())
    assert running.status.value == "running" and running.progress is not None
    assert (running.progress.nodes_done, running.progress.current_node_class, running.progress.step) == \
        (1, "KSampler", 5)
    assert 0 < running.progress.value < 1
    runner.queue.leases.dead(claim, "node 2 (KSampler): boom", kind="node_error")
    failed = JobModel.model_validate(httpx.get(f"{url}/api/v2/jobs/{job.id}").json())
    assert failed.status.value == "failed" and failed.error is not None and "boom" in failed.error.message
    missing = httpx.get(f"{url}/api/v2/jobs/{uuid.uuid4()}")
    assert missing.status_code == 404 and ErrorEnvelope.model_validate(missing.json()).error.code == "not_found"


def test_queue_position_while_a_job_waits_in_the_queue_or_in_its_servers_queue(api: Any) -> None:
    """A job's place in line, 1 next, as comfy-api-proxy counts ComfyUI's pending prompts. A job claimed
    ahead and posted behind the running prompt still waits: queued, its place on that server, no start time."""
    url, runner, _ = api
    answers = [httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH, "metadata": {"n": str(n)}}).json()
               for n in range(3)]
    assert [a["queue_position"] for a in answers] == [1, 2, 3]
    first, behind = runner.claim(), runner.claim()
    runner.queue.leases.record_prompt(first, "gpu0", 1)
    runner.queue.leases.record_prompt(behind, "gpu0", 2, waiting=True)
    bodies = {a["id"]: httpx.get(f"{url}/api/v2/jobs/{a['id']}").json() for a in answers}
    for body in bodies.values():
        JobModel.model_validate(body)
    assert (bodies[first.id]["status"], bodies[first.id]["queue_position"]) == ("running", None)
    assert (bodies[behind.id]["status"], bodies[behind.id]["queue_position"]) == ("queued", 1)
    assert bodies[behind.id]["started_at"] is None
    assert bodies[answers[2]["id"]]["queue_position"] == 2  # behind the posted one
    runner.queue.leases.complete(first, [], started=behind)  # its execution_start was read before this end
    now = httpx.get(f"{url}/api/v2/jobs/{behind.id}").json()
    assert (now["status"], now["queue_position"]) == ("running", None) and now["started_at"] is not None


def test_an_idempotency_key_is_single_use_and_a_retry_never_makes_a_second_job(api: Any) -> None:
    """The spec's reject-on-duplicate: any reuse is 422 idempotency_key_reuse (the same body too), naming the job the
    first use made, so a client whose answer was lost finds its job instead of making a second one."""
    url, _, config = api
    with Comfy() as client:
        workflow = client.workflows.from_file(TRIVIAL)
        first = client.submit(workflow, idempotency_key="order-42")
        assert first.id == str(uuid.uuid5(uuid.UUID("6f0c4d8e-3b1a-5c7e-9d2f-4a8b6c1e0f35"), "order-42"))
        again = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "order-42"})
        error = ErrorEnvelope.model_validate(again.json()).error
        assert again.status_code == 422 and error.code == "idempotency_key_reuse", again.text
        assert error.details == {"job_id": first.id} and first.id in error.message
        for body in ({"workflow": {"nodes": [], "links": []}}, {"workflow": GRAPH, "unknown": 1}, ["not a job"]):
            other = httpx.post(f"{url}/api/v2/jobs", json=body, headers={"Idempotency-Key": "order-42"})
            assert other.json()["error"]["code"] == "idempotency_key_reuse", other.text  # whatever its body
        workflow.set_input("1", "width", 8)
        with pytest.raises(IdempotencyKeyReuse):
            client.submit(workflow, idempotency_key="order-42")
    key = str(uuid.uuid4())
    assert httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": key}).json()["id"] \
        == key
    # A refused request claims nothing: the key is still free for the corrected one.
    dangling = {"1": {"class_type": "SaveImage", "inputs": {"images": ["9", 0]}}}
    refused = httpx.post(f"{url}/api/v2/jobs", json={"workflow": dangling}, headers={"Idempotency-Key": "fixed-later"})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_workflow"
    assert httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "fixed-later"}
                      ).status_code == 201
    queue = open_queue(config)
    try:
        assert queue.reads.status().counts["queued"] == 3
    finally:
        queue.close()


@pytest.mark.timeout(60)
def test_of_concurrent_requests_with_one_key_exactly_one_wins(tmp_path: Path) -> None:
    """Two API processes on one queue (two apps, two connections) given one key at the same moment, many rounds:
    one 201 and one 422 each time, and one job: the queue's transaction decides, not a lock in one process."""
    config = api_config(tmp_path)
    with running_api(config) as one, running_api(config) as two:
        barrier = threading.Barrier(2)
        for n in range(8):
            answers: list[int] = []

            def post(url: str, key: str = f"race-{n}", answers: list[int] = answers) -> None:
                with httpx.Client() as client:
                    barrier.wait(10)
                    answers.append(client.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH},
                                               headers={"Idempotency-Key": key}).status_code)

            threads = [threading.Thread(target=post, args=(url,)) for url in (one, two)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(20)
            assert sorted(answers) == [201, 422], (n, answers)
        queue = open_queue(config)
        try:
            assert queue.reads.status().counts["queued"] == 8
        finally:
            queue.close()


@pytest.mark.parametrize(("body", "code"), [
    ({"workflow": {"nodes": [], "links": []}}, "workflow_format_ui"),
    ({"workflow": {"1": {"class_type": "SaveImage", "inputs": {"images": ["9", 0]}}}}, "invalid_workflow"),
    ({"workflow": GRAPH, "metadata": {"n": 1}}, "metadata_invalid"),
    ({"workflow": GRAPH, "webhook_url": "http://x"}, "invalid_workflow"),
    ({"workflow": GRAPH, "inputs": {}}, "invalid_workflow"),
    ({"workflow": GRAPH, "colour": 1}, "invalid_request"),
    ({"workflow": GRAPH, "priority": "high"}, "invalid_request"),
    ({"workflow": GRAPH, "extra_data": {"api_key_comfy_org": "k", "other": 1}}, "invalid_request"),
    ({"workflow": GRAPH, "extra_data": {"api_key_comfy_org": 5}}, "invalid_request"),
    ({"workflow": GRAPH, "extra_data": 5}, "invalid_request"),
    ({"workflow": GRAPH, "extra_data": None}, "invalid_request"),
    ([GRAPH], "invalid_request"),
])
def test_refusals_carry_the_contracts_envelope(api: Any, body: Any, code: str) -> None:
    """Each code with the spec's status (invalid_request 400, the others 422), in one body shape."""
    url, _, _ = api
    answer = httpx.post(f"{url}/api/v2/jobs", json=body)
    assert answer.status_code == (400 if code == "invalid_request" else 422), answer.text
    assert ErrorEnvelope.model_validate(answer.json()).error.code == code
    assert set(answer.json()["error"]) == {"code", "message", "details"}


def test_cancel_and_list_with_metadata_and_cursor(api: Any) -> None:
    url, _, _ = api
    with Comfy() as client:
        workflow = client.workflows.from_file(TRIVIAL)
        ids = [client.submit(workflow, metadata={"batch": "a" if i % 2 else "b"}).id for i in range(7)]
        job = client.jobs.get(ids[0])
        listed = [j.id for j in client.list_jobs(metadata={"batch": "a"})]
        assert listed == [i for n, i in reversed(list(enumerate(ids))) if n % 2]
        job.cancel()
        assert job.status == "canceled"
    pages, cursor, seen = 0, None, []
    while True:
        body = httpx.get(f"{url}/api/v2/jobs", params={"limit": 3, **({"cursor": cursor} if cursor else {})}).json()
        seen += [item["id"] for item in body["jobs"]]
        pages += 1
        cursor = body.get("next_cursor")
        if not cursor:
            break
    assert seen == list(reversed(ids)) and pages == 3
    cancelled = httpx.post(f"{url}/api/v2/jobs/{ids[1]}/cancel")
    assert JobModel.model_validate(cancelled.json()).status.value == "canceled"
    assert httpx.post(f"{url}/api/v2/jobs/{ids[1]}/cancel").json()["status"] == "canceled"


def test_queue_full_answers_429_with_retry_after(tmp_path: Path) -> None:
    config = api_config(tmp_path, max_queued=1)
    with running_api(config) as url:
        assert httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "a"}
                          ).status_code == 201
        full = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "b"})
        assert full.status_code == 429 and int(full.headers["Retry-After"]) > 0
        assert ErrorEnvelope.model_validate(full.json()).error.code == "queue_full"
        # A used key is said used even while the queue is full; a key refused 429 was not claimed.
        assert httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "a"}
                          ).json()["error"]["code"] == "idempotency_key_reuse"
        queue = open_queue(config)
        try:
            queue.intake.cancel([str(uuid.uuid5(uuid.UUID("6f0c4d8e-3b1a-5c7e-9d2f-4a8b6c1e0f35"), "a"))])
        finally:
            queue.close()
        assert httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers={"Idempotency-Key": "b"}
                          ).status_code == 201


def test_token_origin_and_health(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = api_config(tmp_path, token="s3cret-token", allowed_origins=["https://app.example"])
    with running_api(config) as url:
        assert httpx.get(f"{url}/api/v2/jobs").status_code == 401
        wrong = httpx.get(f"{url}/api/v2/jobs", headers={"Authorization": "Bearer nope"})
        assert ErrorEnvelope.model_validate(wrong.json()).error.code == "unauthorized"
        # health asks no token (a probe holds none) and says no more than that the API and its queue answer.
        assert httpx.get(f"{url}/api/v2/health").json() == {"status": "healthy", "queue": "ok"}
        auth = {"Authorization": "Bearer s3cret-token"}
        assert httpx.get(f"{url}/api/v2/health", headers=auth).json() == {"status": "healthy", "queue": "ok",
                                                                          "active_jobs": 0}
        evil = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH},
                          headers={**auth, "Origin": "https://evil.example"})
        assert evil.status_code == 403 and evil.json()["error"]["code"] == "forbidden"
        assert httpx.get(f"{url}/api/v2/health", headers={**auth, "Origin": "https://app.example"}).status_code == 200
        assert httpx.get(f"{url}/api/v2/health", headers={**auth, "Origin": url}).status_code == 200
        assert httpx.get(f"{url}/api/v2/health", headers={"Origin": "https://evil.example"}).status_code == 403
    assert "s3cret-token" not in caplog.text


def test_ready_asks_no_token_and_tells_why_only_with_it(tmp_path: Path) -> None:
    """/ready is for load balancers, which send no bearer (an ALB's health check sends no header at all): its
    status asks no token, as health's; why (and the counts) only with it. An allowed page reads it; another
    site's is refused."""
    config = api_config(tmp_path, token="s3cret-token", allowed_origins=["https://app.example"])
    auth = {"Authorization": "Bearer s3cret-token"}
    with running_api(config) as url:
        for path in ("/ready", "/api/v2/ready"):
            bare = httpx.get(f"{url}{path}")
            assert (bare.status_code, bare.json()) == (503, {"status": "not_ready"}), bare.text
            told = httpx.get(f"{url}{path}", headers=auth)
            assert told.status_code == 503 and told.json()["ready_slots"] == 0 and told.json()["reason"], told.text
            page = httpx.get(f"{url}{path}", headers={"Origin": "https://app.example", "Sec-Fetch-Site": "cross-site"})
            assert page.status_code == 503 and page.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert httpx.get(f"{url}{path}", headers={"Origin": "https://evil.example"}).status_code == 403


def test_a_browser_page_of_an_allowed_origin_preflights_without_the_token(tmp_path: Path) -> None:
    """CORS: the preflight is 204 without the bearer (a browser never sends it there), with exactly the origin, the
    route's methods and the SDK's headers; the real request still needs the token, and every answer to that
    origin, errors included, carries the headers its script needs to read it. Other origins get no CORS header."""
    config = api_config(tmp_path, token="t0k", allowed_origins=["https://app.example"])
    app = {"Origin": "https://app.example", "Sec-Fetch-Site": "cross-site"}
    preflight = {**app, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type,idempotency-key"}
    with running_api(config) as url:
        answer = httpx.options(f"{url}/api/v2/jobs", headers=preflight)
        assert answer.status_code == 204, answer.text
        assert answer.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert {m.strip() for m in answer.headers["Access-Control-Allow-Methods"].split(",")} == \
            {"GET", "HEAD", "POST", "OPTIONS"}
        assert {"authorization", "content-type", "idempotency-key"} <= \
            {h.strip().lower() for h in answer.headers["Access-Control-Allow-Headers"].split(",")}
        assert "Origin" in answer.headers["Vary"]
        assert httpx.options(f"{url}/api/v2/jobs/{uuid.uuid4()}/cancel", headers=preflight).status_code == 204
        unauthorized = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers=app)
        assert unauthorized.status_code == 401
        assert unauthorized.headers["Access-Control-Allow-Origin"] == "https://app.example"
        made = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH},
                          headers={**app, "Authorization": "Bearer t0k", "Idempotency-Key": "browser-1"})
        assert made.status_code == 201 and made.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "idempotency-key" in made.headers["Access-Control-Allow-Headers"].lower()
        assert "Location" in made.headers["Access-Control-Expose-Headers"]
        evil = httpx.options(f"{url}/api/v2/jobs", headers={**preflight, "Origin": "https://evil.example"})
        assert evil.status_code == 403 and evil.json()["error"]["code"] == "forbidden"
        assert "Access-Control-Allow-Origin" not in evil.headers
        assert httpx.options(f"{url}/api/v2/nowhere", headers=preflight).status_code == 404
        plain = httpx.options(f"{url}/api/v2/assets/{uuid.uuid4()}")  # no Origin: not a preflight, just Allow
        assert plain.status_code == 204 and set(plain.headers["Allow"].split(", ")) == {"DELETE", "GET", "HEAD",
                                                                                        "OPTIONS"}


def test_a_non_loopback_listen_without_a_token_is_refused_at_start(tmp_path: Path) -> None:
    from comfysup.errors import ConfigError

    with pytest.raises(ConfigError, match="token"):
        api_config(tmp_path, listen="0.0.0.0:9189")
    assert api_config(tmp_path, listen="0.0.0.0:0", token="t").api.token == "t"


@pytest.mark.timeout(60)
def test_the_api_of_a_supervisor_never_makes_a_deleted_queue_again(tmp_path: Path) -> None:
    """``comfysup run`` starts its API with --existing-queue: an API that starts after the queue file was deleted
    (its interpreter takes a second to start) must fail, not make an empty queue that the supervisor would take
    for a replaced one. Alone, ``comfysup api`` makes the queue as every front door does."""
    from tests.runner_helpers import comfysup

    config = api_config(tmp_path)
    db = Path(config.resolve(config.queue.path))
    out = comfysup("api", "--config", config.source, "--existing-queue", timeout=30)
    assert out.returncode == 1 and "no queue database here" in out.stderr, out.stderr
    assert not db.exists()
    with running_api(config):
        assert db.exists()
