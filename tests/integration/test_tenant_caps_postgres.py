"""A tenant's max_running holds across machines on one PostgreSQL queue: two queue objects (two machines'
connections) claim and complete at once from threads, and the running jobs of the capped tenant, read by a
third connection while they work, never pass its cap."""

from __future__ import annotations

import threading
import time

from pg_support import pg_url  # noqa: F401  (a fixture)
from queue_contract import make_job

from comfysup import records
from comfysup.queue.postgres import PostgresQueue
from comfysup.queue.tenants import TenantLimits

CAP = 2
CLAIMERS = 6


def test_max_running_holds_across_two_machines(pg_url: str) -> None:  # noqa: F811
    limits = {"a": TenantLimits(max_running=CAP)}
    machines = [PostgresQueue(pg_url), PostgresQueue(pg_url)]
    for m in machines:
        m.tenants = limits
    jobs = [records.replace(make_job(n), tenant="a") for n in range(40)]
    machines[0].intake.submit(jobs + [records.replace(make_job(100 + n), tenant="b") for n in range(40)])
    watcher = PostgresQueue(pg_url)
    seen: list[int] = []
    done = threading.Event()
    start = threading.Barrier(CLAIMERS)
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        queue = machines[i % 2]
        try:
            start.wait()
            while not done.is_set():
                claim = queue.leases.claim(f"m{i % 2}/1/gpu{i}/t", f"gpu{i}", 30.0)
                if claim is None:
                    return
                queue.leases.complete(claim, [])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        seen.append(next(c.running for c in watcher.reads.tenant_counts() if c.tenant == "a"))
    done.set()
    for t in threads:
        t.join(timeout=10)
    for q in (*machines, watcher):
        q.close()
    assert errors == []
    assert max(seen) <= CAP and len(seen) > 10
    counts = {c.tenant: c for c in PostgresQueue(pg_url).reads.tenant_counts()}
    assert counts["a"].done == 40 and counts["b"].done == 40
