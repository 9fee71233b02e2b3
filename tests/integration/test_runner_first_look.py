"""Before the first POST of a job, its id is looked up in the server's /queue and
/history. A fresh queue in front of a server that already ran some of its ids (a queue restored from a
backup, a second installation on the same server) adopts those runs or follows them; nothing runs twice.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from comfysup.comfy import ComfyClient
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, post_and_wait, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


def _run(folder: Path, url: str, jobs: list[int], **runner: object):
    folder.mkdir()
    config = write_config(folder, **runner)
    queue = submit(config, [trivial_job(n) for n in jobs])
    Runner(config_of(config), "a", url, RunnerOptions(until_empty=True)).run()
    return queue


def _phases(job) -> list[str]:
    return [p[0] for p in (job.attempts[-1].trace or {}).get("phases", [])]


@pytest.mark.timeout(60)
def test_a_second_queue_in_front_of_a_server_that_ran_its_ids_adopts_them_all(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=20) as fake:
        first = _run(tmp_path / "first", fake.url, [1, 2, 3])
        first.close()
        # Runs of new ids between the old ones: each old id comes after a run that ended on this server's own
        # socket with its queue empty, so it is met by the hand-off as well as by an attempt's own look.
        second = _run(tmp_path / "second", fake.url, [10, 1, 11, 2, 12, 3])
        prompts = fake.stats()["prompts"]
        for n in (10, 1, 11, 2, 12, 3):
            job = second.reads.get(trivial_job(n)["id"])
            assert job.state == "done" and job.attempt == 1 and len(job.outputs) == 1, job
            assert prompts[job.id]["posted"] == 1 and prompts[job.id]["executed"] == 1, (n, prompts[job.id])
            assert ("adopted" in _phases(job)) == (n < 10), (n, _phases(job))
        second.close()


@pytest.mark.timeout(60)
def test_a_prompt_of_the_id_queued_by_another_client_is_followed_not_posted_again(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=400) as fake:
        job = trivial_job(5)
        ComfyClient(fake.url).post_prompt(job["workflow"], job["id"], "another-installation")
        # max_queue 2: the runner claims while the other client's prompt is still queued or running.
        queue = _run(tmp_path / "q", fake.url, [5], max_queue=2)
        record = queue.reads.get(job["id"])
        assert record.state == "done" and record.attempt == 1, record
        stats = fake.stats()["prompts"][job["id"]]
        assert stats["posted"] == 1 and stats["executed"] == 1, stats
        assert "followed" in _phases(record)
        queue.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("queue_ahead", [False, True])
def test_another_clients_post_between_two_of_ours_makes_the_runner_look_again(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch,
                                                                             queue_ahead: bool) -> None:
    """The runner asks nothing per job while its server is its own (each POST's number follows the one before).
    Another client that posts in between (here: job 3's id, run to its end before job 2 is posted) skips a
    number: from then on each id is looked up again before its POST, and job 3 is adopted, not run twice."""
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=20) as fake:
        third = trivial_job(3)
        post = ComfyClient.post_prompt

        def post_after_the_other(self: ComfyClient, workflow, prompt_id: str, *args, **kwargs):
            if prompt_id == trivial_job(2)["id"] and third["id"] not in fake.stats()["prompts"]:
                # Its run ends (its history written first) before job 2 is posted.
                post_and_wait(fake.url, third["workflow"], third["id"], "another-installation")
            return post(self, workflow, prompt_id, *args, **kwargs)

        monkeypatch.setattr(ComfyClient, "post_prompt", post_after_the_other)
        queue = _run(tmp_path / "q", fake.url, [1, 2, 3, 4], queue_ahead=queue_ahead)
        prompts = fake.stats()["prompts"]
        for n in (1, 2, 3, 4):
            job = queue.reads.get(trivial_job(n)["id"])
            assert job.state == "done" and job.attempt == 1, job
            assert prompts[job.id]["executed"] == 1, (n, prompts[job.id])  # job 3: the other client's run alone
            assert ("adopted" in _phases(job)) == (n == 3), (n, _phases(job))
        queue.close()



def _wait_done(queue, job_id: str, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if queue.reads.get(job_id).state in ("done", "dead"):
            return
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not end")


@pytest.mark.timeout(60)
def test_after_a_pause_a_job_is_looked_up_again_and_another_clients_run_of_it_adopted(tmp_path: Path) -> None:
    """Another client's post shows only in the number of the runner's next one. A runner that posted nothing for a
    while (here: idle between two submits) cannot tell that none came meanwhile, and looks each job up first: the
    other client's run of job 3's id, made while the runner waited, is adopted."""
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=20) as fake:
        folder = tmp_path / "q"
        folder.mkdir()
        config = write_config(folder)
        queue = submit(config, [trivial_job(1), trivial_job(2)])
        runner = Runner(config_of(config), "a", fake.url)
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        try:
            for n in (1, 2):
                _wait_done(queue, trivial_job(n)["id"])
            assert runner.station.client.known.state == "known"
            third = trivial_job(3)
            post_and_wait(fake.url, third["workflow"], third["id"], "another-installation")
            runner.station.client.known.since -= 10  # the pause: more than TRUST_SECONDS since its last post
            submit(config, [third]).close()
            _wait_done(queue, third["id"])
        finally:
            runner.state.stopping = True
            thread.join(20)
        record = queue.reads.get(third["id"])
        assert record.state == "done" and "adopted" in _phases(record), _phases(record)
        assert fake.stats()["prompts"][third["id"]]["executed"] == 1  # the other client's run alone
        queue.close()
