"""A server whose GET /queue answers garbage: the runner claims no job for it and says so, once,
in its log, in `comfysup status`, in `health` and in /metrics — not silently never claiming — and goes back to work
once the server answers well again."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from supervisor_support import wait_for

import fake_comfy.routes
from comfysup.observability.metrics import Live
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, job_id, submit, trivial_job, work_until_empty, write_config


@pytest.mark.timeout(90)
def test_a_garbage_queue_is_said_everywhere_and_no_job_is_claimed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    garbage = {"on": True}
    answer = fake_comfy.routes.Routes.get_queue

    async def get_queue(self: Any, request: web.Request) -> web.StreamResponse:
        if garbage["on"]:
            return web.json_response({"queue_running": "not a list", "queue_pending": 7})
        return await answer(self, request)

    monkeypatch.setattr(fake_comfy.routes.Routes, "get_queue", get_queue)
    config = write_config(tmp_path, attempts=1)
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        queue = submit(config, [trivial_job(1)])
        with work_until_empty(tmp_path, config, fake.url) as proc:
            def said() -> dict[str, Any] | None:
                work = json.loads(comfysup("status", "--config", str(config), "--json").stdout)["work"]
                slots = (work or {}).get("slots") or []  # none until comfysup work wrote its state
                return slots[0] if slots and slots[0].get("problem") else None

            slot = wait_for(said, 30, "status to say why the server takes no job")
            assert slot["state"] == "out_of_service" and "GET /queue" in slot["problem"], slot
            assert "answers GET /queue with a body that cannot be read" in comfysup("status", "--config",
                                                                                    str(config)).stdout
            assert queue.reads.get(job_id(1)).state == "queued"  # nothing is claimed for a server nobody can read
            health = comfysup("health", "--config", str(config), "--json")
            assert health.returncode == 1 and "queue_running" in json.loads(health.stdout)["servers"][0]["problem"]
            garbage["on"] = False  # the server answers well again
            assert proc.wait(30) == 0
        text = (tmp_path / "work.log").read_text()
        assert queue.reads.get(job_id(1)).state == "done", text
        assert text.count("answers GET /queue with a body that cannot be read") == 1, text  # said once, not per look
        assert "its answers can be read again" in text
        queue.close()


def test_metrics_show_a_slot_whose_server_cannot_be_read() -> None:
    class Queue:
        pass

    now = time.time()
    state = {"state": "running", "pid": os.getpid(), "updated_at": now, "slots": [
        {"name": "gpu0", "device": "cuda:0", "state": "running", "problem": "its server answers GET /queue …",
         "out_of_service": "its server answers GET /queue …"},
        {"name": "gpu1", "device": "cuda:1", "state": "running"}]}
    live = Live(Queue(), lambda: state, list, None)  # type: ignore[arg-type]
    gauges = {m.name: m for m in live._slots(now)}
    samples = {s.labels["slot"]: s.value for s in gauges["comfysup_slot_server_malformed"].samples}
    assert samples == {"gpu0": 1.0, "gpu1": 0.0}
