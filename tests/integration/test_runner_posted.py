"""One set of counts. A job queued ahead ([runner] queue_ahead) waits in ComfyUI's queue behind the
running prompt: status, status --json, show, the page, /metrics and the queue's position say posted, not running,
until its execution starts; then its wait in ComfyUI's queue and its run are two figures (results, show, the
histograms), the wait timed from the fake's own clock of its POST and its start.

Each test takes about 2 s for each ComfyUI version: two prompts of 0.75 s, long enough to see each state through
the CLI."""

from __future__ import annotations

import csv
import io
import re
import threading
from pathlib import Path

import pytest

from comfysup.observability.metrics import Metrics
from comfysup.observability.views import overview
from comfysup.observability.web import render_page
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from comfysup.runner.trace import phase_durations
from fake_comfy import FakeComfy
from tests.cli_support import cli
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config
from tests.supervisor_support import wait_for

pytestmark = pytest.mark.usefixtures("comfyui_version")


def _status(capsys: pytest.CaptureFixture[str], config: Path) -> str:
    code, out, _ = cli(capsys, "status", "--config", str(config))
    assert code == 0
    return out


def _status_with(capsys: pytest.CaptureFixture[str], config: Path, counts: str) -> str | None:
    out = _status(capsys, config)
    return out if counts in out else None


@pytest.mark.timeout(60)
def test_a_job_queued_ahead_is_posted_until_it_executes_and_its_wait_is_not_its_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeComfy(base_directory=tmp_path / "fake", node_ms=250)  # three nodes: 0.75 s a prompt
    fake.start()
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    metrics = Metrics(queue, state=lambda: None)
    thread = threading.Thread(target=Runner(config_of(config), "cpu0", fake.url,
                                            RunnerOptions(until_empty=True)).run, daemon=True)
    thread.start()
    try:
        # Job 1 executes; job 2 waits in the server's queue behind it: one running on one server, one posted.
        out = wait_for(lambda: _status_with(capsys, config, "posted 1 · running 1 ·"), 10,
                       "job 2 to be posted behind job 1", lambda: _status(capsys, config))
        running = out[out.index("running job"):]
        posted = out[out.index("posted job"):]
        assert job_id(1) in running.split("posted job")[0] and job_id(2) in posted
        code, out, _ = cli(capsys, "status", "--config", str(config), "--json")
        assert code == 0 and '"posted": 1' in out
        code, out, _ = cli(capsys, "show", "--config", str(config), job_id(2)[:10])  # a prefix, as a person types
        assert code == 0 and out.startswith(f"job {job_id(2)}: posted (waiting in cpu0's queue"), out
        assert queue.reads.queue_position(job_id(2)) == 1 and queue.reads.queue_position(job_id(1)) is None
        assert 'comfysup_jobs{state="posted"} 1.0' in metrics.exposition().decode()
        assert "<b>1</b> posted" in render_page(overview(queue, None), 5)
        # Job 1 is done and job 2 executes: running, no longer posted (said by job 1's own end).
        wait_for(lambda: _status_with(capsys, config, "posted 0 · running 1 · storing 0 · done 1"), 10,
                 "job 2 to run once job 1 is done", lambda: _status(capsys, config))
        thread.join(30)
        assert not thread.is_alive()
    finally:
        fake.stop()
    record = fake.stats()["prompts"][job_id(2)]
    post, start = record["posts"][0]["at"], record["executions"][0]["started_at"]
    assert start - post > 0.5  # it did wait behind job 1
    trace = queue.reads.get(job_id(2)).attempts[-1].trace
    phases = {name: (at, seconds) for name, at, seconds in phase_durations(trace)}
    assert abs(phases["executing"][0] - start) < 0.25  # timed as read, not when job 1's attempt handed it on
    code, out, _ = cli(capsys, "results", "--config", str(config), "--csv")
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(out))}
    wait, run = float(rows[job_id(2)]["comfyui_wait_s"]), float(rows[job_id(2)]["attempt_run_s"])
    assert abs(wait - (start - post)) < 0.25
    assert run < record["executions"][0]["ended_at"] - start + 1.0  # its execution and what followed, not its wait
    assert float(rows[job_id(1)]["comfyui_wait_s"]) < 0.25  # posted to a free server
    code, out, _ = cli(capsys, "show", "--config", str(config), job_id(2))
    assert code == 0 and "in ComfyUI's queue, ran" in out and out.startswith(f"job {job_id(2)}: done")
    text = metrics.exposition().decode()
    # Job 1 was posted to a free server, job 2 waited about a prompt's time: one wait under 0.5 s, both under 5 s.
    assert 'comfysup_attempt_comfyui_wait_seconds_bucket{le="0.5",workflow="inline"} 1.0' in text, text
    assert 'comfysup_attempt_comfyui_wait_seconds_bucket{le="5.0",workflow="inline"} 2.0' in text
    assert 'comfysup_attempt_run_seconds_count{outcome="done",workflow="inline"} 2.0' in text
    assert 'comfysup_jobs{state="posted"} 0.0' in text and 'comfysup_jobs{state="done"} 2.0' in text
    # Job 2 was claimed as job 1 started: its wait behind job 1 is its queueing, not its duration.
    queued = float(re.search(r'comfysup_job_queue_wait_seconds_sum\{workflow="inline"\} (\S+)', text)[1])
    assert queued > start - post - 0.25
    queue.close()


@pytest.mark.timeout(60)
def test_a_job_claimed_ahead_but_left_to_its_own_attempt_waits_as_posted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job on its second attempt is claimed ahead but not posted (its own attempt looks for an earlier run first):
    it waits for the server all the same, so it is posted, not running, until its attempt posts it."""
    fake = FakeComfy(base_directory=tmp_path / "fake", node_ms=250)
    fake.start()
    config = write_config(tmp_path, queue_ahead=True)
    queue = submit(config, [trivial_job(1)])
    # job 1, back to the queue counted: its attempt 2 is next
    first = queue.leases.claim("elsewhere/1/gpu0/t", "gpu0", 60)
    assert first is not None
    queue.leases.release(first, "its runner died")
    queue.close()
    queue = submit(config, [trivial_job(2, priority=5)])  # runs first: job 1 is the one claimed ahead
    thread = threading.Thread(target=Runner(config_of(config), "cpu0", fake.url,
                                            RunnerOptions(until_empty=True)).run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: _status_with(capsys, config, "posted 1 · running 1 ·"), 10,
                 "job 1 to wait as posted behind job 2", lambda: _status(capsys, config))
        assert fake.stats()["prompts"].get(job_id(1), {}).get("posted", 0) == 0  # claimed, not posted
        thread.join(30)
        assert not thread.is_alive()
    finally:
        fake.stop()
    assert [queue.reads.get(job_id(n)).shown_state for n in (1, 2)] == ["done", "done"]
    assert fake.stats()["order"] == [job_id(2), job_id(1)]
    queue.close()
