"""Every link the API answers is absolute and starts with the API's own address: ``[api] public_url``
when the request came by its name (a TLS proxy in front), else the Host the request came with (one of the API's
own names, or it is refused 421), never anything a client puts in ``X-Forwarded-*`` or ``Forwarded``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.api_support import StandInRunner, api_config, running_api

GRAPH = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
         "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}

FORWARDED = {"X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https", "X-Forwarded-Port": "1",
             "Forwarded": "for=1.2.3.4;host=evil.example;proto=https"}


@pytest.mark.timeout(30)
def test_links_come_from_public_url_or_the_host_used_and_never_from_forwarding_headers(tmp_path: Path) -> None:
    config = api_config(tmp_path, public_url="https://gpus.example")
    with running_api(config) as url:
        runner = StandInRunner(config)
        try:
            posted = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, headers=FORWARDED)
            assert posted.status_code == 201, posted.text
            job = posted.json()["id"]
            assert posted.headers["Location"] == f"{url}/api/v2/jobs/{job}"
            runner.run_one()
            direct = httpx.get(f"{url}/api/v2/jobs/{job}", headers=FORWARDED).json()
            proxied = httpx.get(f"{url}/api/v2/jobs/{job}", headers={**FORWARDED, "Host": "gpus.example"}).json()
            listed = httpx.get(f"{url}/api/v2/jobs", headers={"Host": "gpus.example"}).json()["jobs"][0]
        finally:
            runner.close()
    assert direct["urls"] == {"self": f"{url}/api/v2/jobs/{job}", "events": f"{url}/api/v2/jobs/{job}/events",
                              "cancel": f"{url}/api/v2/jobs/{job}/cancel"}
    assert proxied["urls"]["self"] == listed["urls"]["self"] == f"https://gpus.example/api/v2/jobs/{job}"
    [output] = proxied["outputs"]
    assert output["url"] == f"https://gpus.example/api/v2/assets/{output['id']}/content"
    assert "evil.example" not in str(direct) + str(proxied)
