"""Row G1 at a small size (the full one: bench/chaos.py --rows G1): the queue's PostgreSQL, a server of the row's
own, killed or stopped under running prompts and started again after outages shorter and longer than a lease.
Nothing lost, no job run twice at once, a prompt interrupted only by an outage longer than the lease; submits in
an outage refused, storing nothing. Marked ``chaos`` (about a minute): run it with ``-m chaos``."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import pg_rows
from chaos.checker import Evidence
from chaos.faults import FaultLog


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_g1_postgres_killed_and_restarted_at_random_moments(tmp_path: Path, chaos_seed: int) -> None:
    report = pg_rows.g1_postgres_outages(tmp_path, chaos_seed, jobs=24, outages=4)
    print(report.explain())
    print(report.figures)
    assert report.ok, report.explain()
    f = report.figures
    assert f["outages_short"] >= 1 and f["outages_long"] >= 1, f
    assert f["interruptions"] == f["interrupted_in_long_outages"] >= 1, f  # every interruption past a lease
    assert report.states["done"] == report.jobs


def test_an_interruption_is_matched_only_to_an_outage_of_a_lease(tmp_path: Path) -> None:
    """The count G1 judges by: an interrupted run in a long outage is allowed, one in a short outage or outside
    any is a failure."""
    log = tmp_path / "exec.jsonl"
    lines = []
    for n, end in enumerate((105.0, 205.0, 305.0)):
        lines.append(f'{{"event": "start", "pid": 1, "number": {n}, "prompt_id": "j{n}", "started_at": {end - 3}}}')
        lines.append(f'{{"event": "end", "pid": 1, "number": {n}, "ended_at": {end}, "outcome": "interrupted"}}')
    log.write_text("\n".join(lines) + "\n")
    faults = FaultLog(tmp_path / "faults.jsonl")
    faults.record("db_down", at=100.0, until=108.0, past_lease=True)
    faults.record("db_down", at=203.0, until=206.0, past_lease=False)
    evidence = Evidence(root=tmp_path, queue_path=tmp_path / "q", store=tmp_path, exec_logs=[log],
                        faults=faults.faults(), submissions=[])
    counted = pg_rows.interruptions(evidence)
    assert (counted["interruptions"], counted["interrupted_in_long_outages"]) == (3, 1)
    assert [e.split(":")[0] for e in counted["early"]] == ["j1", "j2"]
