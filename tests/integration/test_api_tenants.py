"""Tokens that see their own, through comfy-sdk: a tenant's token submits as that tenant and lists, reads,
cancels and streams only that tenant's jobs and outputs; another tenant's id answers 404 (never 403), its
Idempotency-Key never meets another's; the admin token sees every job; max_queued is 429 with Retry-After."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from comfy_sdk import Comfy, NotFound
from comfy_sdk.retry import NO_RETRY

from tests.api_support import StandInRunner, api_config, running_api

ROOT = Path(__file__).resolve().parents[2]
TRIVIAL = ROOT / "examples" / "workflows" / "trivial.json"
ADMIN, TOKEN_A, TOKEN_B = "admin-token-of-the-fleet", "token-of-studio-a", "token-of-studio-b"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, StandInRunner]]:
    tenants = {"a": {"token_sha256": digest(TOKEN_A)}, "b": {"token_sha256": digest(TOKEN_B), "max_queued": 2}}
    config = api_config(tmp_path, sections={"tenants": tenants}, token=ADMIN)
    with running_api(config) as url:
        monkeypatch.setenv("COMFY_BASE_URL", url)
        monkeypatch.delenv("COMFY_API_KEY", raising=False)
        runner = StandInRunner(config)
        try:
            yield url, runner
        finally:
            runner.close()


def test_a_tenants_token_sees_only_its_own_jobs_and_outputs(fleet: tuple[str, StandInRunner]) -> None:
    url, runner = fleet
    with Comfy(api_key=TOKEN_A, retry=NO_RETRY) as a, Comfy(api_key=TOKEN_B, retry=NO_RETRY) as b, \
            Comfy(api_key=ADMIN, retry=NO_RETRY) as admin:
        done = a.submit(a.workflows.from_file(TRIVIAL), idempotency_key="order-1")
        assert runner.run_one() is not None
        queued = a.submit(a.workflows.from_file(TRIVIAL))
        mine = b.submit(b.workflows.from_file(TRIVIAL), idempotency_key="order-1")  # the same key: its own job
        assert mine.id != done.id
        output = a.jobs.get(done.id).outputs[0]
        for other in (done.id, queued.id):
            with pytest.raises(NotFound):
                b.jobs.get(other)
        with pytest.raises(NotFound):
            b.assets.get(output.id)
        assert {j.id for j in b.list_jobs()} == {mine.id}
        assert {j.id for j in a.list_jobs()} == {done.id, queued.id}
        assert {j.id for j in admin.list_jobs()} == {done.id, queued.id, mine.id}
        assert a.assets.get(output.id).id == output.id
        headers = {"Authorization": f"Bearer {TOKEN_B}"}
        for path in (f"/api/v2/jobs/{queued.id}/events", f"/api/v2/assets/{output.id}/content",
                     f"/api/v2/jobs/{done.id}/workflow"):
            assert httpx.get(url + path, headers=headers).status_code == 404, path
        assert httpx.post(f"{url}/api/v2/jobs/{queued.id}/cancel", headers=headers).status_code == 404
        assert a.jobs.get(queued.id).status == "queued"  # b's cancel did nothing
        assert httpx.get(f"{url}/api/v2/jobs", headers={"Authorization": "Bearer nobody"}).status_code == 401
        upload = a.assets.from_bytes(b"\x89PNG a's own bytes", filename="a.png")
        upload.commit()
        with pytest.raises(NotFound):
            b.assets.get(upload.id)
        assert httpx.delete(f"{url}/api/v2/assets/{upload.id}", headers=headers).status_code == 404
        assert httpx.delete(f"{url}/api/v2/assets/{output.id}", headers=headers).status_code == 404
        assert a.assets.get(upload.id).id == upload.id and admin.assets.get(upload.id).id == upload.id
    assert runner.queue.reads.get(mine.id).tenant == "b" and runner.queue.reads.get(done.id).tenant == "a"


def test_max_queued_is_429_with_retry_after(fleet: tuple[str, StandInRunner]) -> None:
    url, _runner = fleet
    with Comfy(api_key=TOKEN_B, retry=NO_RETRY) as b:
        for _ in range(2):
            b.submit(b.workflows.from_file(TRIVIAL))
    answer = httpx.post(f"{url}/api/v2/jobs", headers={"Authorization": f"Bearer {TOKEN_B}"},
                        json={"workflow": {"1": {"class_type": "EmptyImage", "inputs": {}},
                                           "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}}})
    assert answer.status_code == 429 and answer.headers["Retry-After"].isdigit(), answer.text
    assert answer.json()["error"]["code"] == "queue_full", answer.text
