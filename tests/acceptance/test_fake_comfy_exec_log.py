"""fake_comfy's ``--exec-log``: what every server process executed, kept in a file that outlives it.

/fake/stats dies with its process, so a test that kills servers and lets the supervisor restart them
(tests/chaos) could not see what ran before a kill. The log is the record it reads instead: one JSON
line per server start, answered post, execution start and end, with the pid and port of the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from port_support import server_port

from fake_comfy import FakeComfy

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = json.loads((REPO / "examples" / "workflows" / "trivial.json").read_text())


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def free_port() -> int:
    """A port for a server started (or restarted) on it later, which no connection can take (port_support)."""
    return server_port()


def post(url: str, prompt_id: str, colour: int) -> None:
    prompt = json.loads(json.dumps(TRIVIAL))
    prompt["1"]["inputs"]["color"] = colour
    requests.post(f"{url}/prompt", json={"prompt": prompt, "prompt_id": prompt_id}, timeout=5)


def wait(condition: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def start(base: Path, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(REPO / "fake_comfy" / "main.py"), "--port", str(port),
                             "--base-directory", str(base), "--exec-log", str(log), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        assert proc.poll() is None, f"the fake exited with {proc.returncode}"
        try:
            return requests.get(f"http://127.0.0.1:{port}/system_stats", timeout=1).ok
        except requests.RequestException:
            return False

    wait(answers, 20, "the fake to answer")
    return proc


@pytest.mark.timeout(60)
def test_the_exec_log_keeps_what_a_killed_server_ran_and_what_its_successor_runs(tmp_path: Path) -> None:
    log = tmp_path / "exec.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    script = tmp_path / "script.json"
    script.write_text(json.dumps({first: ["slow"]}))
    proc = start(tmp_path / "a", port, log, "--node-ms", "200", "--script-file", str(script))
    try:
        post(url, first, 1)
        wait(lambda: any(e["event"] == "start" for e in read_log(log)), 10, "the execution to start")
        os.kill(proc.pid, signal.SIGKILL)  # mid-prompt: the start line stays without an end line
        proc.wait(10)
        killed = proc.pid
        proc = start(tmp_path / "b", port, log, "--node-ms", "5")
        post(url, second, 2)
        wait(lambda: any(e["event"] == "end" for e in read_log(log)), 10, "the second execution to end")
    finally:
        proc.kill()
        proc.wait(10)

    events = read_log(log)
    servers = [e for e in events if e["event"] == "server"]
    assert [s["pid"] for s in servers] == [killed, proc.pid] and {s["port"] for s in servers} == {port}
    runs = [e for e in events if e["event"] in ("start", "end")]
    assert [(e["event"], e["prompt_id"], e["pid"]) for e in runs] == [
        ("start", first, killed), ("start", second, proc.pid), ("end", second, proc.pid)]
    assert runs[2]["outcome"] == "success" and runs[2]["started_at"] <= runs[2]["ended_at"]
    posts = [(e["prompt_id"], e["status"], e["word"]) for e in events if e["event"] == "post"]
    assert posts == [(first, 200, "slow"), (second, 200, "ok")]


def test_in_process_fakes_log_too_and_without_the_option_nothing_is_written(tmp_path: Path) -> None:
    log = tmp_path / "exec.jsonl"
    with FakeComfy(base_directory=tmp_path / "with", exec_log=log) as fake:
        fake.script(["500", "oom"])
        for n in range(3):
            post(fake.url, f"p{n}", n)
        wait(lambda: sum(e["event"] == "end" for e in read_log(log)) == 2, 10, "two executions to end")
    ends = [(e["prompt_id"], e["outcome"], e["word"]) for e in read_log(log) if e["event"] == "end"]
    assert ends == [("p1", "error", "oom"), ("p2", "success", "ok")]
    assert [e["status"] for e in read_log(log) if e["event"] == "post"] == [500, 200, 200]
    with FakeComfy(base_directory=tmp_path / "without") as fake:
        post(fake.url, "q", 1)
        wait(lambda: fake.stats()["prompts"].get("q", {}).get("executed"), 10, "the execution")
    assert not list(tmp_path.glob("without/**/*.jsonl"))
