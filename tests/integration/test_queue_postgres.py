"""The PostgreSQL backend: the shared contract, plus what only a shared server has to get right."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)
from queue_contract import LEASE, T0, QueueContract, make_job

from comfysup import records
from comfysup.errors import DatabaseUnavailable, LeaseLost, QueueError
from comfysup.queue import queries
from comfysup.queue.base import NewJob, Output
from comfysup.queue.db import ClaimAsk
from comfysup.queue.postgres import SCHEMA_VERSION, PostgresQueue, describe_url
from comfysup.queue.search import JobSearch


class TestPostgresQueue(QueueContract):
    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:  # noqa: F811
        self.url = pg_url

    def make_queue(self, tmp_path: Path) -> PostgresQueue:
        return PostgresQueue(self.url)

    def count(self, q: PostgresQueue, table: str) -> int:  # type: ignore[override]
        return q.db._scalar(f"SELECT count(*) FROM {table}")


UNDO_V13 = ("DROP TABLE slot_orders; DROP INDEX jobs_workflow_name; DROP INDEX jobs_state_seq; "
            "CREATE INDEX jobs_state ON jobs (state, finished_at)")
"""What schema v13 (the console's) added, taken away again: a test of an older database undoes it first."""

V14_CHARGE = re.search(r"CREATE FUNCTION comfysup_charge_tenant\(\).*?END \$\$;", queries.read("postgres.sql")["v14"],
                       re.S).group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
"""The tenant's charge as v14 wrote it (v17 replaced it)."""

UNDO_V17 = ("DROP INDEX tenants_share; ALTER TABLE tenants DROP COLUMN running_seconds, DROP COLUMN last_seconds; "
            "ALTER TABLE attempts DROP COLUMN expected_seconds; "
            "CREATE INDEX tenants_share ON tenants ((gpu_seconds / weight), name); " + V14_CHARGE)
"""v17 (running jobs in the share) taken away again: a test of an older database undoes it before v16."""

UNDO_V16 = "DROP TABLE job_labels; DROP FUNCTION comfysup_job_labels CASCADE; DROP FUNCTION comfysup_labels"
"""v16 (the console's label index) taken away again: a test of an older database undoes it before v15."""

UNDO_V15 = "DROP INDEX jobs_tenant"
"""v15 (the console's tenant index) taken away again: a test of an older database undoes it before v14."""

UNDO_V14 = ("DROP TABLE tenants; DROP FUNCTION comfysup_charge_tenant CASCADE; "
            "ALTER TABLE jobs DROP COLUMN tenant; "
            "ALTER TABLE api_assets DROP COLUMN tenant; "
            "DROP TABLE affinity_skips; CREATE TABLE affinity_skips (priority bigint NOT NULL, "
            "seq_bound bigint NOT NULL, at double precision NOT NULL, PRIMARY KEY (priority, seq_bound))")
"""v14 (tenants) taken away again: a test of an older database undoes it before v13."""


def _sql(url: str, sql: str, args: tuple = ()) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def test_schema_version_is_recorded_and_a_newer_one_refused(pg_url: str) -> None:  # noqa: F811
    PostgresQueue(pg_url).close()
    assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
    PostgresQueue(pg_url).close()  # opening again applies nothing twice
    assert _sql(pg_url, "SELECT count(*) FROM schema_version") == [(SCHEMA_VERSION,)]
    _sql(pg_url, "INSERT INTO schema_version VALUES (%s, 0)", (SCHEMA_VERSION + 1,))
    try:
        with pytest.raises(QueueError, match="newer than this comfysup"):
            PostgresQueue(pg_url)
    finally:
        _sql(pg_url, "DELETE FROM schema_version WHERE version > %s", (SCHEMA_VERSION,))


UNDO_V12 = "ALTER TABLE jobs DROP COLUMN staged_at, DROP COLUMN staged_in, DROP COLUMN staged_bytes"
"""The storing state's columns (and with them their index) taken away: a database as v11 left it."""


def _undo_steps_since(url: str, first: int) -> None:
    """Every schema step from ``first`` on taken away, newest first (the tests of older databases begin so)."""
    undo = {12: UNDO_V12, 13: UNDO_V13, 14: UNDO_V14, 15: UNDO_V15, 16: UNDO_V16, 17: UNDO_V17}
    assert set(undo) == set(range(12, SCHEMA_VERSION + 1)), "a new schema step needs its undo here"
    for step in range(SCHEMA_VERSION, first - 1, -1):
        _sql(url, undo[step])


def test_v16_indexes_the_labels_of_the_jobs_already_there_and_prune_removes_them(pg_url: str) -> None:  # noqa: F811
    """A v15 database opened by this comfysup: every job's string labels fill job_labels; a pruned job's go."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(n, meta={"run": "r7" if n % 2 else "r1", "n": n}) for n in range(4)], now=T0)
    q.close()
    _undo_steps_since(pg_url, 16)
    _sql(pg_url, "DELETE FROM schema_version WHERE version >= 16")
    q = PostgresQueue(pg_url)
    try:
        assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
        assert [r.id for r in q.search.search(JobSearch(labels=(("run", "r7"),))).rows] == \
            [make_job(n).id for n in (3, 1)]
        q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [], now=T0 + 1)
        assert len(q.intake.prune(T0 + 2).removed) == 1
        assert _sql(pg_url, "SELECT key, value FROM job_labels ORDER BY seq") == [("run", "r7"), ("run", "r1"),
                                                                                ("run", "r7")]
    finally:
        q.close()


def test_v12_adds_the_storing_columns_and_keeps_the_jobs(pg_url: str) -> None:  # noqa: F811
    """A v11 database opened by this comfysup: a job is staged (storing) and made done by its machine's uploader."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1)], now=T0)
    q.close()
    _undo_steps_since(pg_url, 12)
    _sql(pg_url, "DELETE FROM schema_version WHERE version >= 12")
    q = PostgresQueue(pg_url)
    try:
        assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
        claim = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
        assert claim is not None
        q.leases.complete(claim, [Output("a.png", 1, "00", "/s/a.png")], now=T0 + 1, staged_in="/s")
        [job] = q.uploads.staged("host-a")
        assert q.uploads.stored(job, [Output("a.png", 1, "00", "s3://b/a.png")], now=T0 + 2)
        assert q.reads.get(claim.id).state == "done"
    finally:
        q.close()


def test_v9_adds_the_api_registry_and_keeps_the_jobs(pg_url: str) -> None:  # noqa: F811
    """A v8 database opened by this comfysup: the registry of machines' APIs is added, the jobs stay."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1)], now=T0)
    q.close()
    _undo_steps_since(pg_url, 12)
    _sql(pg_url, "DROP TABLE api_endpoints, output_assets, job_previews")  # back to v8 (v10 and v11 undone first)
    _sql(pg_url, "ALTER TABLE jobs DROP COLUMN waiting_since")
    _sql(pg_url, "DELETE FROM schema_version WHERE version >= 9")
    q = PostgresQueue(pg_url)
    try:
        assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
        assert q.reads.get(make_job(1).id).state == "queued"
        q.endpoints.advertise_api("render-07", "http://10.0.0.7:9189", 100, now=T0)
        endpoint = q.endpoints.api_endpoint("render-07", now=T0 + 1)
        assert endpoint is not None and endpoint.url == "http://10.0.0.7:9189"
    finally:
        q.close()


def test_v10_adds_when_a_running_job_began_to_wait_and_keeps_the_jobs(pg_url: str) -> None:  # noqa: F811
    """A v9 database opened by this comfysup: a running job is shown running, as it was counted; one
    posted behind another from now on is shown posted."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1), make_job(2)], now=T0)
    running = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
    assert running is not None
    q.close()
    _undo_steps_since(pg_url, 12)
    _sql(pg_url, "DROP TABLE output_assets, job_previews")  # back to v9 (v11 undone first)
    _sql(pg_url, "ALTER TABLE jobs DROP COLUMN waiting_since")
    _sql(pg_url, "DELETE FROM schema_version WHERE version >= 10")
    q = PostgresQueue(pg_url)
    try:
        assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
        assert q.reads.states([running.id]) == {running.id: "running"}
        behind = q.leases.claim("host-a/1/gpu0/t", "gpu0", 30, now=T0)
        assert behind is not None
        q.leases.record_prompt(behind, "gpu0", 2, waiting=True)
        assert q.reads.status(now=T0 + 1).counts["posted"] == 1
    finally:
        q.close()


def test_v11_gives_outputs_asset_ids_and_keeps_earlier_outputs(pg_url: str) -> None:  # noqa: F811
    """A v10 database with a job done before: its outputs keep no id; a job done now gets one per file."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1), make_job(2)], now=T0)
    q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [Output("a.png", 1, "00")], now=T0 + 1)
    q.close()
    _undo_steps_since(pg_url, 12)
    _sql(pg_url, "DROP TABLE output_assets, job_previews")  # back to v10, its done job as v10 wrote it
    _sql(pg_url, "UPDATE jobs SET outputs = '[{\"name\": \"a.png\", \"size\": 1, \"sha256\": \"00\"}]'")
    _sql(pg_url, "DELETE FROM schema_version WHERE version >= 11")
    q = PostgresQueue(pg_url)
    try:
        assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
        assert [o.id for o in q.reads.get(make_job(1).id).outputs] == [""]
        q.leases.complete(q.leases.claim("r", "gpu0", 30, now=T0), [Output("b.png", 1, "00")], now=T0 + 2)
        (made,) = q.reads.get(make_job(2).id).outputs
        assert made.id and q.reads.output_asset(made.id) == (q.reads.get(make_job(2).id), 0)
    finally:
        q.close()


def test_machines_opening_at_once_create_the_schema_once(pg_url: str) -> None:  # noqa: F811
    """The advisory lock: several processes opening a new database at the same moment all succeed."""
    _sql(pg_url, "DROP FUNCTION IF EXISTS comfysup_charge_tenant CASCADE")
    _sql(pg_url, "DROP TABLE IF EXISTS announcements, jobs, attempts, machines, deliveries, workflows, affinity_skips, "
         "catalogues, server_catalogues, job_refusals, assets, job_assets, asset_chunks, server_assets, api_assets, "
         "api_endpoints, output_assets, job_previews, slot_orders, tenants, job_labels, schema_version")
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_one() -> None:
        try:
            start.wait()
            PostgresQueue(pg_url).close()
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert _sql(pg_url, "SELECT version FROM schema_version ORDER BY version") == [
        (v,) for v in range(1, SCHEMA_VERSION + 1)]  # each step applied once


def test_leases_and_run_after_use_the_database_clock(pg_url: str) -> None:  # noqa: F811
    """Without now=, every stamp comes from the server's clock, however wrong this machine's is."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1), make_job(2)])
    (db_now,) = _sql(pg_url, "SELECT extract(epoch from now())::float8")[0]
    claim = q.leases.claim("runner-a", "gpu0", 30)
    assert claim is not None
    assert abs(claim.lease_until - (db_now + 30)) < 5
    record = q.reads.get(claim.id)
    assert abs(record.submitted_at - db_now) < 5
    # A retry 100 s from now on this machine's clock is 100 s from now on the database's.
    q.leases.retry_later(claim, time.time() + 100, "later")
    assert abs(q.reads.get(claim.id).run_after - (db_now + 100)) < 5
    q.close()


def test_a_claim_starts_after_the_end_that_freed_its_job_even_when_its_transaction_began_first(
        pg_url: str) -> None:  # noqa: F811
    """now() is a transaction's start: a claim whose transaction began (with ``expire``) before another
    machine's release began, and took the job once that release committed, still starts after its end."""
    a, b = PostgresQueue(pg_url), PostgresQueue(pg_url)
    a.intake.submit([make_job(1)])
    held = a.leases.claim("machine-a/1/gpu0/x", "gpu0", 60)
    assert held is not None

    def claim_after_the_release(cur: psycopg.Cursor) -> tuple:
        cur.execute("SELECT now()")  # b's transaction, and so its now(), begins here
        a.leases.release(held, "withdrawn", count_attempt=False)  # another connection: begins and commits meanwhile
        return b.db.take(cur, ClaimAsk("machine-b/2/gpu1/y", "gpu1", 60, None, 0, None, None), None, {})

    row = b.db.transaction(claim_after_the_release)
    assert row is not None and row["id"] == held.id
    [first, second] = a.reads.get(held.id).attempts
    assert (first.owner, first.outcome) == ("machine-a/1/gpu0/x", "released_uncounted")
    assert second.owner == "machine-b/2/gpu1/y" and second.started_at >= first.ended_at, (first, second)
    a.close()
    b.close()


def test_a_machine_clock_far_ahead_cannot_expire_a_live_lease(pg_url: str,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1)])
    first = q.leases.claim("runner-a", "gpu0", 60)
    assert first is not None
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # this machine thinks it is 2096
    assert q.leases.claim("runner-b", "gpu1", 60) is None
    q.leases.heartbeat(first, 60)
    q.close()


