"""A partner-node API key and a key-like workflow input are stored to run the job and shown nowhere.

The job fails on purpose the way the runner fails a job: its error text (which quotes the key, as a
ComfyUI error can) goes through ``Redactor.for_job`` before ``retry_later`` and ``dead`` store it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from cli_support import cli, db_path, job_id, line, run_cli, write_config, write_jobs

from comfysup.queue.sqlite import SQLiteQueue
from comfysup.redact import MASK, Redactor

CANARY_KEY = "comfyui-canary-8c1f2e77d0a94b6f"
CANARY_INPUT = "sk-canary-input-5b3e9a1d44c2"
PARTNER = {
    "1": {"class_type": "PartnerTextToImage", "inputs": {"prompt": "a lighthouse", "api_key": "placeholder"}},
    "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "partner"}},
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("COMFYSUP_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.mark.timeout(60)
def test_canaries_appear_in_no_reason_and_no_command_output(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [line(1, set={"1.api_key": CANARY_INPUT}, extra_data={"api_key_comfy_org": CANARY_KEY})],
               workflow=PARTNER)
    code, out, err = cli(capsys, "submit", "--config", str(config), "jobs.jsonl")
    assert code == 0, err
    outputs = [out, err]

    q = SQLiteQueue(db_path(tmp_path))
    claim = q.leases.claim("runner-a", "gpu0", 60)
    assert claim is not None
    assert claim.extra_data["api_key_comfy_org"] == CANARY_KEY  # stored: the runner must send it
    assert claim.workflow["1"]["inputs"]["api_key"] == CANARY_INPUT
    redact = Redactor.for_job(claim.workflow, claim.extra_data)
    q.leases.retry_later(claim, run_after=0, reason=redact(f"HTTP 401 from api.comfy.org: key {CANARY_KEY} rejected"))
    claim = q.leases.claim("runner-b", "gpu1", 60)
    assert claim is not None
    q.leases.dead(claim, redact(f"gave up after 2 attempts, last: PartnerTextToImage: invalid api_key "
                         f"'{CANARY_INPUT}' (auth {CANARY_KEY})"))
    q.close()

    conn = sqlite3.connect(db_path(tmp_path))
    reasons = [r[0] for r in conn.execute("SELECT reason FROM jobs UNION ALL SELECT reason FROM attempts")]
    conn.close()
    assert any(MASK in (r or "") for r in reasons)  # the reasons are there, with the keys masked
    for reason in reasons:
        assert CANARY_KEY not in (reason or "") and CANARY_INPUT not in (reason or "")

    for args in (["status"], ["status", "--json"], ["show", job_id(1)], ["show", "--json", job_id(1)],
                 ["show", "--workflow", job_id(1)], ["show", "--json", "--workflow", job_id(1)]):
        code, out, err = cli(capsys, args[0], "--config", str(config), *args[1:])
        assert code == 0, (args, err)
        outputs += [out, err]
    process = run_cli("show", "--config", str(config), "--workflow", job_id(1), cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    outputs += [process.stdout, process.stderr]

    shown = "\n".join(outputs)
    assert "dead" in shown and "gave up after 2 attempts" in shown  # the commands did print the job
    assert CANARY_KEY not in shown
    assert CANARY_INPUT not in shown


def test_redactor_masks_values_named_like_secrets_and_bounds_length() -> None:
    workflow = {"5": {"class_type": "X", "inputs": {"auth_token": "tok-abcdef", "password": 123456, "seed": 42,
                                                    "image": ["4", 0], "nested": {"secret": ["s3cr3t-x"]}}}}
    redact = Redactor.for_job(workflow, {"auth_token_comfy_org": "bearer-zzz", "note": "public"})
    text = redact("tok-abcdef 123456 bearer-zzz s3cr3t-x public 42 " + "x" * 5000, limit=100)
    for secret in ("tok-abcdef", "123456", "bearer-zzz", "s3cr3t-x"):
        assert secret not in text
    assert text.startswith("*** *** *** *** public 42 ")
    assert text.endswith("more characters)")
    assert len(text) < 130
