"""the acceptance row (M1): two machines, two fake servers each, share one PostgreSQL queue; one
supervisor is killed mid-run and started again; the chaos checker must find every job done exactly once.

The fast size (200 jobs) runs with the suite; the full size (2,000 jobs) is marked ``chaos`` and is
bench/chaos.py's row M1. The database is the session's throwaway one (tests/pg_support.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)

from chaos.checker import Report
from chaos.pg import two_machines


def verdict(report: Report) -> None:
    print(report.explain())
    print(report.figures)
    assert report.ok, report.explain()
    assert report.states["done"] == report.jobs, "every job done, none dead or cancelled"
    assert report.figures["held_at_kill"] >= 1, "the kill landed on a machine holding no job"
    assert set(report.figures["done_by"]) == {"machine-a", "machine-b"}, "both machines must have done jobs"


@pytest.mark.timeout(120)
def test_m1_two_machines_one_killed_and_started_again(tmp_path: Path, pg_url: str,  # noqa: F811
                                                      chaos_seed: int) -> None:
    report = two_machines(tmp_path, chaos_seed, pg_url, jobs=120)
    verdict(report)
    assert report.figures["taken_over_by_b"] >= 1, "no claim of the killed machine was finished by the other"


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_m1_two_thousand_jobs(tmp_path: Path, pg_url: str, chaos_seed: int) -> None:  # noqa: F811
    verdict(two_machines(tmp_path, chaos_seed, pg_url, jobs=2000))
