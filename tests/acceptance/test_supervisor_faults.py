"""``comfysup run`` against deaths: a server killed mid-job, a runner killed mid-job, a server that
cannot start, and the supervisor itself killed with SIGKILL. Every job ends done exactly once.

Acceptance tier: the supervisor is a subprocess, its two "ComfyUI" servers are fake_comfy launched
through ``[comfyui] main`` on ``gpus = "cpu:2"``, exactly as a real ComfyUI would be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from supervisor_support import (
    FAKE_MAIN,
    Supervised,
    executions,
    gone,
    job,
    job_id,
    processes_under,
    wait_for,
)


def make(harness: list[Supervised], tmp_path: Path, **kwargs: object) -> Supervised:
    h = Supervised(tmp_path, **kwargs)  # type: ignore[arg-type]
    harness.append(h)
    return h


def files_of(h: Supervised, job: str) -> list[str]:
    folder = h.config.resolve(h.config.store.dir) / job
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.timeout(90)
def test_a_server_killed_mid_job_is_restarted_and_the_job_is_done_once(harness: list[Supervised],
                                                                        tmp_path: Path) -> None:
    victim = job_id(0)
    h = make(harness, tmp_path, script={victim: ["slow"]}, node_ms=100)  # ~3 s the first time
    ids = h.submit([job(n) for n in range(4)])
    proc = h.start()
    slot = wait_for(lambda: h.slot_running(victim), 30, "the job to run on a server", h.describe)
    os.kill(slot["pid"], signal.SIGKILL)

    jobs = h.wait_terminal(ids)
    assert {j.state for j in jobs.values()} == {"done"}, h.describe()
    record = jobs[victim]
    assert record.attempt == 2, "the run destroyed by the crash is re-run, and counted"
    assert record.attempts[0].outcome == "retry"
    assert len(record.outputs) == 1 and files_of(h, victim) == [record.outputs[0].name]
    after = wait_for(lambda: h.slot(slot["name"])["state"] == "running" and h.slot(slot["name"]), 20,
                     "the killed server to run again", h.describe)
    assert after["restarts"] == 1 and after["pid"] != slot["pid"]
    assert f"{slot['name']}: ComfyUI pid {slot['pid']} exited (killed by SIGKILL)" in h.log()
    # The servers alive now executed it once between them (the killed one's run never finished).
    state = h.state()
    assert state is not None
    assert sum(executions(s["url"], victim) for s in state["slots"]) == 1
    assert h.stop(proc) == 0


@pytest.mark.timeout(90)
def test_a_runner_killed_mid_job_is_released_at_once_and_the_job_is_done_once(harness: list[Supervised],
                                                                              tmp_path: Path) -> None:
    victim = job_id(10)
    h = make(harness, tmp_path, script={victim: ["slow"]}, node_ms=100)  # ~3 s, lease 10 s
    ids = h.submit([job(10), job(11), job(12)])
    proc = h.start()
    slot = wait_for(lambda: h.slot_running(victim), 30, "the job to run on a server", h.describe)
    killed_at = time.time()
    os.kill(slot["runner_pid"], signal.SIGKILL)

    def released() -> bool:
        attempts = h.jobs([victim])[victim].attempts
        return bool(attempts) and attempts[0].ended_at is not None

    wait_for(released, 5, "the dead runner's claim to be released", h.describe)
    first = h.jobs([victim])[victim].attempts[0]
    assert first.outcome == "released" and "runner process died" in (first.reason or "")
    assert first.ended_at is not None and first.ended_at - killed_at < 3.0, "released at once, not at lease expiry"

    jobs = h.wait_terminal(ids)
    assert {j.state for j in jobs.values()} == {"done"}, h.describe()
    assert len(jobs[victim].outputs) == 1 and files_of(h, victim) == [jobs[victim].outputs[0].name]
    state = h.state()
    assert state is not None
    # The prompt kept running on its server and was followed there or adopted: executed once in all.
    assert sum(executions(s["url"], victim) for s in state["slots"]) == 1
    again = wait_for(lambda: h.slot(slot["name"])["runner_pid"] not in (None, slot["runner_pid"])
                     and h.slot(slot["name"]), 10, "a new runner", h.describe)
    assert again["runner_restarts"] == 1
    assert gone(slot["runner_pid"])
    assert h.stop(proc) == 0


WRAPPER = """\
import runpy, sys
if "cpu1" in " ".join(sys.argv):
    print("wrapper: this ComfyUI cannot start on cpu1", file=sys.stderr)
    sys.exit(3)
