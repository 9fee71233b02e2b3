"""Ids as people type them: show, cancel and retry take any unique prefix of a job id, as git
takes a commit's; a prefix that names several jobs or none says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli, write_config, write_jobs

A = "3f2a9c10-0000-4000-8000-000000000001"
B = "3f2a9c11-0000-4000-8000-000000000002"
C = "7b00e5d2-0000-4000-8000-000000000003"


def line(job_id: str, n: int) -> str:
    return json.dumps({"id": job_id, "workflow": "wf.json", "set": {"1.color": n}})


@pytest.mark.timeout(60)
def test_show_and_cancel_take_a_unique_prefix(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [line(A, 1), line(B, 2), line(C, 3)])
    assert run_cli("submit", "jobs.jsonl", "--config", str(config), cwd=tmp_path).returncode == 0
    shown = run_cli("show", "7b00", "--config", str(config), cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith(f"job {C}: queued"), shown.stdout + shown.stderr
    assert json.loads(run_cli("show", "3F2A9C10", "--json", "--config", str(config), cwd=tmp_path).stdout)["id"] == A
    several = run_cli("show", "3f2a9c1", "--config", str(config), cwd=tmp_path)
    assert several.returncode == 2 and "begins several job ids" in several.stderr and A in several.stderr
    none = run_cli("cancel", "abcd", "--config", str(config), cwd=tmp_path)
    assert none.returncode == 2 and "no job id begins with 'abcd'" in none.stderr
    short = run_cli("cancel", "7b0", "--config", str(config), cwd=tmp_path)
    assert short.returncode == 2 and "at least its first 4 characters" in short.stderr
    cancelled = run_cli("cancel", "7b00e5", "3f2a9c11", "--config", str(config), cwd=tmp_path)
    assert cancelled.returncode == 0 and f"{C}: cancelled" in cancelled.stdout and f"{B}: cancelled" in cancelled.stdout
    assert "Traceback" not in several.stderr + none.stderr + short.stderr
