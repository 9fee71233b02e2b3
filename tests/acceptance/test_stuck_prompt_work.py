"""Under ``comfysup work`` (servers that are not ours): a prompt that ignores /interrupt
takes its server out of service (no job goes to it), ``status`` and ``health`` say why, the job ends with
a reason that says so, and the server comes back into service once its queue is empty again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from supervisor_support import wait_for

from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, config_of, job_id, submit, trivial_job, work_until_empty, write_config

STUCK = "hostile:run:ignore-interrupt"




@pytest.mark.timeout(90)
def test_a_stuck_prompt_takes_its_server_out_of_service_until_its_queue_is_empty(tmp_path: Path) -> None:
    victim = job_id(0)
    config = write_config(tmp_path, attempts=1, timeout_seconds=1.5, leave_queue_seconds=1.0)
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        fake.script_by_id({victim: [STUCK]})
        queue = submit(config, [trivial_job(0, priority=1), trivial_job(1)])  # the stuck one first
        with work_until_empty(tmp_path, config, fake.url) as proc:
            dead = wait_for(lambda: (j := queue.reads.get(victim)) and j.state == "dead" and j, 30,
                            "the stuck job to end")
            assert dead.reason == ("gave up after 1 attempts, last: the prompt did not leave a's queue within 1 s of "
                                   "/interrupt; a is out of service until its queue is empty (its server is not "
                                   "comfysup's to restart)")
            assert dead.attempts[0].kind == "stuck"
            time.sleep(1.0)
            assert queue.reads.get(job_id(1)).state == "queued", "no job goes to a server that holds a stuck prompt"
            reason = f"out of service: prompt {victim} stuck after /interrupt"
            status = json.loads(comfysup("status", "--config", str(config), "--json").stdout)
            assert status["work"]["slots"][0]["state"] == "out_of_service"
            assert status["work"]["slots"][0]["reason"] == reason
            assert reason in comfysup("status", "--config", str(config)).stdout
            health = comfysup("health", "--config", str(config), "--json")
            assert health.returncode == 1, health.stdout
            assert json.loads(health.stdout)["servers"][0]["problem"] == reason

            fake.restart()  # whoever owns the server restarts it: its queue is empty again
            assert proc.wait(30) == 0
        text = (tmp_path / "work.log").read_text()
        assert queue.reads.get(job_id(1)).state == "done", text
        assert "a: back in service: its queue is empty again" in text
        state = json.loads((config_of(config).resolve(config_of(config).queue.path).parent / "work.json").read_text())
        assert state["state"] == "stopped"
        queue.close()
