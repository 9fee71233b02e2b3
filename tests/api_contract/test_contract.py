"""Every operation, status and error code the spec lists, asked of comfysup's API; every JSON answer checked against
the spec's schema for that status. The cases are the spec's (tests/api_contract/spec.py reads them): a status or
code added to openapi.yaml is a failing case here until comfysup answers it or docs/api.md's difference table says
why it never will."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import blake3
import httpx
import pytest

from tests.api_contract import spec
from tests.api_contract.conftest import APP_ORIGIN, ROOT, Contract

pytestmark = pytest.mark.timeout(120)
EVIL_ORIGIN = "https://evil.example"
DIFFERENCES = ROOT / "docs" / "api.md"
NEVER = {"postAssets-202": "uploads are hashed while they arrive, so an asset is ready when it is answered",
         "postJobs-402-insufficient_credits": "no credits: your own GPUs (the spec: Cloud / serverless only)"}
"""Answers of the spec comfysup never gives, by design; each is a row of docs/api.md's difference table."""


def _hash(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


def _stored(ctx: Contract) -> tuple[bytes, str]:
    data = os.urandom(48)
    assert ctx.upload(data).status_code == 201
    return data, _hash(data)


def _twice(send: Callable[[], httpx.Response]) -> httpx.Response:
    first = send()
    assert first.status_code in (200, 201), first.text
    return send()


Case = Callable[[Contract], httpx.Response]

HAPPY: dict[str, Case] = {
    "postAssets": lambda c: c.upload(),
    "assetFromHash": lambda c: c.send("POST", "/api/v2/assets/from-hash",
                                      json={"hash": _stored(c)[1], "file_path": f"{uuid.uuid4().hex}.png"}),
    "headAssetByHash": lambda c: c.send("HEAD", f"/api/v2/assets/by-hash/{_stored(c)[1]}"),
    "getAsset": lambda c: c.send("GET", f"/api/v2/assets/{c.asset()['id']}"),
    "getAssetContent": lambda c: c.send("GET", f"/api/v2/assets/{c.asset()['id']}/content"),
    "postJobs": lambda c: c.send("POST", "/api/v2/jobs", json={"workflow": c.graph()}),
    "getJob": lambda c: c.send("GET", f"/api/v2/jobs/{c.finished}"),
    "getJobEvents": lambda c: c.send("GET", f"/api/v2/jobs/{c.finished}/events"),
    "cancelJob": lambda c: c.send("POST", f"/api/v2/jobs/{c.job()}/cancel"),
}
"""The request each operation answers with its success status (the first the spec lists)."""

CASES: dict[str, Case] = {
    "postAssets-200": lambda c: _same_upload_twice(c),
    "postAssets-409-hash_mismatch": lambda c: c.upload(expected_hash=_hash(b"other bytes")),
    "postAssets-422-idempotency_key_reuse": lambda c: _upload_key_twice(c),
    "assetFromHash-200": lambda c: _mint_twice(c),
    "assetFromHash-404-blob_not_found": lambda c: c.send("POST", "/api/v2/assets/from-hash",
                                                         json={"hash": _hash(os.urandom(16))}),
    "headAssetByHash-404": lambda c: c.send("HEAD", f"/api/v2/assets/by-hash/{_hash(os.urandom(16))}"),
    "getAsset-404-not_found": lambda c: c.send("GET", f"/api/v2/assets/{uuid.uuid4()}"),
    "getAssetContent-206": lambda c: c.send("GET", f"/api/v2/assets/{c.asset()['id']}/content",
                                            headers={"Range": "bytes=0-9"}),
    "getAssetContent-302": lambda c: _redirected(c, c.send("GET", f"/api/v2/assets/{c.in_bucket()}/content")),
    "getAssetContent-404-not_found": lambda c: c.send("GET", f"/api/v2/assets/{uuid.uuid4()}/content"),
    "getAssetContent-416": lambda c: c.send("GET", f"/api/v2/assets/{c.asset()['id']}/content",
                                            headers={"Range": "bytes=1000-2000"}),
    "postJobs-422-invalid_workflow": lambda c: c.send("POST", "/api/v2/jobs", json={"workflow": {
        "1": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "x"}}}}),
    "postJobs-422-workflow_format_ui": lambda c: c.send("POST", "/api/v2/jobs",
                                                        json={"workflow": {"nodes": [], "links": []}}),
    "postJobs-422-missing_asset": lambda c: c.send("POST", "/api/v2/jobs", json={"workflow": {
        **c.graph(), "4": {"class_type": "LoadImage", "inputs": {
            "image": {"__type": "core/ASSET", "info": {"id": str(uuid.uuid4())}}}}}}),
    "postJobs-422-idempotency_key_reuse": lambda c: _job_key_twice(c),
    "postJobs-429-queue_full": lambda c: _queue_full(c),
    "getJob-404-not_found": lambda c: c.send("GET", f"/api/v2/jobs/{uuid.uuid4()}"),
    "getJobEvents-404-not_found": lambda c: c.send("GET", f"/api/v2/jobs/{uuid.uuid4()}/events"),
    "cancelJob-404-not_found": lambda c: c.send("POST", f"/api/v2/jobs/{uuid.uuid4()}/cancel"),
}
"""Every other answer the spec lists; 401 and 403 are each operation's happy request without the token or from a
page of another site."""


