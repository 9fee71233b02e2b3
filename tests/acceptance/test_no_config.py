"""Without a config: commands look where `comfysup init` and the service put one, and finding
none say so and what to run; no queue file is made in the current folder, where no supervisor would read it. An
explicit --queue (or a COMFYSUP_* setting) stands for a config."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from cli_support import run_cli

from tests.runner_helpers import TRIVIAL


def jobs_here(folder: Path) -> None:
    (folder / "wf.json").write_text(json.dumps(TRIVIAL))
    (folder / "jobs.jsonl").write_text(json.dumps({"id": str(uuid.uuid4()), "workflow": "wf.json"}) + "\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["submit", "jobs.jsonl"], ["status"], ["results"]])
def test_a_command_without_a_config_says_where_it_looked_and_makes_no_queue(tmp_path: Path,
                                                                            command: list[str]) -> None:
    jobs_here(tmp_path)
    home = tmp_path / "home"
    done = run_cli(*command, cwd=tmp_path, env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "no config.toml found" in done.stderr and "comfysup init" in done.stderr, done.stderr
    assert str(home / ".config" / "comfysup" / "config.toml") in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "var").exists() and not list(tmp_path.rglob("*.db"))


@pytest.mark.timeout(60)
def test_the_users_own_config_folder_is_found(tmp_path: Path) -> None:
    jobs_here(tmp_path)
    config = tmp_path / "home" / ".config" / "comfysup" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[queue]\npath = "{tmp_path / "elsewhere" / "q.db"}"\n')
    done = run_cli("submit", "jobs.jsonl", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "home" / ".config")})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "elsewhere" / "q.db").is_file() and not (tmp_path / "var").exists()


@pytest.mark.timeout(60)
def test_an_explicit_queue_needs_no_config(tmp_path: Path) -> None:
    jobs_here(tmp_path)
    home = tmp_path / "home"
    done = run_cli("submit", "jobs.jsonl", "--queue", "mine.db", cwd=tmp_path,
                   env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mine.db").is_file()
