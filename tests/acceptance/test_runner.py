"""The runner against fake_comfy: every job done exactly once, or dead with a reason a person can act on."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path

import pytest
import requests

from comfysup.comfy import ComfyClient
from comfysup.errors import LeaseLost
from comfysup.runner.attempt import Attempt
from comfysup.runner.loop import Runner, settings_from
from comfysup.runner.options import RunnerOptions
from comfysup.runner.station import Station
from comfysup.runner.store import ResultStore
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, config_of, job_id, jobs_file, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.fixture
def fake(tmp_path):
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=5)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fake_b(tmp_path):
    server = FakeComfy(base_directory=tmp_path / "fake_b", node_ms=5)
    server.start()
    yield server
    server.stop()


def prompts(fake: FakeComfy) -> dict:
    return fake.stats()["prompts"]


def run_until_empty(config_path: Path, fake: FakeComfy, name: str = "cpu0", **kw) -> Runner:
    runner = Runner(config_of(config_path), name, fake.url, RunnerOptions(until_empty=True), **kw)
    runner.run()
    return runner


def store_files(tmp_path: Path, n: int) -> list[Path]:
    folder = tmp_path / "store" / job_id(n)
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.mark.timeout(90)
def test_failure_script(tmp_path, fake):
    """Seven jobs, each with its own script of what the server does to it."""
    scripts = [["500", "ok"], ["drop"], ["invalid"], ["oom", "ok"], ["error"], ["hang", "hang"], []]
    fake.script_by_id({job_id(i + 1): words for i, words in enumerate(scripts)})
    config = write_config(tmp_path)
    jobs = jobs_file(tmp_path, [trivial_job(i + 1) for i in range(7)])
    assert comfysup("submit", str(jobs), "--config", str(config)).returncode == 0
    out = comfysup("work", "--config", str(config), "--server", f"cpu0={fake.url}", "--until-empty",
                   "--attempts", "2", "--timeout-seconds", "1", "--base-delay-ms", "100", "--no-jitter")
    log = out.stderr
    assert out.returncode == 0, log
    assert "summary: 4 done, 3 dead-lettered" in log
    queue = submit(config, [])
    jobs_by_n = {n: queue.reads.get(job_id(n)) for n in range(1, 8)}
    p = prompts(fake)

    def short(n: int) -> str:
        return job_id(n)

    # 500 then ok: done after 2 attempts, posted twice, executed once.
    assert jobs_by_n[1].state == "done" and jobs_by_n[1].attempt == 2
    assert (p[job_id(1)]["posted"], p[job_id(1)]["executed"]) == (2, 1)
    assert re.search(rf"job {short(1)}: attempt 1 failed, POST /prompt 500, 500 Internal Server Error; "
                     r"retry in 100 ms", log)
    assert f"job {short(1)}: done on cpu0 after 2 attempt(s), 1 file(s): job1_00001_.png" in log
    # drop: followed again without a second POST, done.
    assert jobs_by_n[2].state == "done" and jobs_by_n[2].attempt == 1
    assert (p[job_id(2)]["posted"], p[job_id(2)]["executed"]) == (1, 1)
    # invalid: dead at once, never executed.
    assert jobs_by_n[3].state == "dead" and jobs_by_n[3].attempt == 1
    assert jobs_by_n[3].reason.startswith("POST /prompt 400, prompt_outputs_failed_validation")
    assert p[job_id(3)]["executed"] == 0
    assert f"job {short(3)}: dead-lettered, POST /prompt 400, prompt_outputs_failed_validation" in log
    # oom: POST /free and posted again on the same server in the same attempt, done; executed twice
    # (the first run was destroyed by the OOM).
    assert jobs_by_n[4].state == "done" and jobs_by_n[4].attempt == 1
    assert p[job_id(4)]["executed"] == 2 and len(fake.stats()["frees"]) == 1
    # error: permanent, dead at once with node and exception.
    assert jobs_by_n[5].state == "dead" and jobs_by_n[5].attempt == 1
    assert re.match(r"execution_error, node \S+ \(\w+\): IndexError: ", jobs_by_n[5].reason)
    # hang: interrupted at the 1 s timeout, twice, then dead.
    assert jobs_by_n[6].state == "dead"
    assert jobs_by_n[6].reason == "gave up after 2 attempts, last: timed out after 1 s"
    interrupts = [i for i in fake.stats()["interrupts"] if i["prompt_id"] == job_id(6) and i["effective"]]
    assert len(interrupts) == 2 and p[job_id(6)]["executed"] == 2
    # the last one: done.
    assert jobs_by_n[7].state == "done"
    for n in (1, 2, 4, 7):
        assert [f.name for f in store_files(tmp_path, n)] == [f"job{n}_00001_.png"]
        assert jobs_by_n[n].outputs[0].sha256 and jobs_by_n[n].outputs[0].size > 0
    # A retry waits in the queue with its run_after, so the runner ran other jobs meanwhile.
    order = fake.stats()["order"]
    first_of_1 = [i for i, pid in enumerate(order) if pid == job_id(1)]
    assert first_of_1 and first_of_1[0] > order.index(job_id(2))


@pytest.mark.timeout(60)
def test_same_job_submitted_twice_and_delivered_twice_runs_once(tmp_path, fake):
    """A second submit inserts nothing; a second delivery adopts the first run."""
    fake.node_ms = 300
    config = write_config(tmp_path)
    jobs = jobs_file(tmp_path, [trivial_job(1)])
    assert "submitted 1 job(s), 0 already" in comfysup("submit", str(jobs), "--config", str(config)).stdout
    assert "submitted 0 job(s), 1 already" in comfysup("submit", str(jobs), "--config", str(config)).stdout
    queue = submit(config, [])
    cfg = config_of(config)
    store = ResultStore(tmp_path / "store", 1 << 30)
    first = queue.leases.claim("runner-a", "cpu0", lease_seconds=5)
    # A renews its lease less often than the job takes, so it cannot notice the second delivery early.
    slow_a = Station(dataclasses.replace(settings_from(cfg, "cpu0", fake.url, {}), heartbeat_seconds=30),
                     queue, store)
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("a", Attempt(slow_a, first).run().outcome))
    thread.start()
    # Wait until A's prompt runs on the server, then let its lease lapse and deliver the job again.
    deadline = time.monotonic() + 10
    while not prompts(fake).get(job_id(1), {}).get("executed") and time.monotonic() < deadline:
        time.sleep(0.01)
    # Deliver it again as if A's lease had run out (a clock 6 s ahead).
    second = queue.leases.claim("runner-b", "cpu0", lease_seconds=60, now=time.time() + 6)
    assert second is not None and second.attempt == 2
    outcome_b = Attempt(Station(settings_from(cfg, "cpu0", fake.url, {}), queue, store), second).run().outcome
    thread.join(15)
    assert outcome_b.state == "done"
    assert results["a"].state == "lost"
    assert prompts(fake)[job_id(1)]["posted"] == 1
    assert prompts(fake)[job_id(1)]["executed"] == 1
    assert queue.reads.get(job_id(1)).state == "done"


@pytest.mark.timeout(90)
def test_two_runners_two_servers_each_job_once(tmp_path, fake, fake_b):
    """16 jobs over two fakes: each executed exactly once, both servers used."""
    fake.node_ms = fake_b.node_ms = 20
    config = write_config(tmp_path)
    jobs = jobs_file(tmp_path, [trivial_job(i) for i in range(1, 17)])
    assert comfysup("submit", str(jobs), "--config", str(config)).returncode == 0
    out = comfysup("work", "--config", str(config), "--server", f"a={fake.url}", "--server", f"b={fake_b.url}",
                   "--until-empty")
    assert out.returncode == 0, out.stderr
    assert "summary: 16 done, 0 dead-lettered" in out.stderr
    a, b = prompts(fake), prompts(fake_b)
    for i in range(1, 17):
        executed = a.get(job_id(i), {}).get("executed", 0) + b.get(job_id(i), {}).get("executed", 0)
        assert executed == 1, job_id(i)
    assert a and b


@pytest.mark.timeout(60)
def test_runner_killed_after_comfyui_finished_is_adopted_not_rerun(tmp_path, fake):
    """The attempt that posted died before recording done; the next one adopts."""
    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1)])
    claim = queue.leases.claim("dead-runner", "cpu0", lease_seconds=30)
    client = ComfyClient(fake.url)
    number = client.post_prompt(claim.workflow, claim.id, "someone")
    queue.leases.record_prompt(claim, "cpu0", number)
    deadline = time.monotonic() + 10
    while client.history(claim.id) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    # The runner process died here (kill -9): the supervisor proves it and releases its claim.
    assert queue.leases.release_owner("dead-runner", "runner process died") == [claim.id]
    run_until_empty(config, fake)
    job = queue.reads.get(claim.id)
    assert job.state == "done" and job.attempt == 2
    assert prompts(fake)[claim.id]["posted"] == 1 and prompts(fake)[claim.id]["executed"] == 1
    assert [f.name for f in store_files(tmp_path, 1)] == ["job1_00001_.png"]


@pytest.mark.timeout(60)
def test_success_before_history_race(tmp_path, fake):
    """execution_success arrives long before the history is written."""
    fake.history_delay_ms = 800
    config = write_config(tmp_path, poll_seconds=5.0)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    run_until_empty(config, fake)
    for n in (1, 2):
        job = queue.reads.get(job_id(n))
        assert job.state == "done" and len(job.outputs) == 1
        assert store_files(tmp_path, n)[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert prompts(fake)[job_id(n)]["executed"] == 1


@pytest.mark.timeout(60)
def test_hostile_output_names(tmp_path, fake):
    """Names with ../ or absolute paths: nothing outside the job folder, dead, clear reason."""
    fake.script(["hostile"])
    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1)])
    before = {p for p in tmp_path.rglob("*")}
    run_until_empty(config, fake)
    job = queue.reads.get(job_id(1))
    assert job.state == "dead" and job.reason.startswith("unsafe output name")
    created = {p for p in tmp_path.rglob("*")} - before
    store, served = tmp_path / "store", tmp_path / "fake"
    allowed = (store, served)
    assert all(p in allowed or any(a in p.parents for a in allowed) or p.parent == tmp_path for p in created), \
        created
    assert store_files(tmp_path, 1) == []


@pytest.mark.timeout(90)
def test_canary_secret_appears_nowhere(tmp_path, fake):
    """A canary key in extra_data, failed on purpose, is in no log, reason or output."""
    canary = "sk-canary-" + "7f3a9c2e4b"
    fake.script_by_id({job_id(1): ["error"], job_id(2): ["invalid"], job_id(3): ["oom"] * 4})
    config = write_config(tmp_path)
    jobs = [trivial_job(n, extra_data={"api_key_comfy_org": canary}) for n in (1, 2, 3)]
    for job in jobs:  # also an input whose name says it is a key: ComfyUI ignores it, comfysup must mask it
        job["workflow"] = json.loads(json.dumps(job["workflow"]))
        job["workflow"]["2"]["inputs"]["api_key"] = canary
    path = jobs_file(tmp_path, jobs)
    outputs = [comfysup("submit", str(path), "--config", str(config))]
    outputs.append(comfysup("work", "--config", str(config), "--server", f"cpu0={fake.url}", "--until-empty"))
    for args in (["status"], ["status", "--json"], ["results"], ["results", "--csv", str(path)],
                 *[["show", job_id(n)] for n in (1, 2, 3)], ["show", "--json", "--workflow", job_id(1)]):
        outputs.append(comfysup(*args, "--config", str(config)))
    # The server did receive it (history keeps the prompt): the redaction is what keeps it out of the rest.
    received = requests.get(f"{fake.url}/history/{job_id(1)}", timeout=5).json()
    assert canary in json.dumps(received)
    for out in outputs:
        assert out.returncode in (0, 1), out.stderr
        assert canary not in out.stdout and canary not in out.stderr
    queue = submit(config, [])
    for n in (1, 2, 3):
        job = queue.reads.get(job_id(n))
        assert job.state == "dead"
        assert all(canary not in (a.reason or "") for a in job.attempts) and canary not in job.reason


@pytest.mark.timeout(60)
def test_busy_server_is_skipped(tmp_path, tmp_path_factory):
    """With --busy 2 on server A and B idle, the first job runs on B."""
    with FakeComfy(base_directory=tmp_path / "a", busy=2) as busy, \
            FakeComfy(base_directory=tmp_path / "b") as idle:
        config = write_config(tmp_path)
        jobs = jobs_file(tmp_path, [trivial_job(1)])
        comfysup("submit", str(jobs), "--config", str(config))
        out = comfysup("work", "--config", str(config), "--server", f"a={busy.url}", "--server", f"b={idle.url}",
                       "--until-empty")
        assert out.returncode == 0, out.stderr
        assert job_id(1) in prompts(idle) and job_id(1) not in prompts(busy)


@pytest.mark.timeout(60)
def test_heartbeat_that_finds_the_lease_lost_stops_without_writing(tmp_path, fake):
    """Another owner took the job; the attempt stops and writes nothing."""
    fake.node_ms = 400
    config = write_config(tmp_path, heartbeat_seconds=0.1)
    queue = submit(config, [trivial_job(1)])
    claim = queue.leases.claim("runner-a", "cpu0", lease_seconds=30)
    cfg = config_of(config)
    station = Station(settings_from(cfg, "cpu0", fake.url, {}), queue, ResultStore(tmp_path / "store", 1 << 30))
    # Steal the job: its lease expires (as seen from a clock 60 s ahead) and runner-b claims it.
    thief = queue.leases.claim("runner-b", "cpu0", lease_seconds=600, now=time.time() + 60)
    assert thief is not None and thief.attempt == 2
    outcome = Attempt(station, claim).run().outcome
    assert outcome.state == "lost"
    job = queue.reads.get(job_id(1))
    assert (job.state, job.owner, job.attempt, job.outputs) == ("running", "runner-b", 2, [])
    assert store_files(tmp_path, 1) == []
    with pytest.raises(LeaseLost):
        queue.leases.complete(claim, [])


@pytest.mark.timeout(60)
def test_cancel_interrupts_a_running_job(tmp_path, fake):
    """comfysup cancel on a running job: the runner interrupts it and records it cancelled, not dead."""
    fake.script(["hang"])
    config = write_config(tmp_path, heartbeat_seconds=0.1)
    queue = submit(config, [trivial_job(1)])
    runner = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True))
    thread = threading.Thread(target=runner.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not prompts(fake).get(job_id(1), {}).get("executed") and time.monotonic() < deadline:
        time.sleep(0.02)
    out = comfysup("cancel", job_id(1), "--config", str(config))
    assert out.stdout.strip() == f"{job_id(1)}: cancelling"
    thread.join(20)
    assert not thread.is_alive()
    job = queue.reads.get(job_id(1))
    assert job.state == "cancelled"
    assert any(i["prompt_id"] == job_id(1) and i["effective"] for i in fake.stats()["interrupts"])
    queue_now = requests.get(f"{fake.url}/queue", timeout=5).json()
    assert queue_now == {"queue_running": [], "queue_pending": []}
