"""bench/fairness.py: tenants' fair shares of the fleet, through `comfysup run` on fake ComfyUI servers (4 slots).

1. **A small tenant behind a big one.** Tenant A has --a-jobs jobs queued (5,000); tenant B submits one job every
   --every seconds (`comfysup submit --tenant b`, a one-line file each time) for --b-jobs jobs. B's wait (from
   its submit to the start of its execution: the claim, plus the wait in ComfyUI's queue of a job claimed ahead)
   against a job's duration (its execution, the trace's run_s), median and p95, run twice on a fresh
   queue: without fairness (no tenants: every job the default tenant's, strict priority then age) and with it
   (A's jobs tenant a, B's tenant b, weights 1:1). Without fairness B's jobs wait behind all of A's: a job of B
   that had not started when the run stopped is counted with the wait it had so far (a lower bound), and the
   wait A's backlog implies (A's jobs ahead of it x the mean duration / 4 slots) is printed beside it.
2. **Weights 3:1 under full load.** A (weight 3, jobs of 3 nodes) and B (weight 1, jobs of 6 nodes: twice as
   long) both have more work than the run can do; the execution seconds (each attempt's trace's run_s, what the
   queue charges) of the attempts that ended in the window, by tenant: the shares must be within 5 points of
   75/25 (by seconds, not by job counts: B runs half as many jobs per second of slot time).

The claim's cost with 1,000 tenants against none, on PostgreSQL: `bench/scale.py --only fleet --backend postgres
--tenants 0,1000` (see docs/tenants.md for the figures and the command).

    .venv/bin/python bench/fairness.py                 # both parts, 1 s jobs (node 330 ms)
    .venv/bin/python bench/fairness.py --part wait --b-jobs 10 --every 3
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import copy
import json
import signal
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
SLOTS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workflow(n: int, inverts: int = 1) -> dict[str, Any]:
    """The trivial graph with ``inverts`` ImageInvert nodes in a chain, its colour ``n`` (ComfyUI's cache never
    serves one job's nodes to another)."""
    graph = copy.deepcopy(TRIVIAL)
    graph["1"]["inputs"]["color"] = n % 16_777_216
    for i in range(1, inverts):
        graph[str(10 + i)] = {"class_type": "ImageInvert", "inputs": {"image": [str(10 + i - 1) if i > 1 else "2", 0]}}
    if inverts > 1:
        graph["3"]["inputs"]["images"] = [str(10 + inverts - 1), 0]
    return graph


def lines(tenant: str, first: int, n: int, inverts: int = 1) -> list[dict[str, Any]]:
    out = []
    for i in range(first, first + n):
        line: dict[str, Any] = {"id": str(uuid.uuid4()), "workflow": workflow(i, inverts)}
        if tenant:
            line["tenant"] = tenant
        out.append(line)
    return out


class Fleet:
    """`comfysup run` with 4 fake servers over a fresh SQLite queue in ``tmp``; ``submit`` as a person would."""

    def __init__(self, tmp: Path, node_ms: float, tenants: dict[str, Any]) -> None:
        self.tmp = tmp
        self.config = tmp / "config.toml"
        doc: dict[str, Any] = {
            "queue": {"path": str(tmp / "var" / "queue.db")}, "store": {"dir": str(tmp / "var" / "results")},
            "comfyui": {"main": str(ROOT / "fake_comfy" / "main.py"), "python": sys.executable, "gpus": f"cpu:{SLOTS}",
                        "base_port": free_port(), "base_directory": str(tmp / "var" / "comfyui"),
                        "extra_args": ["--node-ms", str(node_ms)], "startup_seconds": 60.0},
            "runner": {"jitter": False}, "metrics": {"listen": ""}}
        if tenants:
            doc["tenants"] = tenants
        self.config.write_bytes(tomli_w.dumps(doc).encode())
        self.proc: subprocess.Popen[bytes] | None = None
        self.n = 0

    def submit(self, jobs: list[dict[str, Any]]) -> None:
        self.n += 1
        path = self.tmp / f"jobs{self.n}.jsonl"
        path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        subprocess.run([sys.executable, "-m", "comfysup", "submit", str(path), "--config", str(self.config)],
                       check=True, capture_output=True, cwd=ROOT)

    def start(self) -> None:
        self.log = open(self.tmp / "supervisor.log", "wb")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(self.config)],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait_running(self, timeout: float = 120.0) -> float:
        """Until the first attempt started (every slot's server up takes a while on a loaded machine)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rows("SELECT count(*) FROM attempts")[0][0]:
                return time.time()
            time.sleep(0.25)
        raise SystemExit(f"no job started in {timeout:g} s; see {self.tmp / 'supervisor.log'}")

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.tmp / "var" / "queue.db", timeout=30) as db:
            return db.execute(sql).fetchall()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(90)
            self.log.close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def wait_run(tmp: Path, fair: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Part 1, one run: A's backlog, then B's jobs one every ``every`` seconds; B's waits and durations."""
    fleet = Fleet(tmp, args.node_ms, {"a": {"weight": 1}, "b": {"weight": 1}} if fair else {})
    fleet.submit(lines("a" if fair else "", 0, args.a_jobs))
    fleet.start()
    try:
        fleet.wait_running()
        time.sleep(args.every)  # the fleet busy with A's jobs before B's first
        b_ids = []
        for i in range(args.b_jobs):
            job = lines("b" if fair else "", 1_000_000 + i, 1)
            b_ids.append(job[0]["id"])
            fleet.submit(job)
            time.sleep(args.every)
        deadline = time.monotonic() + args.every * 4 + 30
        while time.monotonic() < deadline:
            left = fleet.rows("SELECT count(*) FROM jobs WHERE state != 'done' AND id IN ("
                              + ",".join(f"'{i}'" for i in b_ids) + ")")[0][0]
            if not left or not fair:
                break
            time.sleep(0.25)
        stopped = time.time()
        # Its execution's start: the claim, plus the wait in ComfyUI's queue of a job claimed ahead (posted behind
        # the prompt that ran there); the job's duration: its execution (the trace's run_s).
        rows = fleet.rows("SELECT j.id, j.submitted_at, a.started_at + coalesce(json_extract(a.trace, "
                          "'$.comfyui_wait_s'), 0), coalesce(json_extract(a.trace, '$.run_s'), a.ended_at - "
                          "a.started_at), a.ended_at FROM jobs j LEFT JOIN attempts a ON a.job_id = j.id AND "
                          "a.attempt = 1")
    finally:
        fleet.stop()
    done = [r for r in rows if r[4] is not None]
    duration = statistics.mean(r[3] for r in done)
    b = {i for i in b_ids}
    waits = [(r[2] if r[2] is not None else stopped) - r[1] for r in rows if r[0] in b]
    started = sum(1 for r in rows if r[0] in b and r[2] is not None)
    a_done = sum(1 for r in done if r[0] not in b)
    return {"fair": fair, "duration": duration, "median": statistics.median(waits), "p95": pct(waits, 0.95),
            "started": started, "b_jobs": len(b_ids), "a_done": a_done,
            "implied": (args.a_jobs - a_done) * duration / SLOTS}


