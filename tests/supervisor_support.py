"""What the supervisor's acceptance tests share: ``comfysup run`` as a subprocess on ``gpus = "cpu:2"``,
with fake_comfy launched through the same path as ComfyUI (``[comfyui] main``), and bounded waits.

Settings are short (lease, grace, backoff) so that every test ends in seconds, and every wait polls a
condition with a deadline: a test never sleeps for a fixed time hoping something has happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import requests
import tomli_w
from port_support import server_port

from comfysup.cli import main as cli
from comfysup.config import load_config
from comfysup.queue.base import TERMINAL, JobRecord
from comfysup.queue.sqlite import SQLiteQueue

REPO = Path(__file__).resolve().parent.parent
FAKE_MAIN = REPO / "fake_comfy" / "main.py"
TRIVIAL = json.loads((REPO / "examples" / "workflows" / "trivial.json").read_text())
T = TypeVar("T")


def job_id(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-supervisor-test/{n}"))


def job(n: int) -> dict[str, Any]:
    """A trivial job whose colour differs per n, so ComfyUI's cache never serves it."""
    return {"id": job_id(n), "workflow": TRIVIAL, "set": {"1.color": n, "3.filename_prefix": f"job{n}"}}


def free_base_port(count: int = 2) -> int:
    """The slots' ports (base_port + i): outside the range the OS gives outgoing connections (tests/port_support.py),
    so no connection takes one between the choice and a server's start, or between two of its starts."""
    return server_port(count)


