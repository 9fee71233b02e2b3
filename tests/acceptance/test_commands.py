"""status, show, retry and cancel as a person uses them, and how they fail: a message, never a traceback."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from pathlib import Path

import pytest
from cli_support import cli, db_path, job_id, line, run_cli, write_config, write_jobs

from comfysup.queue.base import Output
from comfysup.queue.sqlite import SQLiteQueue


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("COMFYSUP_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def filled(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    """A queue with one job in each state: done, dead, running, waiting, queued (jobs 0 to 4)."""
    config = write_config(tmp_path)
    write_jobs(tmp_path, [line(n) for n in range(5)])
    assert cli(capsys, "submit", "--config", str(config), "jobs.jsonl")[0] == 0
    q = SQLiteQueue(db_path(tmp_path))
    done = q.leases.claim("runner-a", "gpu0", 60)
    q.leases.record_prompt(done, "gpu0", 1)
    q.leases.complete(done, [Output("a.png", 5, "ab" * 32, "/store/a.png")])
    dead = q.leases.claim("runner-a", "gpu0", 60)
    q.leases.dead(dead, "permanent: ComfyUI refused the prompt (node 3: value not in list)")
    q.leases.claim("runner-b", "gpu1", 60)
    waiting = q.leases.claim("runner-a", "gpu0", 60)
    q.leases.retry_later(waiting, run_after=4e9, reason="connection refused")
    q.close()
    return config


def test_status_shows_counts_running_jobs_and_dead_letters(capsys: pytest.CaptureFixture[str],
                                                           filled: Path) -> None:
    code, out, err = cli(capsys, "status", "--config", str(filled))
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == ("queued 1 · waiting to retry 1 · posted 0 · running 1 · storing 0 · done 1 · "
                                   "dead 1 · cancelled 0")
    assert "oldest queued job:" in out
    assert f"{job_id(2)}  gpu1" in out
    assert f"{job_id(1)}" in out and "ComfyUI refused the prompt" in out


def test_status_json_is_for_scripts(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, _ = cli(capsys, "status", "--config", str(filled), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["counts"] == {"queued": 1, "waiting": 1, "posted": 0, "running": 1, "storing": 0, "done": 1,
                              "dead": 1, "cancelled": 0}
    assert data["outboxes"]["uploads"] == {"items": 0, "oldest_age_seconds": None, "bytes": 0}
    assert data["outboxes"]["webhooks"]["items"] == 0 and data["outboxes"]["broker"]["items"] == 0
    assert [(r["id"], r["server"], r["owner"], r["attempt"]) for r in data["running"]] == \
        [(job_id(2), "gpu1", "runner-b", 1)]
    assert data["running"][0]["lease_left_seconds"] > 50
    assert [d["id"] for d in data["recent_dead"]] == [job_id(1)]
    assert data["oldest_queued_age_seconds"] >= 0


def test_a_storing_job_in_status_show_and_retry(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    """Its outputs staged on a machine, waiting for the bucket: counted, the outbox's oldest shown, ``show`` says
    where the files wait, and ``retry`` runs it again (for a machine gone for good)."""
    q = SQLiteQueue(db_path(filled.parent))
    claim = q.leases.claim("box-2/7/gpu0/t", "gpu0", 60)
    assert claim is not None
    q.leases.complete(claim, [Output("a.png", 2**20, "cd" * 32, "/srv/staging/x/a.png")], staged_in="/srv/staging/x")
    q.close()
    code, out, _ = cli(capsys, "status", "--config", str(filled))
    assert code == 0 and "running 1 · storing 1 · done 1" in out.splitlines()[0]
    assert "outboxes: uploads 1 (1.0 MiB, oldest " in out and "· webhooks 0 · broker results 0" in out
    assert "  uploads waiting on box-2: 1 job(s), oldest " in out
    code, out, _ = cli(capsys, "show", "--config", str(filled), claim.id)
    assert out.startswith(f"job {claim.id}: storing")
    assert "staged     on box-2 in /srv/staging/x since " in out and "attempt 1" in out and ": storing" in out
    assert json.loads(cli(capsys, "show", "--config", str(filled), "--json", claim.id)[1])["staged"]["machine"] == \
        "box-2"
    code, out, _ = cli(capsys, "retry", "--config", str(filled), claim.id)
    assert (code, out.strip()) == (0, f"{claim.id}: requeued")


def test_show_prints_the_job_its_attempts_and_files(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, _ = cli(capsys, "show", "--config", str(filled), job_id(0))
    assert code == 0
    assert out.startswith(f"job {job_id(0)}: done")
    assert "set        1.color=0" in out
    assert "attempt 1" in out and "on gpu0 prompt #1: done" in out
    assert "file       /store/a.png  5 bytes  sha256 " + "ab" * 32 in out
    code, out, _ = cli(capsys, "show", "--config", str(filled), "--json", "--workflow", job_id(3))
    data = json.loads(out)
    assert (data["state"], data["reason"], data["attempts"][0]["outcome"]) == ("queued", "connection refused",
                                                                               "retry")
    assert data["workflow"]["1"]["inputs"]["color"] == 3


def test_retry_and_cancel(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, _ = cli(capsys, "retry", "--config", str(filled), job_id(1))
    assert (code, out.strip()) == (0, f"{job_id(1)}: requeued")
    code, out, _ = cli(capsys, "retry", "--config", str(filled), job_id(0))
    assert (code, out.strip()) == (1, f"{job_id(0)}: not dead (done)")
    code, out, _ = cli(capsys, "retry", "--config", str(filled), "--all-dead")
    assert (code, out.strip()) == (0, "requeued 0 dead job(s)")
    code, out, _ = cli(capsys, "cancel", "--config", str(filled), job_id(4), job_id(2))
    assert code == 0
    assert out.splitlines() == [f"{job_id(4)}: cancelled", f"{job_id(2)}: cancelling"]
    code, out, _ = cli(capsys, "cancel", "--config", str(filled), job_id(0))
    assert (code, out.strip()) == (1, f"{job_id(0)}: already done")
    code, _, err = cli(capsys, "retry", "--config", str(filled))
    assert code == 2 and "give job ids, or --all-dead" in err


def _no_traceback(result: object) -> None:
    assert "Traceback" not in result.stderr, result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in result.stdout  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["show", "ID"], ["retry", "ID"],
                                  ["retry", "--all-dead"], ["cancel", "ID"]])
def test_a_missing_database_is_a_message_not_a_traceback(tmp_path: Path, args: list[str]) -> None:
    config = write_config(tmp_path)
    args = [job_id(1) if a == "ID" else a for a in args]
    result = run_cli(args[0], "--config", str(config), *args[1:], cwd=tmp_path)
    assert result.returncode == 1
    assert f"{db_path(tmp_path)}: no queue database here. Submit jobs first" in result.stderr
    _no_traceback(result)
    assert not db_path(tmp_path).exists()  # looking does not create an empty queue


@pytest.mark.timeout(60)
def test_unknown_ids_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [line(1)])
    assert cli(capsys, "submit", "--config", str(config), "jobs.jsonl")[0] == 0
    unknown = str(uuid.uuid4())
    show = run_cli("show", "--config", str(config), unknown, cwd=tmp_path)
    assert show.returncode == 1 and f"no job with id {unknown}" in show.stderr
    retry = run_cli("retry", "--config", str(config), unknown, cwd=tmp_path)
    assert retry.returncode == 1 and f"{unknown}: unknown" in retry.stdout
    cancel = run_cli("cancel", "--config", str(config), unknown, job_id(1), cwd=tmp_path)
    assert cancel.returncode == 1
    assert cancel.stdout.splitlines() == [f"{unknown}: unknown", f"{job_id(1)}: cancelled"]
    malformed = run_cli("show", "--config", str(config), "JOB-1", cwd=tmp_path)
    assert malformed.returncode == 2 and "'JOB-1' is not a job id" in malformed.stderr
    for result in (show, retry, cancel, malformed):
        _no_traceback(result)


@pytest.mark.timeout(60)
def test_a_locked_database_is_a_message_and_status_still_reads(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, busy_timeout_seconds=0.3)
    write_jobs(tmp_path, [line(1)])
    assert cli(capsys, "submit", "--config", str(config), "jobs.jsonl")[0] == 0
    holder = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        cancel = run_cli("cancel", "--config", str(config), job_id(1), cwd=tmp_path)
        status = run_cli("status", "--config", str(config), cwd=tmp_path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert cancel.returncode == 1
    assert "database is locked for more than 0.3 s; another process holds a write lock" in cancel.stderr
    _no_traceback(cancel)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("queued 1 ")


@pytest.mark.timeout(60)
def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    db_path(tmp_path).parent.mkdir()
    db_path(tmp_path).write_text("id,name\n1,not a database\n" * 100)
    result = run_cli("status", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 75  # as every process whose queue file is lost or damaged (comfysup.queue.watch)
    assert "file is not a database" in result.stderr
    _no_traceback(result)


@pytest.mark.timeout(60)
def test_a_bad_config_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[runner]\nheartbeat_seconds = 100\n")
    result = run_cli("status", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert f"{config}: [runner] heartbeat_seconds = 100.0: must be shorter than" in result.stderr
    _no_traceback(result)
