"""the memory recovery in a runner, against fake_comfy's ``oom`` and ``fatal`` scripts: an out-of-memory
execution_error makes the attempt POST /free and run the job once more on the same server before the normal retry
path; an error that leaves the device unusable asks for the server's restart (the supervisor's part is tested
under ``comfysup run`` in tests/acceptance/test_ready_warm.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from comfysup.runner.loop import Runner
from comfysup.runner.memory import MemoryHooks
from comfysup.runner.options import RunnerHooks, RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


def counter(counted: Counter[str]) -> Any:
    return lambda what: counted.update([what])


def run(tmp_path: Path, fake_comfy: FakeComfy, hooks: MemoryHooks) -> None:
    Runner(config_of(tmp_path / "config.toml"), "cpu0", fake_comfy.url,
           RunnerOptions(until_empty=True), RunnerHooks(memory=hooks)).run()


@pytest.mark.timeout(30)
def test_an_oom_frees_memory_and_runs_the_job_again_in_the_same_attempt(tmp_path: Path, fake_comfy: FakeComfy) -> None:
    fake_comfy.script_by_id({job_id(1): ["oom", "ok"]})
    queue = submit(write_config(tmp_path), [trivial_job(1)])
    hooks = MemoryHooks(count=counter(counted := Counter[str]()))
    run(tmp_path, fake_comfy, hooks)
    job = queue.reads.get(job_id(1))
    assert job.state == "done" and job.attempt == 1 and len(job.outputs) == 1
    stats = fake_comfy.stats()
    assert [(f["unload_models"], f["free_memory"]) for f in stats["frees"]] == [(True, True)]
    assert (stats["prompts"][job_id(1)]["posted"], stats["prompts"][job_id(1)]["executed"]) == (2, 2)
    assert counted == {"oom_frees": 1, "oom_retries": 1}
    queue.close()


@pytest.mark.timeout(30)
def test_a_second_oom_takes_the_normal_retry_path(tmp_path: Path, fake_comfy: FakeComfy) -> None:
    fake_comfy.script_by_id({job_id(1): ["oom", "oom", "oom", "oom"], job_id(2): ["oom", "oom", "ok"]})
    # No job queued ahead: one waiting behind an OOM starts at once, and the OOM then takes the normal path.
    queue = submit(write_config(tmp_path, queue_ahead=False), [trivial_job(1), trivial_job(2)])
    run(tmp_path, fake_comfy, MemoryHooks())
    dead, retried = queue.reads.get(job_id(1)), queue.reads.get(job_id(2))
    assert dead.state == "dead" and dead.attempt == 2  # attempts = 2, each ran twice
    assert dead.reason is not None and dead.reason.startswith("gave up after 2 attempts, last: execution_error")
    assert "OutOfMemoryError" in dead.reason
    assert retried.state == "done" and retried.attempt == 2
    assert [a.kind for a in retried.attempts[:1]] == ["oom"]
    assert fake_comfy.stats()["prompts"][job_id(1)]["executed"] == 4
    assert len(fake_comfy.stats()["frees"]) == 3  # once per attempt that met an OOM
    queue.close()


@pytest.mark.timeout(30)
def test_a_lost_device_asks_for_a_restart_and_is_retried(tmp_path: Path, fake_comfy: FakeComfy) -> None:
    fake_comfy.script_by_id({job_id(1): ["fatal"]})
    queue = submit(write_config(tmp_path), [trivial_job(1)])
    hooks = MemoryHooks(restarts=True, restart=(restarts := []).append, count=counter(counted := Counter[str]()))
    run(tmp_path, fake_comfy, hooks)
    job = queue.reads.get(job_id(1))
    # Nobody restarted the fake here: its device stays lost, so the retry fails the same way, and is dead-lettered.
    assert job.state == "dead" and [a.kind for a in job.attempts] == ["device_lost", "device_lost"]
    assert job.reason is not None and "device-side assert triggered" in job.reason
    assert len(restarts) == 2 and all("the device is unusable after: execution_error" in r for r in restarts)
    assert counted == {"device_restarts": 2} and fake_comfy.stats()["frees"] == []
    fake_comfy.restart()  # what the supervisor does: a new process has a working device
    queue2 = submit(tmp_path / "config.toml", [trivial_job(2)])
    run(tmp_path, fake_comfy, MemoryHooks())
    assert queue2.reads.get(job_id(2)).state == "done"
    queue.close()
    queue2.close()


@pytest.mark.timeout(30)
def test_an_oom_with_a_job_queued_behind_goes_back_to_the_queue_uncounted(tmp_path: Path,
                                                                          fake_comfy: FakeComfy) -> None:
    """The job queued ahead behind it starts the moment the OOM ends its run: the job is not posted behind that
    one, but given back at once without counting the attempt (after POST /free), and claimed again."""
    fake_comfy.node_ms = 50  # the second job is queued behind the first while that one executes
    fake_comfy.script_by_id({job_id(1): ["oom", "oom", "ok"]})
    queue = submit(write_config(tmp_path), [trivial_job(1), trivial_job(2)])
    run(tmp_path, fake_comfy, MemoryHooks(count=counter(counted := Counter[str]())))
    first, second = queue.reads.get(job_id(1)), queue.reads.get(job_id(2))
    assert second.state == "done" and first.state == "done"
    outcomes = [(a.outcome, a.kind) for a in first.attempts]
    # released uncounted after the first OOM (a job behind it), then a counted OOM (no second free-and-retry for
    # the same attempt), then done
    assert outcomes[0] == ("released_uncounted", "oom"), outcomes
    assert outcomes[1] == ("retry", "oom") and outcomes[-1][0] == "done", outcomes
    assert len(outcomes) == 3 and counted == {"oom_frees": 1, "oom_retries": 1}, counted
    assert first.attempt == 2 and len(fake_comfy.stats()["frees"]) == 1
    queue.close()


@pytest.mark.timeout(30)
def test_a_runner_runs_the_warm_up_its_supervisor_asks_for_once_per_start(tmp_path: Path,
                                                                          fake_comfy: FakeComfy) -> None:
    """comfysup.runner.warmup.WarmUp: the warm-up of start N is run once (its duration and error reported), again for
    start N + 1; a workflow the server rejects is reported as the error (the supervisor fails that start)."""
    from comfysup.comfy import ComfyClient
    from comfysup.runner.warmup import WarmUp
    from tests.runner_helpers import TRIVIAL

    wanted, reports = {"start": 1}, []
    warm = WarmUp(TRIVIAL, 10.0, lambda: wanted["start"], lambda *report: reports.append(report))
    client = ComfyClient(fake_comfy.url)
    try:
        warm.step("cpu0", client, lambda: None, lambda: False)
        warm.step("cpu0", client, lambda: None, lambda: False)  # done for start 1: nothing more
        assert [(start, error) for start, _, error in reports] == [(1, "")] and reports[0][1] >= 0
        wanted["start"] = 2
        warm.workflow = {"1": {"class_type": "NoSuchNode", "inputs": {}}}
        warm.step("cpu0", client, lambda: None, lambda: False)
        assert reports[1][0] == 2 and reports[1][2].startswith("POST /prompt 400"), reports
        runs = sorted(p["executed"] for p in fake_comfy.stats()["prompts"].values())
        assert runs == [0, 1]  # the first warm-up ran; the rejected one was posted and never executed
    finally:
        client.close()
