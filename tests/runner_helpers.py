"""Shared pieces of the runner tests: a config in a temp dir, jobs, and running `comfysup work`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tomli_w

from comfysup.config import Config, load_config
from comfysup.jobs import JobsFile
from comfysup.queue.sqlite import SQLiteQueue

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())


def job_id(n: int) -> str:
    """0000000n-0000-…: the first 8 characters, which the logs show, differ between jobs."""
    return str(uuid.UUID(int=n << 96))


def write_config(tmp: Path, **runner: Any) -> Path:
    """A config.toml in ``tmp`` with fast settings for tests; ``runner`` overrides [runner] keys."""
    settings = {"attempts": 2, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
                "timeout_seconds": 20.0, "poll_seconds": 0.2, "lease_seconds": 10.0, "heartbeat_seconds": 0.5,
                "http_timeout_seconds": 5.0}
    settings.update(runner)
    doc = {"queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store")},
           "comfyui": {"gpus": "cpu:1"}, "runner": settings}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path


def jobs_file(tmp: Path, jobs: list[dict[str, Any]], name: str = "jobs.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def trivial_job(n: int, **extra: Any) -> dict[str, Any]:
    """A trivial job whose colour differs per n, so ComfyUI's cache never serves it."""
    line = {"id": job_id(n), "workflow": TRIVIAL, "set": {"1.color": n, "3.filename_prefix": f"job{n}"}}
    line.update(extra)
    return line


def submit(config_path: Path, jobs: list[dict[str, Any]]) -> SQLiteQueue:
    """Submit through the same path as the CLI; returns the opened queue."""
    config = load_config(str(config_path), env={})
    path = jobs_file(config_path.parent, jobs, name=f"jobs-{uuid.uuid4().hex[:6]}.jsonl")
    file = JobsFile(path)
    checked = file.validate()
    assert checked.ok, checked.problems
    queue = SQLiteQueue(config.resolve(config.queue.path))
    queue.intake.submit(file.jobs())
    return queue


def config_of(config_path: Path) -> Config:
    return load_config(str(config_path), env={})


def comfysup(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a person runs it."""
    return subprocess.run([sys.executable, "-m", "comfysup", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def post_and_wait(url: str, workflow: dict[str, Any], prompt_id: str, client_id: str) -> int:
    """Another client's POST /prompt, and its run waited for to the end on that client's own socket (the
    ``executing`` with node None comes after the history is written); returns the prompt's number."""
    from comfysup.comfy import ComfyClient, EventStream

    stream = EventStream(url, client_id, 5.0)
    stream.connect()
    try:
        number = ComfyClient(url).post_prompt(workflow, prompt_id, client_id)
        while (message := stream.recv(10.0)) is not None:
            data = message.get("data") or {}
            if message["type"] == "executing" and data.get("node") is None and data.get("prompt_id") == prompt_id:
                return number
        raise AssertionError(f"prompt {prompt_id} never ended on {url}")
    finally:
        stream.close()


@contextlib.contextmanager
def work_until_empty(tmp: Path, config_path: Path, url: str, name: str = "a") -> Iterator[subprocess.Popen]:
    """``comfysup work --until-empty`` on one server (``name=url``) as a subprocess, its output in
    ``tmp/work.log``; killed at the end if it is still running."""
    with open(tmp / "work.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "comfysup", "work", "--config", str(config_path), "--server",
                                 f"{name}={url}", "--until-empty"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=dict(os.environ), start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
