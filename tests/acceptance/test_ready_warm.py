"""Under ``comfysup run``: each server runs ``[comfyui] warmup`` after every start before its slot takes a
job (a failing one is a failed start), GET /ready answers 503 until a slot is warm and while the queued jobs per
ready slot exceed ``[api] ready_max_queue_per_slot`` (200 in between, on the status server and the API), and a
lost device (fake_comfy's ``fatal``) restarts the server, which warms up again, after which the job is done there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.port_support import server_port
from tests.runner_helpers import TRIVIAL
from tests.supervisor_support import Supervised, job, job_id, wait_for


def get(url: str) -> tuple[int, dict[str, Any]] | None:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


@pytest.mark.timeout(90)
def test_ready_after_the_warm_up_and_not_above_the_queue_bound(harness: list[Supervised], tmp_path: Path) -> None:
    (tmp_path / "warmup.json").write_text(json.dumps(TRIVIAL))
    port = server_port()
    slow = [job_id(n) for n in range(4)]
    # The warm-up is the first prompt of each server without a scripted id: "slow" (10 × node_ms a node).
    h = Supervised(tmp_path, node_ms=60, script={j: ["slow"] for j in slow},
                   comfyui={"gpus": "cpu:1", "warmup": "warmup.json", "extra_args": ["--node-ms", "60",
                            "--script-file", str(tmp_path / "script.json"), "--script", "slow"]},
                   extra_sections={"api": {"listen": f"127.0.0.1:{port}", "ready_max_queue_per_slot": 1.0}})
    harness.append(h)
    proc = h.start()
    status = h.metrics_url(proc)

    def warming() -> dict[str, Any] | None:
        state = h.state()
        slots = (state or {}).get("slots") or []
        return slots[0] if slots and slots[0].get("warming") else None

    wait_for(warming, 30, "the slot warming up", h.describe)
    for url in (f"{status}ready", f"http://127.0.0.1:{port}/ready"):
        answer = wait_for(lambda url=url: get(url), 20, f"{url} answering", h.describe)
        assert answer[0] == 503 and answer[1]["ready_slots"] == 0, answer
        assert "warming up" in answer[1]["reason"], answer
    ready = wait_for(lambda: (a := get(f"{status}ready")) and a[0] == 200 and a, 30, "200 from /ready", h.describe)
    assert ready[1]["ready_slots"] == 1 and ready[1]["status"] == "ready"
    slot = h.slot("cpu0")
    assert slot["ready"] and slot["warmup_seconds"] >= 1.5 and slot["warmup_failures"] == 0, slot  # 3 nodes × 0.6 s
    # Four slow jobs: one runs, one waits behind it in the server's queue, two stay queued: 2 per ready slot > 1.
    ids = h.submit([job(n) for n in range(4)])
    above = wait_for(lambda: (a := get(f"http://127.0.0.1:{port}/ready")) and a[0] == 503 and a, 20,
                     "503 above the bound", h.describe)
    assert "ready_max_queue_per_slot = 1" in above[1]["reason"] and above[1]["ready_slots"] == 1, above
    metrics = httpx.get(f"{status}metrics", timeout=5).text
    assert "comfysup_ready_slots 1.0" in metrics and "comfysup_slot_warmup_seconds{" in metrics
    assert "comfysup_queued_jobs_per_ready_slot" in metrics and "comfysup_oldest_queued_age_seconds" in metrics
    h.wait_terminal(ids, 60)
    for url in (f"{status}ready", f"http://127.0.0.1:{port}/ready"):
        assert wait_for(lambda url=url: (a := get(url)) and a[0] == 200 and a, 20, "ready again", h.describe)
    assert httpx.get(f"http://127.0.0.1:{port}/api/v2/health", timeout=5).status_code == 200  # liveness, as before
    assert "warm-up done in" in h.log()
    assert h.stop(proc) == 0


@pytest.mark.timeout(60)
def test_a_failing_warm_up_is_a_failed_start(harness: list[Supervised], tmp_path: Path) -> None:
    broken = {**TRIVIAL, "2": {"class_type": "NoSuchNode", "inputs": {"image": ["1", 0]}}}
    (tmp_path / "warmup.json").write_text(json.dumps(broken))
    h = Supervised(tmp_path, comfyui={"gpus": "cpu:1", "warmup": "warmup.json"},
                   supervisor={"max_quick_failures": 2})
    harness.append(h)
    proc = h.start()
    assert proc.wait(45) == 3, h.describe()  # every slot failed: EXIT_NO_SLOT_ALIVE
    slot = h.slot("cpu0")
    assert slot["state"] == "stopped" and slot["warmup_failures"] == 2, slot
    assert h.log().count("cpu0: warm-up failed: POST /prompt 400") == 2, h.describe()
    assert "failed after 2 quick failures in a row, last: warm-up failed: POST /prompt 400" in h.log()


@pytest.mark.timeout(60)
def test_a_lost_device_restarts_the_server_and_the_job_is_done_there(harness: list[Supervised],
                                                                      tmp_path: Path) -> None:
    fatal = job_id(0)
    (tmp_path / "warmup.json").write_text(json.dumps(TRIVIAL))
    h = Supervised(tmp_path, script={fatal: ["fatal"]}, comfyui={"gpus": "cpu:1", "warmup": "warmup.json"})
    harness.append(h)
    ids = h.submit([job(0)])
    proc = h.start()
    jobs = h.wait_terminal(ids, 40)
    # The fake's device stays lost until its process restarts: the retry could only succeed on a new server.
    assert jobs[fatal].state == "done" and [a.kind for a in jobs[fatal].attempts[:1]] == ["device_lost"], h.describe()
    assert "device-side assert triggered" in (jobs[fatal].attempts[0].reason or "")
    slot = wait_for(lambda: (s := h.slot("cpu0")) and s["state"] == "running" and s["ready"] and s, 20, "running",
                    h.describe)
    assert slot["device_restarts"] == 1 and slot["restarts"] == 1, slot
    assert "restarting ComfyUI" in h.log()
    assert h.log().count("cpu0: warm-up done in") == 2, h.describe()  # after the start and after the restart
    assert h.stop(proc) == 0
