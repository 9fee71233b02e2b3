"""Against a misbehaving ComfyUI (fake_comfy's hostile mode): whatever it answers, the runner lives
on, the job ends in a recorded state with a readable reason, and its attempts stay within the limit.

The runner runs in the test's main thread, as in its own process, so the deadlines' alarm is the real one.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import TRIVIAL, config_of, job_id, submit, trivial_job, write_config
from tests.supervisor_support import wait_for

TERMINAL = ("done", "dead", "cancelled")

# One or more of every place a client reads, and every kind of damage (fake_comfy --hostile-list has all 302).
MUTATIONS = [
    "history:@=str", "history:@.status=str", "history:@.status.messages.*=object", "history:@.outputs=list",
    "history:@.outputs.*.images.*.filename=list", "history:@.prompt=number", "history:deep", "history:truncated",
    "history:not-json", "history:numbers=infinity", "history:numbers=huge", "history:huge-list",
    "queue:$=str", "queue:queue_pending.*=object", "queue:deep",
    "post:$=str", "post:number=str", "post:not-json", "post:cut",
    "ws:data=list", "ws:data.node=object", "ws:not-json", "ws:numbers=infinity", "ws:deep", "ws:binary-noise",
    "ws:unknown-type", "names:crlf", "names:traversal", "names:absolute", "names:type-path", "run:store-temp-name",
    "view:truncated", "view:not-an-image",
]


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=2, hostile_trickle_s=0.5, hostile_cap_s=30)
    server.start()
    yield server
    server.stop()


def run_all(config_path: Path, fake: FakeComfy) -> Runner:
    runner = Runner(config_of(config_path), "cpu0", fake.url, RunnerOptions(until_empty=True))
    runner.run()
    return runner


@pytest.mark.timeout(240)
def test_every_mutation_ends_in_a_recorded_state_and_the_runner_lives_on(
        tmp_path: Path, fake: FakeComfy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    fake.script_by_id({job_id(i): [f"hostile:{m}", f"hostile:{m}"] for i, m in enumerate(MUTATIONS, 1)})
    config = write_config(tmp_path, attempts=2, timeout_seconds=6.0, http_timeout_seconds=2.0)
    jobs = [trivial_job(i) for i in range(1, len(MUTATIONS) + 2)]  # and one plain job after them all
    queue = submit(config, jobs)
    # A run watched whole on the socket needs no /history (its outputs come in its executed messages): the history
    # mutations meet the runner where it must read the entry, a run of the job's id that the server already holds
    # (another installation's, a restored backup's), which the first look before the POST adopts.
    for i, mutation in enumerate(MUTATIONS, 1):
        if mutation.startswith("history:"):
            workflow = copy.deepcopy(TRIVIAL)
            workflow["1"]["inputs"]["color"], workflow["3"]["inputs"]["filename_prefix"] = i, f"job{i}"
            requests.post(f"{fake.url}/prompt", json={"prompt": workflow, "prompt_id": job_id(i)}, timeout=10)
    wait_for(lambda: requests.get(f"{fake.url}/queue", timeout=10).json() == {"queue_running": [], "queue_pending": []},
             30, "the prompts run outside comfysup to end")
    run_all(config, fake)
    records = {j.id: j for j in queue.reads.get_many([j["id"] for j in jobs])}
    problems = []
    for i, mutation in enumerate(MUTATIONS, 1):
        job = records[job_id(i)]
        if job.state not in TERMINAL:
            problems.append(f"{mutation}: {job.state}")
        if job.attempt > 2:
            problems.append(f"{mutation}: {job.attempt} attempts against a limit of 2")
        if job.state == "dead" and not job.reason:
            problems.append(f"{mutation}: dead without a reason")
        hit = fake.stats()["prompts"].get(job.id, {}).get("hostile")
        if hit is None:
            problems.append(f"{mutation}: the fake never applied it")
    assert problems == []
    assert records[job_id(len(MUTATIONS) + 1)].state == "done"  # the server still serves after all of it
    assert not [r for r in caplog.records if r.exc_info and "internal error" in r.getMessage()], \
        "a mutation reached code that did not expect it"
    # A history entry of the wrong shape is all there is of that earlier run: both attempts fail on it, readably,
    # and neither posts the job again.
    wrong_history = [records[job_id(i)] for i, m in enumerate(MUTATIONS, 1) if m.startswith("history:@")]
    assert all(j.state == "dead" and "server sent a malformed /history entry" in (j.reason or "")
               for j in wrong_history), [(j.id, j.state, j.reason) for j in wrong_history]
    assert all(fake.stats()["prompts"][j.id]["posted"] == 1 for j in wrong_history)  # the outside post alone
    # A garbled WebSocket message fails its attempt; the next one adopts the finished run from /history.
    wrong_socket = [records[job_id(i)] for i, m in enumerate(MUTATIONS, 1) if m.startswith("ws:data")]
    assert all("server sent a malformed WebSocket message" in (j.attempts[0].reason or "") for j in wrong_socket), \
        [(j.id, [a.reason for a in j.attempts]) for j in wrong_socket]
    crlf = records[job_id(MUTATIONS.index("names:crlf") + 1)]
    assert crlf.state == "dead" and "unsafe output name" in (crlf.reason or "")
    # An output item of a type that is a path fails the job with the reason; it is never done without its file.
    typed = records[job_id(MUTATIONS.index("names:type-path") + 1)]
    assert typed.state == "dead" and "output item of type '../../etc'" in (typed.reason or ""), typed.reason
    # A history that names the store's temporary name of another output: refused, so no recorded file is lost.
    temp = records[job_id(MUTATIONS.index("run:store-temp-name") + 1)]
    assert temp.state == "dead" and "the result store's own temporary name" in (temp.reason or ""), temp.reason
    # Whatever the server said, every file a done job records exists with the hash recorded.
    for job in records.values():
        for out in job.outputs if job.state == "done" else ():
            assert hashlib.sha256(Path(out.path).read_bytes()).hexdigest() == out.sha256, (job.id, out)


@pytest.mark.timeout(60)
def test_a_trickling_download_is_bounded_by_the_jobs_timeout(tmp_path: Path, fake: FakeComfy) -> None:
    fake.script_by_id({job_id(1): ["hostile:view:trickle"]})
    config = write_config(tmp_path, attempts=1, timeout_seconds=3.0, http_timeout_seconds=2.0)
    queue = submit(config, [trivial_job(1)])
    start = time.monotonic()
    run_all(config, fake)
    took = time.monotonic() - start
    job = queue.reads.get(job_id(1))
    assert job.state == "dead" and "timed out after 3 s (while downloading" in (job.reason or ""), job.reason
    assert took < 3 + 2 + 2, f"the attempt took {took:.1f} s against a timeout of 3 s"


@pytest.mark.timeout(60)
def test_an_endless_history_answer_is_bounded_by_the_calls_timeout(tmp_path: Path, fake: FakeComfy) -> None:
    fake.script_by_id({job_id(1): ["hostile:history:endless"]})
    config = write_config(tmp_path, attempts=1, timeout_seconds=10.0, http_timeout_seconds=1.0)
    queue = submit(config, [trivial_job(1)])
    start = time.monotonic()
    run_all(config, fake)
    job = queue.reads.get(job_id(1))
    assert job.state in TERMINAL and time.monotonic() - start < 10 + 3, job.reason


@pytest.mark.timeout(60)
def test_sigterm_during_a_trickling_download_is_honoured_within_its_grace(tmp_path: Path, fake: FakeComfy) -> None:
    """The stop asked for while a read blocks: the attempt gives the job back uncounted once the grace ends,
    not when the download would."""
    import os
    import signal

    fake.script_by_id({job_id(1): ["hostile:view:trickle"]})
    config = write_config(tmp_path, attempts=2, timeout_seconds=60.0, grace_seconds=1.0)
    queue = submit(config, [trivial_job(1)])
    runner = Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True))
    runner.install_signals()

    stopped_at: list[float] = []
    previous = signal.getsignal(signal.SIGTERM)
    try:
        # The trickle sends a byte every 0.5 s: 1.5 s after the start the runner is inside the download.
        threading.Timer(1.5, lambda: (stopped_at.append(time.monotonic()), os.kill(os.getpid(), signal.SIGTERM))
                        ).start()
        runner.run()
        ended = time.monotonic()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert stopped_at and ended - stopped_at[0] < 1.0 + 1.0 + 1.0, f"{ended - stopped_at[0]:.1f} s after SIGTERM"
    job = queue.reads.get(job_id(1))
    assert (job.state == "queued" and job.attempt == 0) or job.state == "queued", (job.state, job.attempt, job.reason)


@pytest.mark.timeout(60)
def test_a_job_folder_replaced_by_a_symlink_is_dead_lettered_and_nothing_outside_is_touched(
        tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path, attempts=2)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0")
    store = config_of(config).resolve(config_of(config).store.dir)
    store.mkdir(parents=True)
    (store / job_id(1)).symlink_to(outside)  # <store>/<id> -> /etc, as the issue found it followed
    run_all(config, fake)
    job = queue.reads.get(job_id(1))
    assert job.state == "dead" and "is a symlink" in (job.reason or ""), job.reason
    assert sorted(p.name for p in outside.iterdir()) == ["passwd"]
    assert (outside / "passwd").read_text() == "root:x:0:0"
    assert queue.reads.get(job_id(2)).state == "done"  # the runner carries on
