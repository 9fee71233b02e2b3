"""``comfysup submit``: every bad line is reported as ``jobs.jsonl:LINE: reason`` and nothing is inserted.

Each case runs the command with the jobs file named ``jobs.jsonl`` from its own folder, so the
message is checked exactly as a person sees it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_support import TRIVIAL, cli, count_jobs, job_id, line, run_cli, write_config, write_jobs
from pg_support import pg_url  # noqa: F401  (a fixture, by name)

from comfysup import jobs as jobs_module
from comfysup.commands import submit as submit_command
from comfysup.config import load_config
from comfysup.jobs import JobsFile
from comfysup.queue import open_queue
from comfysup.queue.sqlite import SQLiteQueue

UI_FORMAT = {"last_node_id": 3, "last_link_id": 2, "nodes": [{"id": 1, "type": "EmptyImage"}],
             "links": [[1, 1, 0, 2, 0, "IMAGE"]], "version": 0.4}
CYCLE = {
    "1": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
}
NO_OUTPUT = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
}
MISSING_LINK = {
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
}
UNKNOWN_ONLY = {"1": {"class_type": "MyStudioSaver", "inputs": {"text": "hello"}}}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("COMFYSUP_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def submit(capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str],
           workflow: dict | None = None, name: str = "jobs.jsonl") -> tuple[int, str, str]:
    config = write_config(tmp_path)
    write_jobs(tmp_path, lines, name=name, workflow=workflow)
    return cli(capsys, "submit", "--config", str(config), name)


BAD_LINES = [
    pytest.param([line(1), '{"id": "' + job_id(2) + '", "workflow": '], None, 2, "not valid JSON",
                 id="not-json"),
    pytest.param([line(1), "[1, 2, 3]"], None, 2, "expected a JSON object, got list", id="not-an-object"),
    pytest.param([line(1), line(2).replace('"1.color": 2', '"1.color": NaN')], None, 2,
                 "NaN is not valid JSON", id="nan"),
    pytest.param([line(1).replace('"1.color": 1', '"1.color": -Infinity')], None, 1,
                 "-Infinity is not valid JSON", id="infinity"),
    pytest.param([json.dumps({"id": None, "workflow": "wf.json"})], None, 1,
                 "id None is not a string; expected a lowercase hyphenated UUID", id="null-id"),
    pytest.param([line(1, id=job_id(1).upper())], None, 1,
                 f"id {job_id(1).upper()!r} is not in canonical form; write it as {job_id(1)!r}",
                 id="uppercase-id"),
    pytest.param([line(1, id=job_id(1).replace("-", ""))], None, 1,
                 f"is not in canonical form; write it as {job_id(1)!r}", id="id-without-hyphens"),
    pytest.param([line(1, id="job-1")], None, 1, "id 'job-1' is not a UUID", id="id-not-a-uuid"),
    pytest.param([line(1), line(2), line(1, set={"1.color": 5})], None, 3,
                 f"id {job_id(1)} appears twice (first on line 1)", id="same-id-twice"),
    pytest.param([line(1, workflow="missing.json")], None, 1, "missing.json' does not exist",
                 id="missing-workflow-file"),
    pytest.param([line(1)], UI_FORMAT, 1, "is in ComfyUI's UI format; converting it needs the node catalogue "
                 "(/object_info) that a server records in the queue when it starts", id="ui-format-no-catalogue"),
    pytest.param([line(1, set={"9.color": 1})], None, 1,
                 "set key '9.color' names node '9', which is not in the workflow", id="set-missing-node"),
    pytest.param([line(1, set={"1.colour": 1})], None, 1,
                 "set key '1.colour': node 1 (EmptyImage) has no input 'colour'", id="set-missing-input"),
    pytest.param([line(1, set={})], MISSING_LINK, 1,
                 "node 2 (ImageInvert) input 'image' links to node '1', which is not in the workflow",
                 id="link-to-missing-node"),
    pytest.param([line(1, set={})], CYCLE, 1,
                 "the workflow has a cycle: 1 (ImageInvert) -> 2 (ImageInvert) -> 1 (ImageInvert)", id="cycle"),
    pytest.param([line(1, set={})], NO_OUTPUT, 1, "the workflow has no output node (such as SaveImage",
                 id="no-output-node"),
    pytest.param([line(1, priority="high")], None, 1, "priority 'high' is not a whole number", id="bad-priority"),
    pytest.param([line(1, priority=10**20)], None, 1, "priority 100000000000000000000 is out of range",
                 id="priority-beyond-int64"),
    pytest.param([line(1, meta={"deep": "@"}).replace('"@"', "[" * 100_000 + "]" * 100_000)], None, 1,
                 "the line is nested too deeply", id="nested-too-deeply"),
    pytest.param([line(1, extra_data=[1])], None, 1, "extra_data must be an object", id="bad-extra-data"),
    pytest.param([line(1, sett={})], None, 1, "unknown key 'sett'", id="unknown-key"),
]


@pytest.mark.parametrize(("lines", "workflow", "number", "reason"), BAD_LINES)
def test_bad_line_is_reported_with_its_line_and_nothing_inserted(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str], workflow: dict | None,
        number: int, reason: str) -> None:
    code, out, err = submit(capsys, tmp_path, lines, workflow)
    assert code == 2
    problems = [x for x in err.splitlines() if x.startswith("jobs.jsonl:")]
    assert problems and problems[0].startswith(f"jobs.jsonl:{number}: "), err
    assert reason in problems[0], err
    assert "nothing was submitted" in err
    assert count_jobs(tmp_path) == 0
    assert "submitted" not in out


def test_every_bad_line_is_reported_not_only_the_first(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = [line(1), "not json", line(3), line(4, id="X"), "", line(6, set={"7.x": 1})]
    code, _, err = submit(capsys, tmp_path, lines)
    assert code == 2
    assert [x.split(": ")[0] for x in err.splitlines() if x.startswith("jobs.jsonl:")] == \
        ["jobs.jsonl:2", "jobs.jsonl:4", "jobs.jsonl:6"]
    assert "3 problem(s) in jobs.jsonl; nothing was submitted" in err
    assert count_jobs(tmp_path) == 0


def test_a_line_over_the_size_limit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    huge = line(2, meta={"blob": "x" * (jobs_module.MAX_LINE_BYTES + 1)})
    code, _, err = submit(capsys, tmp_path, [line(1), huge])
    assert code == 2
    assert "jobs.jsonl:2: the line is larger than 16 MiB" in err
    assert count_jobs(tmp_path) == 0


def test_a_file_over_the_line_limit(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_module, "MAX_LINES", 3)
    code, _, err = submit(capsys, tmp_path, [line(n) for n in range(5)])
    assert code == 2
    assert "jobs.jsonl:4: the file has more than 3 lines; split it" in err
    assert count_jobs(tmp_path) == 0


def test_many_problems_are_capped_at_a_readable_number(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = submit(capsys, tmp_path, ["nope"] * 80)
    assert code == 2
    assert len([x for x in err.splitlines() if x.startswith("jobs.jsonl:")]) == jobs_module.MAX_PROBLEMS_SHOWN
    assert "… and 30 more problem(s) not shown" in err


def test_unknown_class_without_a_known_output_node_is_a_warning(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    code, out, err = submit(capsys, tmp_path, [line(1, set={"1.text": "hi"})], UNKNOWN_ONLY)
    assert code == 0
    assert "jobs.jsonl:1: warning: no known output node; MyStudioSaver unknown here" in err
    assert out.strip() == "submitted 1 job(s), 0 already submitted"
    assert count_jobs(tmp_path) == 1


def test_the_same_id_in_the_queue_with_other_content(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = submit(capsys, tmp_path, [line(1), line(2)])
    assert (code, out.strip()) == (0, "submitted 2 job(s), 0 already submitted")
    changed = [line(3), line(4), line(2, set={"1.color": 999})]
    write_jobs(tmp_path, changed, name="more.jsonl")
    code, out, err = cli(capsys, "submit", "--config", str(tmp_path / "config.toml"), "more.jsonl")
    assert code == 2
    assert (f"more.jsonl:3: id {job_id(2)} is already in the queue with different content; give the changed "
            "job a new id") in err
    assert count_jobs(tmp_path) == 2  # lines 1 and 2 of more.jsonl were not inserted either
    assert out == ""


def test_submitting_the_same_file_twice_runs_nothing_twice(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    code, out, _ = submit(capsys, tmp_path, [line(n) for n in range(3)])
    assert (code, out.strip()) == (0, "submitted 3 job(s), 0 already submitted")
    code, out, _ = cli(capsys, "submit", "--config", "config.toml", "jobs.jsonl")
    assert (code, out.strip()) == (0, "submitted 0 job(s), 3 already submitted")
    write_jobs(tmp_path, [line(n) for n in range(5)], name="grown.jsonl")
    code, out, _ = cli(capsys, "submit", "--config", "config.toml", "grown.jsonl")
    assert (code, out.strip()) == (0, "submitted 2 job(s), 3 already submitted")
    assert count_jobs(tmp_path) == 5


def test_submitted_jobs_keep_their_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = [line(1, priority=3, set={"1.color": 7, "3.filename_prefix": "red"}, meta={"kind": "thumb"},
                  extra_data={"note": "x"}),
             line(2, workflow=TRIVIAL, set={})]
    code, _, _ = submit(capsys, tmp_path, lines)
    assert code == 0
    q = SQLiteQueue(tmp_path / "var" / "queue.db", create=False)
    first, second = q.reads.get(job_id(1)), q.reads.get(job_id(2))
    assert first.workflow["1"]["inputs"]["color"] == 7
    assert first.workflow["3"]["inputs"]["filename_prefix"] == "red"
    assert (first.priority, first.params, first.meta, first.extra_data) == \
        (3, {"1.color": 7, "3.filename_prefix": "red"}, {"kind": "thumb"}, {"note": "x"})
    assert first.workflow_name == "thumb"
    assert (second.workflow, second.workflow_name) == (TRIVIAL, "inline")
    q.close()


def test_dry_run_validates_and_inserts_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [line(1), line(2)])
    code, out, _ = cli(capsys, "submit", "--config", str(config), "--dry-run", "jobs.jsonl")
    assert (code, out.strip()) == (0, "jobs.jsonl: 2 job(s) valid; nothing submitted (--dry-run)")
    assert count_jobs(tmp_path) == 0


def test_a_missing_jobs_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(tmp_path)
    code, _, err = cli(capsys, "submit", "--config", str(config), "absent.jsonl")
    assert code == 2
    assert "absent.jsonl: no such file" in err


@pytest.mark.timeout(60)
def test_submit_from_standard_input(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [])
    result = run_cli("submit", "--config", str(config), "-", cwd=tmp_path,
                     stdin="".join(f"{x}\n" for x in [line(1), line(2)]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "submitted 2 job(s), 0 already submitted"
    bad = run_cli("submit", "--config", str(config), "-", cwd=tmp_path, stdin=f"{line(3)}\n{{oops\n")
    assert bad.returncode == 2
    assert "<stdin>:2: not valid JSON" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert count_jobs(tmp_path) == 2


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_large_file_is_read_ahead_and_stored_alike_on_either_backend(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest, backend: str) -> None:
    """From READ_AHEAD_LINES lines a forked child reads the file while the submit inserts (lowered here):
    the queue, SQLite or PostgreSQL, gets every job with its own set, and a second submit adds none."""
    monkeypatch.setattr(submit_command, "READ_AHEAD_LINES", 20)
    used = []
    original = JobsFile.jobs_read_ahead

    def watched(self: JobsFile, *args: Any, **kwargs: Any) -> Any:
        used.append(self.path)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JobsFile, "jobs_read_ahead", watched)
    if backend == "postgres":
        url = request.getfixturevalue("pg_url")
        config = tmp_path / "config.toml"
        config.write_text(f'[queue]\nurl = "{url}"\n')
    else:
        config = write_config(tmp_path)
    path = write_jobs(tmp_path, [line(n, priority=n % 2) for n in range(60)])
    code, out, err = cli(capsys, "submit", str(path), "--config", str(config))
    assert (code, out.strip()) == (0, "submitted 60 job(s), 0 already submitted"), err
    assert used == [path]
    queue = open_queue(load_config(str(config)))
    try:
        jobs = {j.id: j for j in queue.reads.iter_jobs()}
        assert len(jobs) == 60
        for n in range(60):
            job = jobs[job_id(n)]
            assert (job.params, job.priority, job.workflow["1"]["inputs"]["color"]) == ({"1.color": n}, n % 2, n)
    finally:
        queue.close()
    code, out, _ = cli(capsys, "submit", str(path), "--config", str(config))
    assert (code, out.strip()) == (0, "submitted 0 job(s), 60 already submitted")
