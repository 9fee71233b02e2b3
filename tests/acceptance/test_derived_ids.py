"""Ids optional: a line without an id gets one derived from its content, so submitting the same
file twice still runs nothing twice; a changed workflow or input file is another job; the same line twice in one
file is said to be one job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli, write_config

from tests.runner_helpers import TRIVIAL


def submit(tmp_path: Path, config: Path) -> tuple[int, str, str]:
    done = run_cli("submit", "jobs.jsonl", "--config", str(config), cwd=tmp_path)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.timeout(60)
def test_lines_without_ids_are_named_by_their_content(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "wf.json").write_text(json.dumps(TRIVIAL))
    lines = [{"workflow": "wf.json", "set": {"1.color": n}} for n in range(3)]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert submit(tmp_path, config)[:2] == (0, "submitted 3 job(s), 0 already submitted\n")
    assert submit(tmp_path, config)[:2] == (0, "submitted 0 job(s), 3 already submitted\n")  # nothing runs twice
    status = json.loads(run_cli("status", "--json", "--config", str(config), cwd=tmp_path).stdout)
    assert status["counts"]["queued"] == 3
    changed = dict(TRIVIAL, **{"2": {**TRIVIAL["2"], "class_type": "ImageInvert"}})
    changed["3"] = {**TRIVIAL["3"], "inputs": {**TRIVIAL["3"]["inputs"], "filename_prefix": "other"}}
    (tmp_path / "wf.json").write_text(json.dumps(changed))  # the workflow file changed: other jobs
    assert submit(tmp_path, config)[:2] == (0, "submitted 3 job(s), 0 already submitted\n")


@pytest.mark.timeout(60)
def test_the_same_id_less_line_twice_in_a_file_is_one_job_and_said_so(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "wf.json").write_text(json.dumps(TRIVIAL))
    same = json.dumps({"workflow": "wf.json", "set": {"1.color": 9}})
    (tmp_path / "jobs.jsonl").write_text(f"{same}\n{same}\n")
    code, _out, err = submit(tmp_path, config)
    assert code != 0 and "jobs.jsonl:2: the same job as line 1" in err, err