def _same_upload_twice(ctx: Contract) -> httpx.Response:
    data = os.urandom(32)
    return _twice(lambda: ctx.upload(data))


def _upload_key_twice(ctx: Contract) -> httpx.Response:
    key = uuid.uuid4().hex
    return _twice(lambda: ctx.upload(key=key))


def _mint_twice(ctx: Contract) -> httpx.Response:
    digest = _stored(ctx)[1]
    return _twice(lambda: ctx.send("POST", "/api/v2/assets/from-hash", json={"hash": digest, "file_path": "a.png"}))


def _job_key_twice(ctx: Contract) -> httpx.Response:
    key = uuid.uuid4().hex
    return _twice(lambda: ctx.send("POST", "/api/v2/jobs", json={"workflow": ctx.graph()},
                                   headers={"Idempotency-Key": key}))


def _redirected(ctx: Contract, answer: httpx.Response) -> httpx.Response:
    """An output in a bucket: the spec's redirect to a fresh signed URL of its object, not followed here."""
    location = answer.headers.get("Location", "")
    assert location.startswith("http://127.0.0.1:9/outputs/run/") and "X-Amz-Signature=" in location, answer.text
    return answer


def _queue_full(ctx: Contract) -> httpx.Response:
    ctx.job()  # the queue holds a job not yet ended
    with ctx.bounded() as url:
        return httpx.post(f"{url}/api/v2/jobs", json={"workflow": ctx.graph()},
                          headers={"Authorization": f"Bearer {ctx.config.api.token}"})


def _ask(ctx: Contract, answer: spec.Answer) -> httpx.Response:
    """The case of ``answer``: 401 and 403 are the operation's happy request sent again without the token, or from
    a page of another site; every other answer has its own case, or is the operation's happy one."""
    if answer.status in (401, 403):
        request = _happy_request(ctx, answer.operation)
        if answer.status == 401:
            del request.headers["Authorization"]
        else:
            request.headers.update({"Origin": EVIL_ORIGIN, "Sec-Fetch-Site": "cross-site"})
        return ctx.client.send(request)
    case = CASES.get(answer.id)
    if case is not None:
        return case(ctx)
    assert answer.operation in HAPPY, f"no case for {answer.id}: add one to tests/api_contract/test_contract.py"
    return HAPPY[answer.operation](ctx)


def _happy_request(ctx: Contract, operation: str) -> httpx.Request:
    """The last request the operation's happy case sent (answered with success), to be sent again changed."""
    sent: list[httpx.Request] = []
    ctx.client.event_hooks["request"] = [sent.append]
    try:
        assert HAPPY[operation](ctx).status_code < 300
    finally:
        ctx.client.event_hooks["request"] = []
    return sent[-1]


ANSWERS = [a for a in spec.answers() if a.id not in NEVER]


@pytest.mark.parametrize("answer", ANSWERS, ids=[a.id for a in ANSWERS])
def test_every_answer_the_spec_lists(contract: Contract, answer: spec.Answer) -> None:
    got = _ask(contract, answer)
    assert got.status_code == answer.status, f"{answer.id}: {got.status_code} {got.text[:500]}"
    if answer.method == "HEAD":
        assert not got.content
        return
    if answer.code is not None:
        assert got.json()["error"]["code"] == answer.code, got.text
    if answer.code == "invalid_workflow":  # "`invalid_workflow` (with per-node details)", as ErrorEnvelope's example
        [error] = got.json()["error"]["details"]["node_errors"]["1"]
        assert (error["field"], error["class_type"]) == ("images", "SaveImage"), got.text
    if answer.schema is not None:
        assert spec.problems(got.json(), answer.schema) == [], got.text
    if answer.operation == "getJobEvents" and answer.status == 200:
        assert got.headers["Content-Type"].startswith("text/event-stream")
        assert re.search(r"event: status\ndata: .*\"succeeded\"", got.text), got.text


def test_the_spec_is_read_whole() -> None:
    """Every operation of the spec has a happy case, and the cases name only answers the spec has."""
    ids = {a.id for a in spec.answers()}
    assert {op for op, *_ in spec.operations()} == set(HAPPY)
    assert set(CASES) <= ids and set(NEVER) <= ids, sorted(set(CASES) - ids)
    assert len(ids) >= 40


@pytest.mark.parametrize("answer", sorted(NEVER))
def test_an_answer_comfysup_never_gives_is_in_the_difference_table(answer: str) -> None:
    operation, status = answer.split("-")[:2]
    table = DIFFERENCES.read_text()
    assert re.search(rf"`{operation}` {status}\b", table), f"docs/api.md does not say why comfysup never answers " \
        f"{answer} ({NEVER[answer]})"


