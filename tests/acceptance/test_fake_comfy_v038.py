"""fake_comfy as ComfyUI 0.38 (fake_comfy/v038.py): each difference from 0.3.64, as read from 0.38's source."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from fake_comfy import FakeComfy
from fake_comfy.server import trivial_prompt

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(tmp_path: Path):
    with FakeComfy(base_directory=tmp_path / "c", node_ms=5, comfyui_version="0.38") as server:
        yield server


def post(fake: FakeComfy, prompt_id: str | None, prompt: dict | None = None) -> requests.Response:
    body = {"prompt": prompt or trivial_prompt(1, "t"), "client_id": "c"}
    if prompt_id is not None:
        body["prompt_id"] = prompt_id
    return requests.post(f"{fake.url}/prompt", json=body, timeout=5)


def wait_history(fake: FakeComfy, prompt_id: str) -> dict:
    for _ in range(200):
        entry = requests.get(f"{fake.url}/history/{prompt_id}", timeout=5).json()
        if entry:
            return entry[prompt_id]
        time.sleep(0.02)
    raise AssertionError("no history")


def test_prompt_id_must_be_a_canonical_uuid_and_a_missing_one_is_minted(fake: FakeComfy) -> None:
    for bad in ("job-1", str(uuid.uuid4()).upper(), uuid.uuid4().hex):
        answer = post(fake, bad)
        assert answer.status_code == 400
        assert answer.json() == {"error": {"type": "invalid_prompt_id", "message": "prompt_id must be a valid UUID",
                                           "details": answer.json()["error"]["details"], "extra_info": {}},
                                 "node_errors": {}}
    minted = post(fake, None).json()["prompt_id"]
    assert str(uuid.UUID(minted)) == minted and uuid.UUID(minted).version == 4
    assert post(fake, minted).status_code == 200  # still no duplicate check


def test_0364_takes_any_id(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path, comfyui_version="0.3.64") as old:
        assert post(old, "job-1").status_code == 200
        stats = requests.get(f"{old.url}/system_stats", timeout=5).json()["system"]
        assert (stats["comfyui_version"], stats["os"]) == ("0.3.64", "posix")
        assert requests.get(f"{old.url}/api/jobs", timeout=5).status_code == 404


def test_jobs_api_lists_filters_pages_and_finds(fake: FakeComfy) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for i, job_id in enumerate(ids):
        assert post(fake, job_id, trivial_prompt(i, f"p{i}")).status_code == 200
    for job_id in ids:
        wait_history(fake, job_id)
    listed = requests.get(f"{fake.url}/api/jobs", params={"status": "completed", "limit": 2}, timeout=5).json()
    assert [j["id"] for j in listed["jobs"]] == ids[::-1][:2]  # newest first
    assert listed["pagination"] == {"offset": 0, "limit": 2, "total": 3, "has_more": True}
    oldest = requests.get(f"{fake.url}/api/jobs", params={"sort_order": "asc", "offset": 2}, timeout=5).json()
    assert [j["id"] for j in oldest["jobs"]] == [ids[2]] and oldest["pagination"]["has_more"] is False
    for bad in ({"status": "nope"}, {"limit": "0"}, {"sort_by": "x"}, {"sort_order": "up"}, {"offset": "a"}):
        assert requests.get(f"{fake.url}/api/jobs", params=bad, timeout=5).status_code == 400
    one = requests.get(f"{fake.url}/api/jobs/{ids[0]}", timeout=5).json()
    assert one["status"] == "completed" and one["outputs_count"] == 1 and "3" in one["outputs"]
    assert requests.get(f"{fake.url}/api/jobs/{uuid.uuid4()}", timeout=5).status_code == 404


def test_atomic_cancel_interrupts_the_running_job_and_removes_a_pending_one(fake: FakeComfy) -> None:
    running, pending, done = (str(uuid.uuid4()) for _ in range(3))
    fake.script_by_id({running: ["hang"]})
    post(fake, running)
    post(fake, pending, trivial_prompt(2, "q"))
    for _ in range(100):
        if fake.stats()["order"]:
            break
        time.sleep(0.02)
    assert requests.post(f"{fake.url}/api/jobs/{pending}/cancel", timeout=5).json() == {"cancelled": True}
    assert requests.post(f"{fake.url}/api/jobs/{running}/cancel", timeout=5).json() == {"cancelled": True}
    assert wait_history(fake, running)["status"]["status_str"] == "error"
    assert requests.get(f"{fake.url}/history/{pending}", timeout=5).json() == {}
    assert requests.get(f"{fake.url}/api/jobs/{running}", timeout=5).json()["status"] == "cancelled"
    assert requests.post(f"{fake.url}/api/jobs/{done}/cancel", timeout=5).json() == {"cancelled": False}
    stats = fake.stats()
    assert [i["via"] for i in stats["interrupts"]] == ["cancel"] and stats["queue_deletes"][0]["via"] == "cancel"
    many = requests.post(f"{fake.url}/api/jobs/cancel", json={"job_ids": [done, "x"]}, timeout=5)
    assert many.status_code == 400 and many.json()["invalid_ids"] == ["x"]
    assert requests.post(f"{fake.url}/api/jobs/cancel", json={"job_ids": [done]}, timeout=5).json() == \
        {"cancelled": False}


def test_unknown_class_and_cycle_answer_as_0_38(fake: FakeComfy) -> None:
    prompt = trivial_prompt(1, "t")
    prompt["2"]["class_type"] = "NoSuchNode"
    body = post(fake, str(uuid.uuid4()), prompt).json()
    assert body["error"]["type"] == "missing_node_type"
    assert body["error"]["extra_info"] == {"node_id": "2", "class_type": "NoSuchNode", "node_title": "NoSuchNode"}
    cycle = trivial_prompt(1, "t")
    cycle["1"] = {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}}
    body = post(fake, str(uuid.uuid4()), cycle).json()
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    assert {e["type"] for n in body["node_errors"].values() for e in n["errors"]} == {"dependency_cycle"}
    assert set(body["node_errors"]) == {"1", "2"}


def test_outputs_carry_ids_system_stats_features_and_view(fake: FakeComfy) -> None:
    job_id = str(uuid.uuid4())
    post(fake, job_id)
    image = wait_history(fake, job_id)["outputs"]["3"]["images"][0]
    assert image["id"] == image["preview_id"]
    system = requests.get(f"{fake.url}/system_stats", timeout=5).json()["system"]
    assert (system["comfyui_version"], system["os"]) == ("0.38.1", "linux")
    features = requests.get(f"{fake.url}/features", timeout=5).json()
    assert features["assets"] is True and features["node_replacements"] is True
    (fake.output_directory / "x.html").write_text("<script>")
    answer = requests.get(f"{fake.url}/view", params={"filename": "x.html", "type": "output"}, timeout=5)
    assert answer.headers["Content-Disposition"].startswith("attachment;")
    assert answer.headers["Content-Type"] == "application/octet-stream"


def test_unknown_message_types_reach_every_client_and_progress_state_has_activity(fake: FakeComfy) -> None:
    import websocket

    ws = websocket.create_connection(f"{fake.ws_url}?clientId=c", timeout=5)
    other = websocket.create_connection(f"{fake.ws_url}?clientId=other", timeout=5)
    try:
        post(fake, str(uuid.uuid4()))
        seen: list[dict] = []
        while not any(m.get("type") == "assets.seed.completed" for m in seen):
            seen.append(__import__("json").loads(ws.recv()))
        states = [m for m in seen if m["type"] == "progress_state"]
        assert states and all("activity" in n for m in states for n in m["data"]["nodes"].values())
        for _ in range(20):
            if __import__("json").loads(other.recv())["type"] == "assets.seed.completed":
                break
        else:
            raise AssertionError("the other client never heard the broadcast")
    finally:
        ws.close()
        other.close()


def launch(tmp: Path, *args: str, port: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(REPO / "fake_comfy" / "main.py"), "--port", str(port),
                             "--base-directory", str(tmp), "--cpu", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if "To see the GUI" in line:
            return
    raise AssertionError(proc.stderr.read() if proc.stderr else "")


def test_removed_flags_exit_2_and_cuda_device_takes_a_list(tmp_path: Path) -> None:
    for flag in ("--normalvram", "--disable-ipex-optimize"):
        proc = launch(tmp_path, "--comfyui-version", "0.38", flag)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 2 and flag in err
    proc = launch(tmp_path, "--comfyui-version", "0.3.64", "--cuda-device", "0,1")
    assert proc.wait(timeout=20) == 2  # an int there
    proc = launch(tmp_path, "--comfyui-version", "0.38", "--cuda-device", "all", "--disable-assets")
    try:
        started(proc)
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def test_a_second_server_on_one_user_directory_exits_unless_it_has_its_own_database(tmp_path: Path) -> None:
    first = launch(tmp_path, "--comfyui-version", "0.38")
    try:
        started(first)
        second = launch(tmp_path, "--comfyui-version", "0.38")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 1 and "ASSETS_STARTUP_FAILED: in_use" in err and "--database-url" in err
        for own in (("--database-url", f"sqlite:///{tmp_path / 'other.db'}"), ("--disable-assets",)):
            third = launch(tmp_path, "--comfyui-version", "0.38", *own)
            try:
                started(third)
            finally:
                third.kill()
                third.communicate(timeout=10)
    finally:
        first.kill()
        first.communicate(timeout=10)


def test_a_port_in_use_exits_1_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        proc = launch(tmp_path, "--comfyui-version", "0.38", "--disable-assets", port=held.getsockname()[1])
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and "is already in use on address 127.0.0.1" in err


def test_ram_pressure_cache_runs_again_and_classic_serves_from_the_cache(tmp_path: Path) -> None:
    for classic, cached in ((False, False), (True, True)):
        with FakeComfy(base_directory=tmp_path / str(classic), comfyui_version="0.38", ram_pressure=True,
                       cache_classic=classic) as fc:
            a, b = str(uuid.uuid4()), str(uuid.uuid4())
            post(fc, a)
            wait_history(fc, a)
            post(fc, b)
            wait_history(fc, b)
            assert fc.stats()["prompts"][b]["cached"] == (1 if cached else 0)
