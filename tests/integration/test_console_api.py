"""The console's HTTP side without a browser: read-only without a token, the API's own routes unchanged beside it,
the page's relative base (a proxy's path prefix), and the audit line of an action."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
import requests

from comfysup import records
from tests.api_support import StandInRunner, api_config, running_api
from tests.queue_contract import make_job


def test_without_a_token_the_console_shows_everything_and_changes_nothing(tmp_path: Path) -> None:
    config = api_config(tmp_path)
    with running_api(config) as url:
        runner = StandInRunner(config)
        try:
            job = make_job(1, meta={"team": "a"})
            runner.queue.intake.submit([job])
            session = requests.get(f"{url}/console/api/session", timeout=10).json()
            assert session["read_only"] and session["may_read"] and not session["logged_in"]
            found = requests.get(f"{url}/console/api/jobs", params={"q": "team=a"}, timeout=10).json()
            assert [r["id"] for r in found["rows"]] == [job.id]
            refused = requests.post(f"{url}/console/api/actions/cancel", json={"ids": [job.id]},
                                    headers={"Origin": url}, timeout=10)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only"
            assert requests.post(f"{url}/console/api/login", json={"token": "x"}, headers={"Origin": url},
                                 timeout=10).status_code == 403
            assert runner.queue.reads.states([job.id])[job.id] == "queued"
        finally:
            runner.close()


def test_with_a_token_the_api_still_asks_it_and_the_console_its_login(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    config = api_config(tmp_path, token="t0ken")
    with running_api(config) as url:
        runner = StandInRunner(config)
        try:
            job = make_job(2)
            runner.queue.intake.submit([job])
            assert requests.get(f"{url}/api/v2/jobs", timeout=10).status_code == 401
            assert requests.get(f"{url}/console/api/jobs/{job.id}", timeout=10).status_code == 401
            assert requests.get(f"{url}/console/api/events", timeout=10).status_code == 401
            page = requests.get(f"{url}/console/jobs/{job.id}", timeout=10)
            assert page.status_code == 200 and '<base href="../">' in page.text
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]
            web = requests.Session()
            assert web.post(f"{url}/console/api/login", json={"token": "wrong"}, headers={"Origin": url},
                            timeout=10).status_code == 401
            csrf = web.post(f"{url}/console/api/login", json={"token": "t0ken", "name": "bo"},
                            headers={"Origin": url}, timeout=10).json()["csrf"]
            assert web.get(f"{url}/console/api/jobs/{job.id}", timeout=10).json()["state"] == "queued"
            with caplog.at_level(logging.INFO, logger="comfysup.api.console"):
                done = web.post(f"{url}/console/api/actions/cancel", json={"ids": [job.id]},
                                headers={"Origin": url, "X-CSRF-Token": csrf}, timeout=10)
            assert done.status_code == 200 and done.json()["result"] == {job.id: "cancelled"}
            assert any("bo@127.0.0.1 cancelled 1 job(s)" in r.getMessage() and job.id in r.getMessage()
                       for r in caplog.records)
        finally:
            runner.close()


def test_a_tenants_token_opens_no_console_and_the_admins_sees_every_tenants_jobs(tmp_path: Path) -> None:
    """The console is the admin's (its login is ``[api] token``): a tenant's token neither logs in nor reads it,
    and the console's lists and pages name each job's tenant, and find one tenant's jobs."""
    tenant_token = "token-of-studio-a"
    tenants = {"a": {"token_sha256": hashlib.sha256(tenant_token.encode()).hexdigest()}}
    config = api_config(tmp_path, sections={"tenants": tenants}, token="t0ken")
    with running_api(config) as url:
        runner = StandInRunner(config)
        try:
            theirs, ours = records.replace(make_job(3), tenant="a"), make_job(4)
            runner.queue.intake.submit([theirs, ours])
            bearer = {"Authorization": f"Bearer {tenant_token}"}
            assert requests.get(f"{url}/console/api/jobs", headers=bearer, timeout=10).status_code == 401
            assert requests.post(f"{url}/console/api/login", json={"token": tenant_token},
                                 headers={"Origin": url}, timeout=10).status_code == 401
            assert [j["id"] for j in requests.get(f"{url}/api/v2/jobs", headers=bearer, timeout=10).json()["jobs"]] \
                == [theirs.id]
            web = requests.Session()
            assert web.post(f"{url}/console/api/login", json={"token": "t0ken"}, headers={"Origin": url},
                            timeout=10).status_code == 200
            rows = web.get(f"{url}/console/api/jobs", timeout=10).json()["rows"]
            assert {r["id"]: r["tenant"] for r in rows} == {theirs.id: "a", ours.id: "default"}
            assert web.get(f"{url}/console/api/jobs/{theirs.id}", timeout=10).json()["tenant"] == "a"
            for asked in ({"q": "tenant:a"}, {"tenant": "a"}):  # the search box's word or the URL's parameter
                found = web.get(f"{url}/console/api/jobs", params=asked, timeout=10).json()
                assert [(r["id"], r["tenant"]) for r in found["rows"]] == [(theirs.id, "a")] and found["after"] is None
            assert web.get(f"{url}/console/api/jobs", params={"tenant": "b"}, timeout=10).json()["rows"] == []
        finally:
            runner.close()
