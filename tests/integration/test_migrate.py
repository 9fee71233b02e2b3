"""`comfysup migrate --to postgresql://…`: a SQLite queue moves to PostgreSQL, idempotently."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)
from queue_contract import T0, make_job

from comfysup import records
from comfysup.cli import main as cli
from comfysup.queue.base import Output
from comfysup.queue.postgres import PostgresQueue
from comfysup.queue.sqlite import SQLiteQueue


def sqlite_queue_in_every_state(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A config and a SQLite queue holding one job per state; returns the config path and id -> state."""
    config = tmp_path / "config.toml"
    config.write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(i, priority=i) for i in range(1, 8)], now=T0)
    done = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)  # priority 7 first
    q.leases.record_prompt(done, "gpu0", 5)
    q.leases.complete(done, [Output("a.png", 1, "aa" * 32, "/r/a.png")], now=T0 + 1)
    dead = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    q.leases.dead(dead, "broken", now=T0 + 1)
    waiting = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    q.leases.retry_later(waiting, run_after=4_000_000_000.0, reason="out of memory", now=T0 + 1)
    expired = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)  # lease ran out long ago
    q.leases.record_prompt(expired, "gpu0", 9)
    cancelled = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    q.leases.cancelled(cancelled, "cancelled by user", now=T0 + 1)
    states = {j.id: j.state for j in q.reads.iter_jobs()}
    q.close()
    assert sorted(states.values()) == ["cancelled", "dead", "done", "queued", "queued", "queued", "running"]
    return config, states


