"""What the command-line tests share: a temporary config, a workflow, job lines, and two ways to run.

``run_cli`` starts the real command (``python -m comfysup``) as a person would, for what only a
process shows (exit codes, tracebacks on stderr, kill -9); ``cli`` calls ``comfysup.cli.main`` in
this process, which is the same code path without the interpreter start-up, for the many cases.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from comfysup.cli import main

REPO = Path(__file__).resolve().parent.parent

TRIVIAL = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "comfysup"}},
}


def job_id(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-cli-test/{n}"))


def line(n: int, **fields: Any) -> str:
    """One jobs.jsonl line using wf.json, with ``fields`` added or replacing the defaults."""
    body: dict[str, Any] = {"id": job_id(n), "workflow": "wf.json", "set": {"1.color": n}}
    body.update(fields)
    return json.dumps(body)


def write_config(directory: Path, **queue: Any) -> Path:
    """A config.toml in ``directory`` whose queue lives in ``directory/var/queue.db``."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = {"path": "var/queue.db", **queue}
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    path = directory / "config.toml"
    path.write_text(f"[queue]\n{body}\n")
    return path


def write_jobs(directory: Path, lines: Sequence[str], name: str = "jobs.jsonl",
               workflow: Mapping[str, Any] | None = None) -> Path:
    (directory / "wf.json").write_text(json.dumps(workflow or TRIVIAL))
    path = directory / name
    path.write_text("".join(f"{x}\n" for x in lines))
    return path


def db_path(directory: Path) -> Path:
    return directory / "var" / "queue.db"


def count_jobs(directory: Path) -> int:
    """Jobs in the queue of ``directory``'s config (0 when no database was created)."""
    path = db_path(directory)
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    finally:
        conn.close()


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``comfysup ARGS`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def run_cli(*args: str, cwd: Path | None = None, stdin: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``python -m comfysup ARGS`` as a separate process, with COMFYSUP_* cleared unless given."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "comfysup", *args], cwd=cwd, input=stdin, env=environ,
                          capture_output=True, text=True, timeout=timeout, check=False)


def kill_submit(proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL a ``comfysup submit`` unless it already ended; True when the kill interrupted it (an ended one
    must have succeeded). Shared by the single-queue kill test and the chaos row K4."""
    alive = proc.poll() is None
    if alive:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    _, err = proc.communicate()
    if not alive or proc.returncode != -signal.SIGKILL:
        assert proc.returncode == 0, err.decode()
    return proc.returncode == -signal.SIGKILL
