"""``comfysup run`` as a service: a graceful SIGTERM (a job shorter than the grace finishes, a longer
one is interrupted and back in the queue with its attempt count unchanged), systemd's notify protocol,
recycling a server between jobs, and the demo.

Acceptance tier: the supervisor is a subprocess and its servers are fake_comfy launched through
``[comfyui] main`` on ``gpus = "cpu:2"``.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from supervisor_support import REPO, Supervised, gone, job, job_id, processes_under, wait_for


@pytest.mark.timeout(90)
def test_sigterm_lets_a_short_job_finish_and_returns_a_long_one_uncounted(harness: list[Supervised],
                                                                          tmp_path: Path) -> None:
    short, long = job_id(40), job_id(41)
    grace = 4.0
    h = Supervised(tmp_path, script={short: ["slow"], long: ["hang"]}, node_ms=80,  # short: ~2.4 s
                   runner={"grace_seconds": grace})
    harness.append(h)
    ids = h.submit([job(40), job(41)])
    proc = h.start()
    wait_for(lambda: h.slot_running(short) and h.slot_running(long), 30, "both jobs to run", h.describe)
    state = h.state()
    assert state is not None
    children = [pid for slot in state["slots"] for pid in (slot["pid"], slot["runner_pid"])]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(grace + 20) == 0, h.describe()
    took = time.monotonic() - sent
    assert grace - 0.5 <= took < grace + 10, f"stopped after {took:.1f} s; the hanging job had {grace} s of grace"

    jobs = h.jobs(ids)
    assert jobs[short].state == "done" and jobs[short].attempt == 1
    assert jobs[long].state == "queued"
    assert jobs[long].attempt == 0, "the interrupted attempt is not counted"
    assert jobs[long].attempts[-1].outcome == "released_uncounted"
    assert "graceful stop" in (jobs[long].attempts[-1].reason or "")
    assert all(gone(pid) for pid in children)
    assert not processes_under(tmp_path)
    final = h.state()
    assert final is not None and final["state"] == "stopped"
    # After a clean stop, status says stopped, when, and what waits: no slot "running", no
    # supervisor that looks stale, in the state file or the machines table every status on the queue reads.
    assert [s["state"] for s in final["slots"]] == ["stopped"] * len(final["slots"])
    status = subprocess.run([sys.executable, "-m", "comfysup", "status", "--config", str(h.config_path), "--json"],
                            capture_output=True, text=True, timeout=30, cwd=REPO)
    (machine,) = json.loads(status.stdout)["machines"]
    assert machine["stopped"] and not machine["stale"], machine
    assert {s["state"] for s in machine["slots"]} == {"stopped"}, machine["slots"]
    text = subprocess.run([sys.executable, "-m", "comfysup", "status", "--config", str(h.config_path)],
                          capture_output=True, text=True, timeout=30, cwd=REPO).stdout
    assert "supervisor stopped" in text and "queued jobs wait for `comfysup run`" in text, text
    assert "running" not in text.split("machines sharing")[-1], text


@pytest.mark.timeout(60)
def test_sd_notify_says_ready_then_watchdog_then_stopping(harness: list[Supervised], tmp_path: Path) -> None:
    h = Supervised(tmp_path)
    harness.append(h)
    address = f"@comfysup-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + address[1:])
        sock.settimeout(0.2)
        proc = h.start(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"})
        messages: list[str] = []

        def received(prefix: str) -> bool:
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                pass
            assert proc.poll() is None or prefix == "STOPPING=1", h.describe()
            return any(m.startswith(prefix) for m in messages)

        wait_for(lambda: received("READY=1"), 30, "READY=1", h.describe)
        ready_at = len(messages)
        wait_for(lambda: received("WATCHDOG=1") and messages[ready_at:].count("WATCHDOG=1") >= 2, 10,
                 "two watchdog pings after READY (every 0.2 s for WATCHDOG_USEC = 0.4 s)")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: received("STOPPING=1"), 15, "STOPPING=1", h.describe)
        assert proc.wait(20) == 0

    kinds = [m.split("\n")[0].split("=")[0] for m in messages]
    first_ready, stopping = kinds.index("READY"), kinds.index("STOPPING")
    assert "WATCHDOG" not in kinds[:first_ready], "the watchdog starts once the service is ready"
    assert "WATCHDOG" in kinds[first_ready:stopping]
    assert kinds.count("READY") == 1 and kinds.count("STOPPING") == 1
    ready = next(m for m in messages if m.startswith("READY=1"))
    assert "STATUS=2 of 2 ComfyUI server(s) running" in ready


@pytest.mark.timeout(90)
def test_recycling_after_n_jobs_restarts_servers_between_jobs_and_fails_no_job(harness: list[Supervised],
                                                                               tmp_path: Path) -> None:
    h = Supervised(tmp_path, node_ms=60, supervisor={"recycle_after_jobs": 2})
    harness.append(h)
    ids = h.submit([job(n) for n in range(50, 58)])
    proc = h.start()
    jobs = h.wait_terminal(ids, seconds=60)
    assert {(j.state, j.attempt) for j in jobs.values()} == {("done", 1)}, "no job failed or was retried"

    def recycled() -> dict | None:
        state = h.state()
        if not state:
            return None
        slots = state["slots"]
        # A restart after every 2 jobs of a slot, however the 8 jobs were shared between the two.
        settled = all(s["state"] == "running" and s["draining"] is None for s in slots)
        counted = sum(s["jobs"] for s in slots) == 8
        return state if counted and settled and all(s["restarts"] == s["jobs"] // 2 for s in slots) else None

    state = wait_for(recycled, 30, "every due recycle to be done", h.describe)
    assert sum(slot["restarts"] for slot in state["slots"]) >= 3
    assert "recycled after 2 job(s); restarting ComfyUI" in h.log()
    assert "exited" not in h.log(), "a recycled server is stopped on purpose, never seen as a crash"
    assert h.stop(proc) == 0


@pytest.mark.timeout(90)
def test_the_demo_runs_the_example_end_to_end_and_stops(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "comfysup", "demo", "--dir", str(tmp_path / "demo")],
                            cwd=REPO, capture_output=True, text=True, timeout=80)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10 of 10 job(s) done" in result.stdout
    assert result.stdout.count(" done ") >= 10  # one results row per job
    assert "supervisor stopped (exit code 0)" in result.stderr
    assert len(list((tmp_path / "demo" / "var" / "results").iterdir())) == 10
    assert not processes_under(tmp_path)