def test_skip_locked_claims_never_wait_for_each_other(pg_url: str) -> None:  # noqa: F811
    """A claim whose transaction is still open holds its row; another claim takes the next row at once."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1), make_job(2)], now=T0)
    holder = psycopg.connect(pg_url)
    try:
        holder.execute("SELECT seq FROM jobs WHERE id = %s FOR UPDATE", (make_job(1).id,))
        started = time.monotonic()
        claim = q.leases.claim("runner-b", "gpu1", LEASE, now=T0)
        assert claim is not None and claim.id == make_job(2).id
        assert time.monotonic() - started < 1.0
        assert q.leases.claim("runner-c", "gpu2", LEASE, now=T0) is None  # job 1 is locked, not free
    finally:
        holder.rollback()
        holder.close()
    assert q.leases.claim("runner-c", "gpu2", LEASE, now=T0).id == make_job(1).id
    q.close()


@pytest.mark.timeout(20)
def test_a_claim_never_waits_for_its_tenants_row(pg_url: str) -> None:  # noqa: F811
    """An end holds its tenant's row until its commit (and a transaction that ends one tenant's attempt and claims
    another's must not wait in a circle with one doing the opposite): a claim meanwhile takes its job at once and
    adds nothing to the share, so that its end takes nothing back. Were it to wait, the test would time out."""
    q = PostgresQueue(pg_url)
    q.intake.submit([records.replace(make_job(n), tenant=name) for n, name in ((1, "a"), (3, "b"))],
                    now=T0)
    holder = psycopg.connect(pg_url)
    try:
        holder.execute("UPDATE tenants SET done = done WHERE name = 'a'")
        claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0)
        assert claim is not None and claim.id == make_job(1).id
    finally:
        holder.rollback()
        holder.close()
    held = q.leases.claim("runner-b", "gpu1", LEASE, now=T0)  # b's row is free: its share holds this claim
    assert held.id == make_job(3).id
    expected = dict(_sql(pg_url, "SELECT job_id, expected_seconds FROM attempts"))
    assert expected == {make_job(1).id: 0.0, make_job(3).id: 0.001}
    assert dict(_sql(pg_url, "SELECT name, running_seconds FROM tenants WHERE name <> 'default'")) == \
        {"a": 0.0, "b": 0.001}
    q.leases.complete(claim, [], now=T0 + 5)
    q.leases.complete(held, [], now=T0 + 5)
    assert dict(_sql(pg_url, "SELECT name, running_seconds FROM tenants WHERE name <> 'default'")) == \
        {"a": 0.0, "b": 0.0}
    q.close()


def test_a_stale_connection_is_replaced_and_the_operation_retried(pg_url: str) -> None:  # noqa: F811
    """The server ended our idle session (a restart, an idle timeout): the next call still works."""
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1)], now=T0)
    claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0)
    assert claim is not None
    pid = q.db._conn.info.backend_pid  # type: ignore[union-attr]
    _sql(pg_url, "SELECT pg_terminate_backend(%s)", (pid,))
    assert q.leases.heartbeat(claim, LEASE, now=T0 + 1) is False
    assert q.db._conn.info.backend_pid != pid  # type: ignore[union-attr]
    q.close()


def test_an_unreachable_server_is_database_unavailable_without_the_password() -> None:
    url = "postgresql://someone:sekrit-pw@127.0.0.1:1/nowhere"
    with pytest.raises(DatabaseUnavailable) as info:
        PostgresQueue(url)
    assert "sekrit" not in str(info.value)
    assert "127.0.0.1:1/nowhere" in str(info.value)
    assert describe_url(url) == "postgresql://someone@127.0.0.1:1/nowhere"


def test_a_failed_transaction_rolls_back_and_the_queue_stays_usable(pg_url: str) -> None:  # noqa: F811
    q = PostgresQueue(pg_url)

    def half(cur: psycopg.Cursor) -> None:
        cur.execute("WITH w AS (INSERT INTO workflows (hash, workflow) VALUES ('h', '{}') RETURNING id) "
                    "INSERT INTO jobs (id, submitted_at, spec_hash, workflow_id) SELECT 'a', 0, 'h', id FROM w")
        cur.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(QueueError, match="no_such_table"):
        q.db.transaction(half)
    assert q.reads.status(now=T0).counts["queued"] == 0
    q.intake.submit([make_job(1)], now=T0)
    assert q.reads.status(now=T0).counts["queued"] == 1
    q.close()


def test_a_forked_child_uses_its_own_connection_and_the_parent_keeps_its_own(pg_url: str) -> None:  # noqa: F811
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1), make_job(2)], now=T0)
    parent_pid = q.db._conn.info.backend_pid  # type: ignore[union-attr]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            claim = q.leases.claim("child", "gpu0", LEASE, now=T0)
            assert claim is not None
            q.leases.complete(claim, [], now=T0 + 1)
            os.write(w, str(q.db._conn.info.backend_pid).encode())  # type: ignore[union-attr]
            q.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child_backend = int(os.read(r, 32))
    assert child_backend != parent_pid
    assert q.db._conn.info.backend_pid == parent_pid  # the child neither used nor closed the parent's session
    counts = q.reads.status(now=T0 + 1).counts
    assert (counts["queued"], counts["done"]) == (1, 1)
    q.close()


@pytest.mark.timeout(20)
def test_wait_for_work_wakes_at_a_submit(pg_url: str) -> None:  # noqa: F811
    waiter = PostgresQueue(pg_url)
    submitter = PostgresQueue(pg_url)
    waiter.wait_for_work(0.01)  # LISTEN is in place from here on
    woke = threading.Event()

    def wait() -> None:
        waiter.wait_for_work(10)
        woke.set()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.1)  # let the waiter block in its wait (a wait that returned early would fail below)
    assert not woke.is_set()
    started = time.monotonic()
    submitter.intake.submit([make_job(1)])
    assert woke.wait(5)
    assert time.monotonic() - started < 1.0
    thread.join(5)
    waiter.close()
    submitter.close()


@pytest.mark.parametrize("action", ["release", "retry_now", "requeue", "release_owner"])
def test_what_makes_a_job_claimable_again_notifies(pg_url: str, action: str) -> None:  # noqa: F811
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1)])
    claim = q.leases.claim("runner-a", "gpu0", LEASE)
    assert claim is not None
    if action == "requeue":
        q.leases.dead(claim, "broken")
    q.wait_for_work(0.01)
    q.wait_for_work(0.01)  # nothing pending now
    started = time.monotonic()
    q.wait_for_work(0.3)
    assert time.monotonic() - started >= 0.25  # no notification yet: the wait ran its course
    if action == "release":
        q.leases.release(claim, "test")
    elif action == "retry_now":
        q.leases.retry_later(claim, time.time() - 1, "again")
    elif action == "requeue":
        q.intake.requeue_dead([claim.id])
    else:
        q.leases.release_owner("runner-a", "gone")
    started = time.monotonic()
    q.wait_for_work(5)
    assert time.monotonic() - started < 1.0
    q.close()


def test_a_retry_due_later_does_not_notify(pg_url: str) -> None:  # noqa: F811
    q = PostgresQueue(pg_url)
    q.intake.submit([make_job(1)])
    claim = q.leases.claim("runner-a", "gpu0", LEASE)
    assert claim is not None
    q.wait_for_work(0.01)
    q.leases.retry_later(claim, time.time() + 60, "later")
    started = time.monotonic()
    q.wait_for_work(0.3)
    assert time.monotonic() - started >= 0.25
    q.close()


def test_wait_for_work_sleeps_when_the_listen_connection_dropped(pg_url: str) -> None:  # noqa: F811
    q = PostgresQueue(pg_url)
    q.wait_for_work(0.01)
    listener_pid = q.db._listen.info.backend_pid  # type: ignore[union-attr]
    _sql(pg_url, "SELECT pg_terminate_backend(%s)", (listener_pid,))
    started = time.monotonic()
    q.wait_for_work(0.3)  # the dropped connection is noticed; the rest of the timeout is slept
    assert 0.25 <= time.monotonic() - started < 2
    q.db._listen_failed_at = None  # do not wait LISTEN_RETRY_SECONDS in a test
    submitter = PostgresQueue(pg_url)
    q.wait_for_work(0.01)  # reconnected and listening again
    assert q.db._listen is not None and q.db._listen.info.backend_pid != listener_pid
    submitter.intake.submit([make_job(1)])
    started = time.monotonic()
    q.wait_for_work(5)
    assert time.monotonic() - started < 1.0
    submitter.close()
    q.close()


def test_an_old_owner_is_fenced_across_sessions(pg_url: str) -> None:  # noqa: F811
    """Two sessions: a reclaim committed through one fences the stale claim of the other out."""
    a, b = PostgresQueue(pg_url), PostgresQueue(pg_url)
    a.intake.submit([make_job(1)], now=T0)
    old = a.leases.claim("runner-a", "gpu0", 10, now=T0)
    new = b.leases.claim("runner-b", "gpu1", 10, now=T0 + 11)
    assert old is not None and new is not None and new.attempt == 2
    with pytest.raises(LeaseLost):
        a.leases.complete(old, [], now=T0 + 12)
    b.leases.complete(new, [], now=T0 + 13)
    record = a.reads.get(old.id)
    assert (record.state, record.machine) == ("done", "runner-b")
    a.close()
    b.close()


def test_open_queue_selects_postgres_when_the_config_has_a_url(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    from comfysup.config import build_config
    from comfysup.queue import open_queue

    config = build_config({"queue": {"url": pg_url, "busy_timeout_seconds": 7}}, root=str(tmp_path))
    q = open_queue(config, create=False)
    assert isinstance(q, PostgresQueue)
    assert q.db.busy_timeout_seconds == 7
    assert _sql(pg_url, "SELECT to_regclass('jobs') IS NOT NULL") == [(True,)]
    q.close()


def test_a_version_2_database_keeps_its_jobs_and_stores_each_workflow_once_in_v3(pg_url: str) -> None:  # noqa: F811
    """v3 moves workflows into their own table by hash: every job keeps its workflow and data, identical
    workflows are kept once, and the jobs still to run get their model key (the migration's Python step)."""
    from comfysup.queue import postgres as pg_backend
    from comfysup.workflows import model_key

    _sql(pg_url, "DROP FUNCTION IF EXISTS comfysup_charge_tenant CASCADE")
    _sql(pg_url, "DROP TABLE IF EXISTS announcements, jobs, attempts, machines, deliveries, workflows, affinity_skips, "
         "catalogues, server_catalogues, job_refusals, assets, job_assets, asset_chunks, server_assets, api_assets, "
         "api_endpoints, output_assets, job_previews, slot_orders, tenants, job_labels, schema_version")
    sql = pg_backend._named_sql()
    loaded = {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux.safetensors"}},
              "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "m"}}}
    jobs = [make_job(n, extra={"api_key_comfy_org": f"k{n}"}) for n in range(2)]
    texts = [j.workflow_json for j in jobs] + [json.dumps(loaded, sort_keys=True, separators=(",", ":"))] * 2
    ids = [j.id for j in jobs] + [make_job(7).id, make_job(8).id]
    states = ["done", "queued", "queued", "running"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version (version integer PRIMARY KEY, applied_at double precision NOT NULL)")
        for step in (1, 2):
            conn.execute(sql[f"v{step}"])
            conn.execute("INSERT INTO schema_version VALUES (%s, 0)", (step,))
        for n, (job_id, text, state) in enumerate(zip(ids, texts, states, strict=True)):
            conn.execute("INSERT INTO jobs (id, state, submitted_at, spec_hash, workflow, extra_data, meta, params) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                         (job_id, state, T0, f"h{n}", text, json.dumps({"k": n}), json.dumps({"n": n}),
                          json.dumps({"1.color": n} if n < 2 else {})))
    q = PostgresQueue(pg_url)
    assert _sql(pg_url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _sql(pg_url, "SELECT count(*) FROM workflows") == [(3,)]
    records = q.reads.get_many(ids)
    assert [r.state for r in records] == states
    assert [r.workflow for r in records] == [json.loads(t) for t in texts]
    assert [(r.extra_data, r.meta) for r in records] == [({"k": n}, {"n": n}) for n in range(4)]
    key = model_key(loaded)
    assert [r.model_key for r in records] == [None, None, key, key]
    claim = q.leases.claim("r2", "gpu1", LEASE, now=T0, prefer_model=key, max_wait_seconds=60)
    assert claim is not None and claim.id == make_job(7).id and claim.workflow == loaded
    q.close()


class _Explaining:
    """A cursor that EXPLAINs the claim statement (the one that opens the attempt) before running it."""

    def __init__(self, cur: psycopg.Cursor) -> None:
        self.cur, self.plan = cur, ""

    def execute(self, sql: str, args: object = None) -> psycopg.Cursor:
        if "INSERT INTO attempts" in sql:
            self.plan = "\n".join(r["QUERY PLAN"] for r in self.cur.execute("EXPLAIN " + sql, args).fetchall())
        return self.cur.execute(sql, args)


def test_a_claim_walks_the_ready_index_whatever_the_statistics_say(pg_url: str) -> None:  # noqa: F811
    """Statistics taken while the table was small (here never: autovacuum is off on the test server) made the
    planner scan every queued row and sort them for each claim; the claim must stop at the index's first row."""
    q = PostgresQueue(pg_url)
    text = '{"1":{"class_type":"EmptyImage","inputs":{}}}'  # one small workflow: small rows, few pages
    q.intake.submit([NewJob(id=str(uuid.uuid4()), workflow=json.loads(text), spec_hash=str(n), workflow_json=text)
              for n in range(3000)])
    for strict, key in ((True, None), (False, "model-a")):
        spy = _Explaining.__new__(_Explaining)

        def claim(cur: psycopg.Cursor, spy: _Explaining = spy, key: str | None = key) -> object:
            spy.__init__(cur)
            ask = ClaimAsk("host/1/s/t", "s", LEASE, key, 0.0 if key is None else 60.0, None, None)
            return q.db.take(spy, ask, None, {})

        assert q.db.transaction(claim) is not None
        assert "tenants_share" in spy.plan, spy.plan
        assert ("jobs_tenant_ready" if strict else "jobs_tenant_affinity") in spy.plan, spy.plan
        assert "Sort" not in spy.plan and "Bitmap Heap Scan on jobs" not in spy.plan, spy.plan
    q.close()


def test_only_writes_marked_not_durable_skip_the_wal_flush(pg_url: str) -> None:  # noqa: F811
    """A prompt number or progress commits without waiting for the WAL's flush (as SQLite's NORMAL); a claim,
    an end, a submit or a renewal always waits."""
    q = PostgresQueue(pg_url)

    def setting(cur: psycopg.Cursor) -> str:
        return cur.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"]

    assert q.db.transaction(setting, durable=False) == "off"
    assert q.db.transaction(setting) == "on"
    assert q.db.transaction(setting, write=False) == "on"  # and it did not outlive its transaction
    q.close()
