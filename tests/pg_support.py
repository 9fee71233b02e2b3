"""PostgreSQL for the tests: one fresh database per test session, clean tables per test.

The server is the one at 127.0.0.1:5432 (``COMFYSUP_TEST_POSTGRES`` names another admin URL). The tests
create ``comfysup_test_<random>`` there and drop it at the end, so they never touch anyone's data and
two sessions running at once do not meet. An unreachable server is an error, not a skip: CI must start
it (``.ci/run`` does). Only ``COMFYSUP_SKIP_POSTGRES`` skips these tests, for a machine without one.

Test modules import the fixtures by name: ``from pg_support import pg_url  # noqa: F401``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

ADMIN_URL = os.environ.get("COMFYSUP_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
SKIP_VARIABLE = "COMFYSUP_SKIP_POSTGRES"
TABLES = ("jobs", "attempts", "machines", "deliveries", "workflows", "affinity_skips", "catalogues",
          "server_catalogues", "job_refusals", "assets", "job_assets", "asset_chunks", "server_assets", "api_assets",
          "api_endpoints", "output_assets", "job_previews", "slot_orders", "tenants", "job_labels")

_created: dict[str, str] = {}
"""The session's database URL, made once even when several modules import the fixture."""


def _with_dbname(url: str, dbname: str) -> str:
    """The same server URL with another database (a URL, as [queue] url wants one)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def _admin() -> object:
    import psycopg

    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {ADMIN_URL} does not answer ({str(exc).strip().splitlines()[0]}). The "
                    f"PostgreSQL tests need it: start it (pg_ctlcluster 15 main start; .ci/run does this), point "
                    f"COMFYSUP_TEST_POSTGRES at another server, or set {SKIP_VARIABLE}=1 to skip them.",
                    pytrace=False)


def session_database(config: pytest.Config) -> str:
    """Create the session's database on first use; drop it when the session ends."""
    if os.environ.get(SKIP_VARIABLE):
        pytest.skip(f"{SKIP_VARIABLE} is set: PostgreSQL tests skipped")
    if "url" in _created:
        return _created["url"]
    name = f"comfysup_test_{uuid.uuid4().hex[:12]}"
    admin = _admin()
    admin.execute(f"CREATE DATABASE {name}")  # type: ignore[attr-defined]
    admin.close()  # type: ignore[attr-defined]
    _created["url"] = _with_dbname(ADMIN_URL, name)

    def drop() -> None:
        _created.pop("url", None)
        conn = _admin()
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]

    config.add_cleanup(drop)
    return _created["url"]


def truncate(url: str) -> None:
    """Empty every table the queue made (and restart the sequences), so each test starts from nothing."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        present = [t for t in TABLES if conn.execute("SELECT to_regclass(%s)", (t,)).fetchone()[0]]
        if present:
            conn.execute(f"TRUNCATE {', '.join(present)} RESTART IDENTITY")


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of the session's test database, with empty tables."""
    url = session_database(request.config)
    truncate(url)
    yield url
