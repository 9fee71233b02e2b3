"""`comfysup results` as a spreadsheet reads it: `--csv` writes parameters as plain
values, so a join on a column needs no unquoting; with a jobs file every line is listed, and a line that was
never submitted says so; the table cuts a long reason at a word, with an ellipsis."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import pytest
from cli_support import cli, job_id, line, write_config, write_jobs

from comfysup.commands.results import cut
from comfysup.config import load_config
from comfysup.queue import open_queue


def test_csv_values_read_back_as_plain_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    jobs = write_jobs(tmp_path, [
        line(1, set={"1.color": 7, "3.filename_prefix": "C"}),
        line(2, set={"1.color": 0.5, "3.filename_prefix": 'say "hi", then, go'}),
        line(3, set={"1.color": 9, "3.filename_prefix": "x", "2.image": ["1", 0]}),
    ])
    code, _, err = cli(capsys, "submit", str(jobs), "--config", str(config))
    assert code == 0, err
    code, out, err = cli(capsys, "results", "--csv", str(jobs), "--config", str(config))
    assert code == 0, err
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(out))}
    assert rows[job_id(1)]["3.filename_prefix"] == "C"
    assert rows[job_id(1)]["1.color"] == "7"
    assert rows[job_id(2)]["1.color"] == "0.5"
    assert rows[job_id(2)]["3.filename_prefix"] == 'say "hi", then, go'
    assert rows[job_id(3)]["2.image"] == '["1",0]'  # only objects and lists as JSON
    assert rows[job_id(1)]["2.image"] == ""


def test_results_of_a_file_lists_every_line_and_the_unsubmitted_ones_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    submitted = write_jobs(tmp_path, [line(1), line(2)], name="first.jsonl")
    assert cli(capsys, "submit", str(submitted), "--config", str(config))[0] == 0
    jobs = write_jobs(tmp_path, [line(1), line(3, set={"1.color": 3, "3.filename_prefix": "late"}), line(2)])
    code, out, err = cli(capsys, "results", "--csv", str(jobs), "--config", str(config))
    assert code == 0
    assert "1 line(s) not in the queue" in err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["id"] for r in rows] == [job_id(1), job_id(3), job_id(2)]
    assert [r["status"] for r in rows] == ["queued", "not submitted", "queued"]
    assert rows[1]["3.filename_prefix"] == "late"
    assert rows[1]["1.color"] == "3"
    code, out, _ = cli(capsys, "results", str(jobs), "--config", str(config))
    assert code == 0
    assert len(out.splitlines()) == 4
    assert "not submitted" in out.splitlines()[2]


def test_the_table_cuts_a_reason_at_a_word_with_an_ellipsis(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    jobs = write_jobs(tmp_path, [line(1)])
    assert cli(capsys, "submit", str(jobs), "--config", str(config))[0] == 0
    queue = open_queue(load_config(str(config), env={}))
    now = time.time()
    claim = queue.leases.claim("host/1/gpu0/abcd", "gpu0", 30, now=now)
    assert claim is not None
    reason = "gave up after 4 attempts, last: POST /prompt on http://127.0.0.1:8188: connection refused"
    queue.leases.dead(claim, reason, now=now + 1)
    queue.close()
    code, out, _ = cli(capsys, "results", "--config", str(config))
    assert code == 0
    shown = out.splitlines()[1]
    assert "POST /prompt on…" in shown
    assert "http://127.0" not in shown


@pytest.mark.parametrize(("text", "limit", "expected"), [
    ("short", 60, "short"),
    ("gave up after 4 attempts, last: connection refused", 30, "gave up after 4 attempts…"),
    ("a" * 80, 10, "a" * 9 + "…"),
    ("one twothreefourfivesix", 10, "one twoth…"),
])
def test_cut(text: str, limit: int, expected: str) -> None:
    assert cut(text, limit) == expected
    assert len(cut(text, limit)) <= limit