sys.argv[0] = {main!r}
runpy.run_path({main!r}, run_name="__main__")
"""


@pytest.mark.timeout(90)
def test_a_server_that_exits_at_start_backs_off_then_fails_and_the_other_slot_does_all_jobs(
        harness: list[Supervised], tmp_path: Path) -> None:
    main = tmp_path / "comfyui_main.py"  # ComfyUI's main.py, failing on one slot: fake_comfy on the other
    main.write_text(WRAPPER.format(main=str(FAKE_MAIN)))
    h = make(harness, tmp_path, main=main)
    ids = h.submit([job(n) for n in range(20, 26)])
    proc = h.start()

    failed = wait_for(lambda: h.state() and h.slot("cpu1")["state"] == "failed" and h.slot("cpu1"), 30,
                      "cpu1 to be marked failed", h.describe)
    assert failed["restarts"] == 2  # three starts in all: max_quick_failures = 3
    assert "3 quick failures in a row" in failed["reason"] and "exit code 3" in failed["reason"]
    assert "cannot start on cpu1" in (tmp_path / "var" / "comfyui" / "cpu1" / "comfyui.log").read_text()
    jobs = h.wait_terminal(ids)
    assert {(j.state, j.server) for j in jobs.values()} == {("done", "cpu0")}
    assert proc.poll() is None, "one failed slot does not stop the supervisor"
    assert h.slot("cpu1")["restarts"] == 2, "no restart loop once failed"

    status = subprocess.run([sys.executable, "-m", "comfysup", "status", "--config", str(h.config_path)],
                            capture_output=True, text=True, timeout=30)
    row = next(line for line in status.stdout.splitlines() if line.startswith("cpu1 "))
    assert row.split()[:3] == ["cpu1", "cpu", "failed"], status.stdout
    health = subprocess.run([sys.executable, "-m", "comfysup", "health", "--config", str(h.config_path)],
                            capture_output=True, text=True, timeout=30)
    assert health.returncode == 0, health.stdout + health.stderr  # cpu0 is healthy
    assert "1 of 2 server(s) healthy" in health.stdout
    assert h.stop(proc) == 0
    health = subprocess.run([sys.executable, "-m", "comfysup", "health", "--config", str(h.config_path)],
                            capture_output=True, text=True, timeout=30)
    assert health.returncode == 1, health.stdout  # nothing is healthy once the supervisor has stopped


@pytest.mark.timeout(90)
def test_kill_9_of_the_supervisor_leaves_no_process_and_a_new_one_finishes_every_job_once(
        harness: list[Supervised], tmp_path: Path) -> None:
    # A long lease: jobs finishing soon after the restart prove the stale claims were released.
    h = make(harness, tmp_path, node_ms=300, runner={"lease_seconds": 120.0})
    ids = h.submit([job(n) for n in range(30, 36)])
    first = h.start()
    h.wait_ready(first)
    state = wait_for(lambda: (s := h.state()) and all(slot["job"] for slot in s["slots"]) and s, 20,
                     "both runners to hold a job", h.describe)
    held = {slot["job"] for slot in state["slots"]}
    children = [pid for slot in state["slots"] for pid in (slot["pid"], slot["runner_pid"])]
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)

    wait_for(lambda: all(gone(pid) for pid in children), 5, "servers and runners to die with the supervisor")
    wait_for(lambda: not processes_under(tmp_path), 5, "no process of this installation left",
             lambda: str(processes_under(tmp_path)))
    assert {j.state for j in h.jobs(sorted(held)).values()} == {"running"}  # claims left behind
    # Each runner holds its running job and may hold one more queued behind it ([runner] queue_ahead).
    claimed = {j.id for j in h.jobs(ids).values() if j.state == "running"}
    assert held <= claimed and len(claimed) <= 2 * len(held)

    started = time.monotonic()
    second = h.start()
    jobs = h.wait_terminal(ids, seconds=60)
    assert time.monotonic() - started < 60, "well before the 120 s lease"
    assert {j.state for j in jobs.values()} == {"done"}, h.describe()
    for job_id_ in claimed:  # one attempt of each ended by the new supervisor's release (counted: it may have run);
        # an earlier one may have been a queued-ahead job given back uncounted to a runner waiting for work
        attempts = jobs[job_id_].attempts
        assert [a.outcome for a in attempts if "earlier supervisor" in (a.reason or "")] == ["released"], attempts
        assert all(a.outcome == "released_uncounted" for a in attempts[:-2]), attempts
    assert f"released {len(claimed)} claim(s) of runners that no longer exist" in h.log()
    for record in jobs.values():
        assert record.attempt <= 2 and len(record.outputs) == 1
        assert files_of(h, record.id) == [record.outputs[0].name]
    state = h.state()
    assert state is not None
    for job_id_ in ids:
        assert sum(executions(s["url"], job_id_) for s in state["slots"]) <= 1
    assert h.stop(second) == 0


@pytest.mark.timeout(90)
def test_a_silent_runner_is_killed_after_runner_timeout_then_released_before_its_lease(
        harness: list[Supervised], tmp_path: Path) -> None:
    victim = job_id(60)
    h = make(harness, tmp_path, script={victim: ["slow"]}, node_ms=200)  # ~6 s; runner_timeout 5 s, lease 10 s
    ids = h.submit([job(60), job(61)])
    proc = h.start()
    slot = wait_for(lambda: h.slot_running(victim), 30, "the job to run on a server", h.describe)
    stopped_at = time.time()
    os.kill(slot["runner_pid"], signal.SIGSTOP)  # alive but silent: a hung runner

    def released() -> bool:
        attempts = h.jobs([victim])[victim].attempts
        return bool(attempts) and attempts[0].ended_at is not None

    wait_for(released, 15, "the silent runner's claim to be released", h.describe)
    first = h.jobs([victim])[victim].attempts[0]
    assert first.outcome == "released" and "silent for" in (first.reason or "")
    assert first.ended_at is not None and 4.5 <= first.ended_at - stopped_at < 9.5, \
        "killed after runner_timeout_seconds (5 s), before the 10 s lease could expire"
    assert gone(slot["runner_pid"])
    jobs = h.wait_terminal(ids)
    assert {j.state for j in jobs.values()} == {"done"}, h.describe()
    state = h.state()
    assert state is not None
    assert sum(executions(s["url"], victim) for s in state["slots"]) == 1, "followed on its server, not re-run"
    assert h.stop(proc) == 0


@pytest.mark.timeout(60)
def test_a_server_above_recycle_rss_mb_is_restarted(harness: list[Supervised], tmp_path: Path) -> None:
    h = make(harness, tmp_path, supervisor={"recycle_rss_mb": 1})  # every server is above 1 MiB
    proc = h.start()
    h.wait_ready(proc)
    first = h.slot("cpu0")
    recycled = wait_for(lambda: (s := h.slot("cpu0"))["restarts"] >= 1 and s["state"] == "running" and s, 20,
                        "a restart for memory", h.describe)
    assert recycled["pid"] != first["pid"]
    assert recycled["reason"].startswith("memory ") and "above recycle_rss_mb = 1" in recycled["reason"]
    assert h.stop(proc) == 0


@pytest.mark.timeout(60)
def test_servers_of_the_config_are_used_as_they_are_not_launched(harness: list[Supervised], tmp_path: Path,
                                                                  fake_comfy: object) -> None:
    url = fake_comfy.url  # type: ignore[attr-defined]
    h = make(harness, tmp_path, node_ms=150, servers=[{"name": "remote0", "url": url}])
    ids = h.submit([job(n) for n in range(70, 76)])
    proc = h.start()
    jobs = h.wait_terminal(ids)
    assert {j.state for j in jobs.values()} == {"done"}
    assert "remote0" in {j.server for j in jobs.values()}, "the external server's runner takes jobs too"
    remote = h.slot("remote0")
    assert (remote["state"], remote["device"], remote["pid"], remote["port"]) == ("external", "external", None, None)
    assert remote["runner_pid"] and not gone(remote["runner_pid"])
    assert h.stop(proc) == 0
    assert fake_comfy.stats()["prompts"], "the external server was used"  # type: ignore[attr-defined]
    assert not processes_under(tmp_path)
