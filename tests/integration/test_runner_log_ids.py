"""Log lines name whole job ids (ids that share their first 8 characters are common:
``11111111-…``), the hand-off's POST is tagged with the job it posts (not the one being downloaded), and a
dropped WebSocket and its reconnection are logged (event ``reconnected``) and kept in the attempt's trace,
which ``comfysup show`` prints."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from comfysup import logs
from comfysup.commands.show import timeline
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike

IDS = [f"11111111-0000-4000-8000-00000000000{n}" for n in range(1, 5)]


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """comfysup's JSON log lines, as ``--log-format json`` writes them, into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs._Redact())
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("comfysup")
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not .level =: it clears the loggers' cached isEnabledFor answers
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("queue_ahead", "early"), [(False, "while job"), (True, "queued behind job")])
def test_log_lines_name_whole_ids_and_the_job_they_concern(tmp_path: Path, json_log: io.StringIO, queue_ahead: bool,
                                                           early: str) -> None:
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=30) as fake:
        fake.script_by_id({IDS[2]: ["drop"]})  # its WebSocket drops mid-run; the run goes on
        config = write_config(tmp_path, queue_ahead=queue_ahead)  # an early post: at the hand-off, or queued ahead
        queue = submit(config, [trivial_job(n) | {"id": i} for n, i in enumerate(IDS)])
        Runner(config_of(config), "a", fake.url, RunnerOptions(until_empty=True)).run()
        assert [queue.reads.get(i).state for i in IDS] == ["done"] * 4
        events = [json.loads(line) for line in json_log.getvalue().splitlines()]

        posted = [e for e in events if e["event"] == "posted"]
        assert len(posted) == 4 and any(early in e["message"] for e in posted), posted
        for e in posted:
            assert e["message"].startswith(f"job {e['job']} attempt 1 on a: POST /prompt 200"), e
        done = [e for e in events if e["event"] == "done"]
        assert sorted(e["job"] for e in done) == IDS
        for e in done:
            assert e["message"].startswith(f"job {e['job']}: done on a"), e
        for e in events:  # no line names a job by a cut id
            assert not re.search(r"job 11111111(?!-0000-4000-8000-00000000000\d)", e["message"]), e

        if queue_ahead:
            # The drop at job 3's first node is read by whichever attempt reads the shared socket then (job 2's
            # attempt may still be reading it: job 3 was queued behind it), so only the hand-off's case below.
            queue.close()
            return
        reconnected = [e for e in events if e["event"] == "reconnected"]
        assert [e["job"] for e in reconnected] == [IDS[2]], events
        assert "WebSocket dropped" in reconnected[0]["message"] and IDS[2] in reconnected[0]["message"]
        trace = queue.reads.get(IDS[2]).attempts[-1].trace
        assert len(trace["reconnects"]) == 1 and trace["reconnects"][0][1] is True
        assert any("WebSocket dropped: reconnected with the same client id" in line for line in timeline(trace))
        assert "reconnects" not in queue.reads.get(IDS[1]).attempts[-1].trace
        queue.close()
