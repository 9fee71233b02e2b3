"""bench/tenant_cost.py: what tenants cost a claim and an end on PostgreSQL, one connection, A/B interleaved.

Each tenant count (--tenants, default 1000 and 0: every job the default tenant's) gets a database of its own,
filled as bench/scale_fleet.py fills a cell (job i is tenant ``t<i mod N>``'s) with --fill jobs, then vacuumed.
One queue connection per database claims jobs and holds --held of them running, ending the oldest (``complete``
with a fleet-sized trace) as each new one is claimed, as a fleet of --held GPUs would, so tenants whose jobs all
run and are not yet charged sit where a fleet's do. The databases take turns in blocks of --block cycles (claim,
then end), so the machine's drift hits all alike. The figure is the serving backend's CPU
(``/proc/PID/schedstat``: nanoseconds on a CPU, Linux only) per claim and per end, the first --held claims left
out; and after the run, how many tenants a claim walks past (those before the first with a job queued).

    .venv/bin/python bench/tenant_cost.py                            # 1,000 tenants against none
    .venv/bin/python bench/tenant_cost.py --tenants 1000,100,0 --cycles 3000
    .venv/bin/python bench/tenant_cost.py --tenants 1000,1000,0 --setup "DROP TRIGGER attempts_ended_charge ON attempts"
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module: this folder goes last on the path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psycopg
from scale_fleet import fill, trace_of
from workload import pg_database

from comfysup.queue.postgres import PostgresQueue
from comfysup.queue.values import Output

OUTPUT = [Output(name="cost_00001_.png", size=1_234_567, sha256="ab" * 32, node_id="7")]
WALKED = """SELECT count(*) AS n FROM tenants t WHERE ((t.gpu_seconds + t.running_seconds) / t.weight, t.name) <
    (SELECT (f.gpu_seconds + f.running_seconds) / f.weight, f.name FROM tenants f
     WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = f.name AND j.state = 'queued')
     ORDER BY (f.gpu_seconds + f.running_seconds) / f.weight, f.name LIMIT 1)"""
"""The tenants a claim walks past now: those before the first with a job queued."""


@dataclass
class Side:
    """One tenant count's database, its queue connection and what it cost so far."""

    tenants: int
    queue: Any
    admin: Any
    pid: int
    held: deque[Any] = field(default_factory=deque)
    claim_s: float = 0.0
    end_s: float = 0.0
    claims: int = 0
    ends: int = 0


def cpu_s(pid: int) -> float:
    """Seconds process ``pid`` has run on a CPU (nanosecond resolution, unlike /proc/PID/stat's ticks)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def open_side(stack: contextlib.ExitStack, admin_url: str, tenants: int, jobs: int, setup: str) -> Side:
    url, _, drop = pg_database(admin_url, "comfysup_tenant_cost")
    stack.callback(drop)
    filling = PostgresQueue(url)
    fill(filling, jobs, tenants)
    filling.close()
    admin = psycopg.connect(url, autocommit=True)
    stack.callback(admin.close)
    if setup:
        admin.execute(setup)
    admin.execute("VACUUM ANALYZE")
    queue = PostgresQueue(url)
    stack.callback(queue.close)
    side = Side(tenants, queue, admin, 0)
    side.held.append(queue.leases.claim("cost/warm", "gpu0", 3600))  # opens the connection
    side.pid = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                             "AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchone()[0]
    return side


def cycle(side: Side, i: int, held: int, measure: bool) -> None:
    """One claim, and the end of the oldest held job once more than ``held`` run."""
    c0 = cpu_s(side.pid)
    claim = side.queue.leases.claim(f"cost/{i}", "gpu0", 3600)
    c1 = cpu_s(side.pid)
    if claim is not None:
        side.held.append(claim)
    ended = len(side.held) > held
    if ended:
        side.queue.leases.complete(side.held.popleft(), OUTPUT, trace=trace_of(time.time() - 5.0, time.time()))
    c2 = cpu_s(side.pid)
    if measure:
        side.claim_s, side.end_s = side.claim_s + c1 - c0, side.end_s + c2 - c1
        side.claims, side.ends = side.claims + 1, side.ends + ended


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", default="1000,0", help="tenant counts, comma-separated (0: default only)")
    parser.add_argument("--held", type=int, default=256, help="jobs held running: the fleet's GPUs (default 256)")
    parser.add_argument("--cycles", type=int, default=2000, help="measured claims per database (default 2000)")
    parser.add_argument("--block", type=int, default=50, help="cycles a database runs before the next's turn")
    parser.add_argument("--fill", type=int, help="jobs queued at the start (default: the fleet bench's 2,600 at "
                        "256 GPUs, scaled to --held, and at least --held + --cycles + 100)")
    parser.add_argument("--setup", default="", help="SQL run in the first database only, after its fill: a variant (a "
                        "trigger, an index) against the code as it is (--tenants 1000,1000)")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="a server where the bench may create and drop databases of its own")
    args = parser.parse_args()
    jobs = args.fill or max(args.held * 2600 // 256, args.held + args.cycles + 100)
    with contextlib.ExitStack() as stack:
        sides = [open_side(stack, args.postgres, int(t), jobs, "" if i else args.setup)
                 for i, t in enumerate(args.tenants.split(","))]
        for side in sides:
            for i in range(args.held - 1):
                cycle(side, i, args.held, measure=False)
        for start in range(0, args.cycles, args.block):
            for side in sides:
                for i in range(start, min(args.cycles, start + args.block)):
                    cycle(side, args.held + i, args.held, measure=True)
        print(f"{'tenants':>7} {'claims':>6} {'claim CPU ms':>12} {'end CPU ms':>10} {'sum ms':>7} {'passed':>6}")
        for s in sides:
            walked = s.admin.execute(WALKED).fetchone()[0] if s.tenants else 0
            claim, end = s.claim_s / max(1, s.claims) * 1e3, s.end_s / max(1, s.ends) * 1e3
            print(f"{s.tenants:>7} {s.claims:>6} {claim:>12.3f} {end:>10.3f} {claim + end:>7.3f} {walked:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