def share_run(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: weights 3:1, both tenants backlogged, ``seconds`` of full load; each tenant's slot seconds."""
    fleet = Fleet(tmp, args.node_ms, {"a": {"weight": 3}, "b": {"weight": 1}})
    per_second = SLOTS / (3 * args.node_ms / 1000)
    backlog = int(per_second * args.seconds * 1.5) + 100
    fleet.submit(lines("a", 0, backlog) + lines("b", 1_000_000, backlog, inverts=4))
    fleet.start()
    try:
        t0 = fleet.wait_running()
        time.sleep(args.seconds)
        t1 = time.time()
        rows = fleet.rows(f"SELECT j.tenant, coalesce(json_extract(a.trace, '$.run_s'), a.ended_at - a.started_at) "
                          f"FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.ended_at BETWEEN {t0} AND {t1}")
    finally:
        fleet.stop()
    held = {"a": 0.0, "b": 0.0}
    jobs = {"a": 0, "b": 0}
    for tenant, seconds in rows:  # what the queue charges each tenant: an attempt's execution (its trace's run_s)
        held[tenant] += seconds
        jobs[tenant] += 1
    total = sum(held.values()) or 1.0
    return {"shares": {k: v / total for k, v in held.items()}, "seconds": held, "jobs": jobs, "window": t1 - t0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["wait", "share"], action="append", help="run only these (repeatable)")
    parser.add_argument("--a-jobs", type=int, default=5000, help="tenant A's backlog in part 1 (default 5000)")
    parser.add_argument("--b-jobs", type=int, default=15, help="tenant B's jobs in part 1 (default 15)")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between B's submits (default 3)")
    parser.add_argument("--node-ms", type=float, default=330.0, help="the fake's time a node (3 nodes a job)")
    parser.add_argument("--seconds", type=float, default=90.0, help="part 2's measured window (default 90)")
    args = parser.parse_args()
    parts = set(args.part or ["wait", "share"])
    (ROOT / "var").mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="bench-fairness-", dir=ROOT / "var"))
    print(f"# bench/fairness.py: {SLOTS} slots of fake ComfyUI, node {args.node_ms:g} ms; work in {base}")
    if "wait" in parts:
        results = []
        for fair in (False, True):
            (base / f"wait-{fair}").mkdir()
            results.append(wait_run(base / f"wait-{fair}", fair, args))
        print(f"\n1. tenant A: {args.a_jobs} jobs queued; tenant B: one job every {args.every:g} s, "
              f"{args.b_jobs} jobs")
        print(f"{'':16} {'job s':>6} {'B wait p50 s':>13} {'B wait p95 s':>13} {'p50/job':>8} {'p95/job':>8} "
              f"{'B started':>10} {'A done':>7}")
        for r in results:
            name = "with fairness" if r["fair"] else "without"
            print(f"{name:16} {r['duration']:>6.2f} {r['median']:>13.2f} {r['p95']:>13.2f} "
                  f"{r['median'] / r['duration']:>8.2f} {r['p95'] / r['duration']:>8.2f} "
                  f"{r['started']:>4}/{r['b_jobs']:<5} {r['a_done']:>7}")
            if not r["fair"] and r["started"] < r["b_jobs"]:
                print(f"{'':16} (B's jobs not started when the run stopped: waits are lower bounds; A's backlog "
                      f"implies about {r['implied']:,.0f} s more)")
    if "share" in parts:
        (base / "share").mkdir()
        r = share_run(base / "share", args)
        a, b = r["shares"]["a"], r["shares"]["b"]
        print(f"\n2. weights 3:1 under full load, {r['window']:.0f} s: execution seconds A {r['seconds']['a']:.1f} "
              f"({a:.1%}, {r['jobs']['a']} jobs of 3 nodes), B {r['seconds']['b']:.1f} ({b:.1%}, {r['jobs']['b']} "
              f"jobs of 6 nodes); goal 75/25 within 5 points: {'yes' if abs(a - 0.75) <= 0.05 else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