def pg_ids(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT id, state FROM jobs").fetchall())


def attempt_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM attempts").fetchone()[0]


def test_migrate_copies_what_is_not_terminal_and_nothing_twice(tmp_path: Path, pg_url: str,  # noqa: F811
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config, states = sqlite_queue_in_every_state(tmp_path)
    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 0
    out = capsys.readouterr()
    assert "copied 4 job(s), 0 already in" in out.out
    assert "4/4" in out.err  # progress
    live = {i for i, s in states.items() if s in ("queued", "running")}
    assert set(pg_ids(pg_url)) == live
    assert set(pg_ids(pg_url).values()) == {"queued"}  # the expired running job went over as queued
    assert attempt_rows(pg_url) == 0
    target = PostgresQueue(pg_url)
    waiting = target.reads.get(make_job(5).id)
    assert (waiting.attempt, waiting.run_after, waiting.reason) == (1, 4_000_000_000.0, "out of memory")
    was_running = target.reads.get(make_job(4).id)
    assert (was_running.owner, was_running.last_server, was_running.last_prompt_number) == (None, "gpu0", 9)
    assert was_running.workflow == make_job(4).workflow
    assert was_running.spec_hash == make_job(4, priority=4).spec_hash
    # Claim order is kept: priority, then submission order.
    order = [target.leases.claim("host-b/2/gpu0/t", "gpu0", 30).id for _ in range(3)]
    assert order == [make_job(4).id, make_job(2).id, make_job(1).id]
    target.close()
    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 0
    assert "copied 0 job(s), 4 already in" in capsys.readouterr().out


def test_migrate_with_history_copies_terminal_jobs_and_attempts_once(tmp_path: Path, pg_url: str,  # noqa: F811
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    config, states = sqlite_queue_in_every_state(tmp_path)
    assert cli(["migrate", "--config", str(config), "--to", pg_url, "--history"]) == 0
    assert "copied 7 job(s) with 5 attempt row(s)" in capsys.readouterr().out
    copied = pg_ids(pg_url)
    assert copied == {i: ("queued" if s == "running" else s) for i, s in states.items()}
    target = PostgresQueue(pg_url)
    done = target.reads.get(make_job(7).id)
    assert (done.machine, done.outputs[0].path, done.finished_at) == ("host-a", "/r/a.png", T0 + 1)
    assert [(a.outcome, a.prompt_number) for a in done.attempts] == [("done", 5)]
    expired = target.reads.get(make_job(4).id)
    assert [a.outcome for a in expired.attempts] == ["lease_expired"]
    target.close()
    assert cli(["migrate", "--config", str(config), "--to", pg_url, "--history"]) == 0
    assert "copied 0 job(s) with 0 attempt row(s), 7 already in" in capsys.readouterr().out
    assert attempt_rows(pg_url) == 5


def test_the_same_id_with_other_content_is_reported_and_the_rest_copied(tmp_path: Path, pg_url: str,  # noqa: F811
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config, _ = sqlite_queue_in_every_state(tmp_path)
    target = PostgresQueue(pg_url)
    target.intake.submit([make_job(1, seed=99)])
    target.close()
    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 1
    out = capsys.readouterr().out
    assert "copied 3 job(s), 0 already in" in out and "1 conflict(s)" in out
    assert f"{make_job(1).id}: already in" in out and "different content" in out
    assert PostgresQueue(pg_url).reads.get(make_job(1).id).spec_hash == make_job(1, seed=99).spec_hash


def test_a_job_running_under_a_live_lease_is_refused(tmp_path: Path, pg_url: str,  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([make_job(1), make_job(2)])
    q.leases.claim("host-a/1/gpu0/t", "gpu0", 600, now=time.time())
    q.close()
    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 2
    err = capsys.readouterr().err
    assert "1 job(s) are running" in err and "under a live lease" in err and "stop comfysup run" in err
    assert pg_ids(pg_url) == {}


def test_a_password_in_the_url_is_never_printed(tmp_path: Path, pg_url: str,  # noqa: F811
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config, _ = sqlite_queue_in_every_state(tmp_path)
    with_password = pg_url.replace("postgres@", "postgres:trust-ignores-me@")
    assert cli(["migrate", "--config", str(config), "--to", with_password]) == 0
    out = capsys.readouterr()
    assert "trust-ignores-me" not in out.out + out.err


def test_jobs_with_input_files_arrive_with_their_bytes(tmp_path: Path, pg_url: str,  # noqa: F811
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """the input files go with their jobs: stored once per content in PostgreSQL, linked to each job (so
    prune keeps them), and a second migrate copies nothing twice."""
    import json

    from input_images import INVERT, random_png

    from comfysup import assets

    config = tmp_path / "config.toml"
    config.write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    (tmp_path / "invert.json").write_text(json.dumps(INVERT))
    images = {name: random_png(n, width=8, height=8) for n, name in enumerate(("a.png", "b.png"))}
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    lines = [{"id": make_job(n).id, "workflow": "invert.json", "set": {"1.image": {"file": name}}}
             for n, name in enumerate(("a.png", "b.png", "a.png"))]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli(["submit", "--config", str(config), str(tmp_path / "jobs.jsonl")]) == 0
    for name in images:
        (tmp_path / name).unlink()  # the bytes come from the queue's own store, not from the jobs' folder
    capsys.readouterr()

    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 0
    assert "copied 3 job(s) and 2 input file(s)" in capsys.readouterr().out
    target = PostgresQueue(pg_url)
    try:
        for data in images.values():
            assert target.assets.read_asset(assets.hash_bytes(data)) == data
        assert target.assets.assets_needed() == {assets.hash_bytes(d) for d in images.values()}
    finally:
        target.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM job_assets").fetchone()[0] == 3

    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 0
    assert "copied 0 job(s), 3 already in" in capsys.readouterr().out


def test_a_storing_job_goes_over_with_where_its_files_wait(tmp_path: Path, pg_url: str,  # noqa: F811
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Its machine's uploader sends its staged files from the new queue: the row keeps machine, folder, time and
    tenant, and the job counts among its tenant's done there once stored."""
    config = tmp_path / "config.toml"
    config.write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit([records.replace(make_job(1), tenant="studio")], now=T0)
    claim = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    assert claim is not None
    q.leases.complete(claim, [Output("a.png", 7, "00", "/staging/a.png")], now=T0 + 1, staged_in="/staging")
    q.close()
    assert cli(["migrate", "--config", str(config), "--to", pg_url]) == 0
    assert "copied 1 job(s)" in capsys.readouterr().out
    target = PostgresQueue(pg_url)
    try:
        [job] = target.uploads.staged("host-a")
        assert (job.id, job.staged_in, job.staged_at, job.staged_bytes) == (claim.id, "/staging", T0 + 1, 7)
        assert job.tenant == "studio"
        assert target.uploads.stored(job, [Output("a.png", 7, "00", "s3://b/a.png")], now=T0 + 2)
        assert {t.tenant: t.done for t in target.reads.tenant_counts()}["studio"] == 1
    finally:
        target.close()