def wait_for(condition: Callable[[], T], seconds: float, what: str, on_fail: Callable[[], str] = lambda: "") -> T:
    """Poll ``condition`` every 50 ms until it returns something truthy; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    value = condition()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}\n{on_fail()}")
        time.sleep(0.05)
        value = condition()
    return value


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for a reaper has stopped running)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Supervised:
    """A config in a temporary folder, its queue, and ``comfysup run`` on it."""

    def __init__(self, tmp: Path, *, script: dict[str, list[str]] | None = None, node_ms: float = 20.0,
                 main: Path = FAKE_MAIN, runner: dict[str, Any] | None = None,
                 supervisor: dict[str, Any] | None = None, servers: list[dict[str, str]] | None = None,
                 extra_sections: dict[str, Any] | None = None, comfyui: dict[str, Any] | None = None) -> None:
        self.tmp = tmp
        self.base_port = free_base_port()
        extra = ["--node-ms", str(node_ms)]
        if script is not None:
            script_path = tmp / "script.json"
            script_path.write_text(json.dumps(script))
            extra += ["--script-file", str(script_path)]
        runner_settings = {"attempts": 4, "base_delay_seconds": 0.1, "max_delay_seconds": 0.5, "jitter": False,
                           "timeout_seconds": 30.0, "poll_seconds": 0.2, "lease_seconds": 10.0,
                           "heartbeat_seconds": 0.5, "grace_seconds": 3.0, "http_timeout_seconds": 2.0}
        runner_settings.update(runner or {})
        supervisor_settings = {"runner_timeout_seconds": 5.0, "quick_failure_seconds": 2.0, "max_quick_failures": 3,
                               "restart_max_delay_seconds": 1.0}
        supervisor_settings.update(supervisor or {})
        doc = {"queue": {"path": "var/queue.db"}, "store": {"dir": "var/results"},
               "comfyui": {"main": str(main), "gpus": "cpu:2", "base_port": self.base_port,
                           "base_directory": "var/comfyui", "startup_seconds": 20.0, "extra_args": extra,
                           **(comfyui or {})},
               "runner": runner_settings, "supervisor": supervisor_settings,
               # Any free port: tests never meet on the default 9188, nor a person's running comfysup.
               "metrics": {"listen": "127.0.0.1:0", "refresh_seconds": 1.0},
               # Likewise the API: any free port, never the default 9189.
               "api": {"listen": "127.0.0.1:0"}, **(extra_sections or {})}
        if servers:
            doc["servers"] = servers
        self.config_path = tmp / "config.toml"
        self.config_path.write_bytes(tomli_w.dumps(doc).encode())
        self.config = load_config(str(self.config_path), env={})
        self.log_path = tmp / "supervisor.log"
        self.state_path = tmp / "var" / "supervisor.json"
        self.procs: list[subprocess.Popen[bytes]] = []

    # -- the queue --------------------------------------------------------------------------------------

    def submit(self, jobs: list[dict[str, Any]]) -> list[str]:
        path = self.tmp / f"jobs-{uuid.uuid4().hex[:6]}.jsonl"
        path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        assert cli(["submit", "--config", str(self.config_path), str(path)]) == 0
        return [j["id"] for j in jobs]

    def jobs(self, ids: list[str]) -> dict[str, JobRecord]:
        queue = SQLiteQueue(self.config.resolve(self.config.queue.path), create=False)
        try:
            return {j.id: j for j in queue.reads.get_many(ids)}
        finally:
            queue.close()

    def wait_terminal(self, ids: list[str], seconds: float = 40.0) -> dict[str, JobRecord]:
        def ended() -> dict[str, JobRecord] | None:
            jobs = self.jobs(ids)
            return jobs if all(j.state in TERMINAL for j in jobs.values()) and len(jobs) == len(ids) else None

        return wait_for(ended, seconds, f"{len(ids)} job(s) to end", self.describe)

    # -- the supervisor ---------------------------------------------------------------------------------

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(self.config_path)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None

    def metrics_url(self, proc: subprocess.Popen[bytes], seconds: float = 20.0) -> str:
        """http://127.0.0.1:PORT/ of the supervisor's monitor, once it listens (the state file names it)."""
        def listening() -> str | None:
            assert proc.poll() is None, f"the supervisor exited with {proc.returncode}\n{self.describe()}"
            state = self.state()
            return state.get("metrics_url") if state and state.get("pid") == proc.pid else None

        return wait_for(listening, seconds, "the metrics endpoint", self.describe)

    def slot(self, name: str) -> dict[str, Any]:
        state = self.state()
        assert state is not None
        return next(s for s in state["slots"] if s["name"] == name)

    def slot_running(self, job: str) -> dict[str, Any] | None:
        """The slot whose runner has claimed ``job`` and whose server is executing it now."""
        state = self.state()
        for slot in (state or {}).get("slots", []):
            if slot.get("job") == job and job in running_prompts(slot["url"]):
                return slot
        return None

    def wait_ready(self, proc: subprocess.Popen[bytes], seconds: float = 20.0) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            assert proc.poll() is None, f"the supervisor exited with {proc.returncode}\n{self.describe()}"
            state = self.state()
            if state and state["pid"] == proc.pid and all(s["state"] == "running" and s["runner_pid"]
                                                         for s in state["slots"]):
                return state
            return None

        return wait_for(ready, seconds, "both slots running", self.describe)

    def wait_api(self, url: str, seconds: float = 30.0) -> None:
        """Until the API that ``comfysup run`` started at ``url`` answers GET /api/v2/health with 200 (the API is
        a child of its own, up some time after the slots)."""
        def answers() -> bool | None:
            try:
                return requests.get(f"{url}/api/v2/health", timeout=1).status_code == 200 or None
            except requests.RequestException:
                return None

        wait_for(answers, seconds, "the API answering", self.describe)

    def stop(self, proc: subprocess.Popen[bytes], seconds: float = 30.0) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(seconds)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self) -> str:
        return f"state: {json.dumps(self.state(), indent=1)}\nsupervisor log:\n{self.log()[-6000:]}"

    def cleanup(self) -> None:
        """Whatever a failed test left: the supervisors, then (should they have survived) their children."""
        state = self.state() or {}
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for slot in state.get("slots", []):
            for pid in (slot.get("pid"), slot.get("runner_pid")):
                if pid and not gone(pid):
                    try:
                        if str(self.tmp) in " ".join(psutil.Process(pid).cmdline()):
                            os.kill(pid, signal.SIGKILL)
                    except (psutil.Error, ProcessLookupError):
                        pass


def running_prompts(url: str) -> list[str]:
    try:
        body = requests.get(f"{url}/queue", timeout=1).json()
    except (requests.RequestException, ValueError):
        return []
    return [str(item[1]) for item in body.get("queue_running") or []]


def executions(url: str, job: str) -> int:
    """How many times the fake at ``url`` started executing ``job`` (since that server process started)."""
    body = requests.get(f"{url}/fake/stats", timeout=2).json()
    return int((body["prompts"].get(job) or {}).get("executed", 0))


def processes_under(folder: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions ``folder`` (the servers' --base-directory is inside)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and str(folder) in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def demo_from_elsewhere(tmp: Path, example: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], Path]:
    """``comfysup demo --example EXAMPLE`` run in a folder away from the checkout, its cache in ``tmp``: the run,
    the example's job lines, and the folder of the results (one folder a job id)."""
    from comfysup.commands.demo import EXAMPLES

    elsewhere, cache = tmp / "elsewhere", tmp / "cache"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    env.update(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(cache))
    result = subprocess.run([sys.executable, "-m", "comfysup", "demo", "--example", example], cwd=elsewhere,
                            env=env, capture_output=True, text=True, timeout=90)
    lines = [json.loads(line) for line in (EXAMPLES / f"{example}.jsonl").read_text().splitlines() if line]
    return result, lines, cache / "comfysup" / "demo" / "var" / "results"