@pytest.mark.parametrize(("code", "status"), sorted(spec.envelope_codes().items()))
def test_each_error_code_comes_with_the_spec_s_status(contract: Contract, code: str, status: int) -> None:
    """ErrorEnvelope's list of core codes: each is answered with its status, wherever it comes from."""
    answer = next((a for a in ANSWERS if a.code == code), None)
    if answer is None and code == "invalid_request":
        got = contract.send("POST", "/api/v2/jobs", json=["not", "an", "object"])
    elif answer is None:
        assert any(a.code == code for a in spec.answers()), code
        assert re.search(rf"`{code}`", DIFFERENCES.read_text()), f"docs/api.md does not say why {code} is never sent"
        return
    else:
        got = _ask(contract, answer)
    assert (got.status_code, got.json()["error"]["code"]) == (status, code), got.text
    assert set(got.json()["error"]) == {"code", "message", "details"}


def test_reserved_fields_are_refused(contract: Contract) -> None:
    """postJobs: "Reserved for post-MVP and rejected if present today" — each is 422 invalid_workflow."""
    fields = spec.reserved_job_fields()
    assert fields
    for name in fields:
        got = contract.send("POST", "/api/v2/jobs", json={"workflow": contract.graph(), name: {}})
        assert (got.status_code, got.json()["error"]["code"]) == (422, "invalid_workflow"), (name, got.text)


def test_closed_objects_of_a_job_refuse_what_they_do_not_draw(contract: Contract) -> None:
    """Every property of postJobs' body with ``additionalProperties: false`` (``extra_data``): an unknown key, a
    value of another type for each key it draws, and null (not nullable) are 400 invalid_request; what it draws
    is accepted."""
    body = spec.request_schema("postJobs")
    closed = {name: s for name, s in body["properties"].items() if spec.resolve(s).get("additionalProperties") is False}
    assert closed
    for name, schema in closed.items():
        bad: list[object] = [{"not_in_the_spec": "x"}, None, 5, "text", []]
        bad += [{key: 5} for key, drawn in schema["properties"].items() if drawn.get("type") == "string"]
        for value in bad:
            got = contract.send("POST", "/api/v2/jobs", json={"workflow": contract.graph(), name: value})
            assert (got.status_code, got.json()["error"]["code"]) == (400, "invalid_request"), (name, value, got.text)
        good = {key: "sk-x" for key, drawn in schema["properties"].items() if drawn.get("type") == "string"}
        got = contract.send("POST", "/api/v2/jobs", json={"workflow": contract.graph(), name: good})
        assert got.status_code == 201 and "sk-x" not in got.text, got.text


@pytest.mark.parametrize("operation", ["postJobs", "assetFromHash"])
def test_a_body_without_a_required_field_is_refused(contract: Contract, operation: str) -> None:
    path = {o: p for o, _m, p, _op in spec.operations()}[operation]
    for name in spec.request_schema(operation)["required"]:
        got = contract.send("POST", path, json={"file_path": "x.png"} if name != "file_path" else {})
        assert got.status_code in (400, 422), (name, got.text)
        code = got.json()["error"]["code"]
        assert spec.envelope_codes()[code] == got.status_code, got.text


def test_an_upload_without_a_required_part_is_refused(contract: Contract) -> None:
    """postAssets' multipart body: each required part left out is 400 invalid_request (the spec does not say 400
    or 422; comfysup follows comfy-sdk, which raises it as a request error)."""
    required = spec.request_schema("postAssets")["required"]
    assert set(required) == {"file", "content_type", "file_path"}
    for name in required:
        fields = {"content_type": "image/png", "file_path": "photo.png"}
        fields.pop(name, None)
        files = {} if name == "file" else {"file": ("photo.png", os.urandom(16), "image/png")}
        got = contract.send("POST", "/api/v2/assets", files=files or {"other": ("x", b"", "text/plain")},
                            data=fields)
        assert (got.status_code, got.json()["error"]["code"]) == (400, "invalid_request"), (name, got.text)


def test_a_preflight_from_an_allowed_origin_needs_no_token(contract: Contract) -> None:
    """Every path of the spec answers a browser preflight from an allowed origin with 204 and its CORS headers,
    and one from another origin with 403 and none."""
    for _op, method, path, _ in spec.operations():
        concrete = path.replace("{id}", str(uuid.uuid4())).replace("{hash}", _hash(b"x"))
        asked = {"Origin": APP_ORIGIN, "Access-Control-Request-Method": method}
        got = contract.send("OPTIONS", concrete, auth=False, headers=asked)
        assert got.status_code == 204 and got.headers["Access-Control-Allow-Origin"] == APP_ORIGIN, (path, got.text)
        assert method in got.headers["Access-Control-Allow-Methods"], (path, got.headers)
        evil = contract.send("OPTIONS", concrete, auth=False, headers={**asked, "Origin": EVIL_ORIGIN})
        assert evil.status_code == 403 and "Access-Control-Allow-Origin" not in evil.headers, path


def test_spec_file_is_the_published_one() -> None:
    """The copy is Comfy's file unchanged: its own header and the version its pin names."""
    text = spec.SPEC_PATH.read_text()
    pin = Path(spec.SPEC_PATH).with_name("openapi.VERSION").read_text()
    assert text.startswith("# ====") and "Comfy API v2" in text
    assert f"spec_info_version={spec.spec()['info']['version']}" in pin
