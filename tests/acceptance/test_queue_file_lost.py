"""Every process that holds the SQLite queue open watches its file. Deleted, replaced or failing
its integrity check, the process stops taking and accepting work within a heartbeat, says why in one line and
exits non-zero (EXIT_DATABASE_REPLACED), and ``comfysup run`` stops with that reason instead of logging an error
forever or restarting a child in a loop. Each test runs the real command in a subprocess."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import requests
from supervisor_support import Supervised, gone, job, wait_for

from comfysup.supervisor.lock import EXIT_DATABASE_REPLACED
from fake_comfy import FakeComfy
from tests.api_support import api_config
from tests.runner_helpers import ROOT, submit, trivial_job, write_config

GRAPH = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())


def _popen(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "comfysup", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def _lines(text: str, words: str) -> list[str]:
    return [line for line in text.splitlines() if words in line]


@pytest.mark.timeout(40)
def test_a_queue_file_deleted_under_comfysup_api_is_refused_then_the_api_exits(tmp_path: Path) -> None:
    config = api_config(tmp_path)
    log = tmp_path / "api.log"
    proc = _popen(["api", "--config", str(tmp_path / "config.toml")], log, tmp_path)
    try:
        url = wait_for(lambda: (m := re.search(r"Comfy API v2 on (http://\S+)/api/v2", log.read_text())) and m[1],
                       20, "the API to listen", log.read_text)
        first = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, timeout=10)
        assert first.status_code == 201, first.text
        assert httpx.get(f"{url}/api/v2/health", timeout=10).status_code == 200
        path = config.resolve(config.queue.path)
        path.unlink()
        posted = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH}, timeout=10)
        assert posted.status_code == 503, posted.text  # never a 201 for a job that would land nowhere
        assert f"{path} was deleted while open" in posted.json()["error"]["message"]
        health = httpx.get(f"{url}/api/v2/health", timeout=10)
        assert health.status_code == 503 and f"{path} was deleted" in health.json()["reason"], health.text
        assert proc.wait(15) == EXIT_DATABASE_REPLACED, log.read_text()
    finally:
        _stop(proc)
    text = log.read_text()
    assert len(_lines(text, "was deleted while open")) == 1, text  # said once, in one line
    assert "Traceback" not in text, text


@pytest.mark.timeout(60)
def test_a_queue_file_deleted_under_comfysup_work_stops_it_and_its_runners_claim_nothing_after(
        tmp_path: Path) -> None:
    config = write_config(tmp_path, heartbeat_seconds=0.5, grace_seconds=2.0)
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=150) as fake:
        submit(config, [trivial_job(n) for n in range(1, 41)]).close()
        log = tmp_path / "work.log"
        proc = _popen(["work", "--config", str(config), "--server", f"a={fake.url}"], log, ROOT)
        try:
            def executed() -> int:
                return len(requests.get(f"{fake.url}/fake/stats", timeout=5).json()["order"])

            wait_for(lambda: executed() >= 2, 30, "two jobs to run", log.read_text)
            (tmp_path / "queue.db").unlink()
            at_delete = executed()
            assert proc.wait(20) == EXIT_DATABASE_REPLACED, log.read_text()
            # The prompt running at the deletion (and one queued behind it) may end; no job is claimed after.
            assert executed() <= at_delete + 2, (at_delete, executed(), log.read_text())
        finally:
            _stop(proc)
    text = log.read_text()
    reason = f"{tmp_path / 'queue.db'} was deleted while open"
    assert len(_lines(text, reason)) == 1, text  # the runners stop quietly; `work` says why once
    assert "Traceback" not in text, text


def _corrupt(path: Path, how: str) -> None:
    with sqlite3.connect(path) as conn:  # every page in the file itself, so a cut loses some
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    if how == "header":
        with path.open("r+b") as f:
            f.write(b"this is not a database any more" * 3)
    else:
        size = path.stat().st_size
        os.truncate(path, size // 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["header", "truncated"])
def test_a_queue_file_corrupted_under_comfysup_run_stops_it_once_with_the_reason(harness: list[Supervised],
                                                                                 tmp_path: Path, how: str) -> None:
    h = Supervised(tmp_path)
    harness.append(h)
    ids = h.submit([job(n) for n in range(4)])
    proc = h.start()
    state = h.wait_ready(proc)
    h.wait_terminal(ids)  # the file then changes only every few seconds (the machine's heartbeat)
    path = h.config.resolve(h.config.queue.path)
    _corrupt(path, how)
    assert proc.wait(20) == EXIT_DATABASE_REPLACED, h.describe()
    log = h.log()
    said = [line for line in _lines(log, "fails its integrity check") if "the queue does not answer" not in line]
    waited = _lines(log, "the queue does not answer")  # a runner that met the file first waits, claiming nothing
    assert len(_lines(log, "Stopping now (exit code 75)")) == 1, log[-4000:]  # the supervisor says why once
    assert 1 <= len(said) <= 2, log[-4000:]  # and its monitor, if it saw the file first: once each, not forever
    assert len(waited) <= len(state["slots"]), log[-4000:]  # each runner once at most
    for slot in state["slots"]:
        assert gone(slot["pid"]) and gone(slot["runner_pid"]), "the servers and runners stopped with it"

