"""How many GPUs one queue feeds: the queue driven as N runners would drive it.

Each simulated slot does what one runner with one GPU does to the queue, nothing else: ``claim`` (the claim
latency is this call's wall time), ``record_prompt`` (the prompt number, fenced), a ``heartbeat`` every
lease/3 while the job runs, and at the job's end the fenced ``heartbeat`` a runner makes before it touches the
job's files (comfysup.runner.download: durable on PostgreSQL, ``renew`` below), then ``complete`` with a trace
(the shape ``Trace.as_dict`` stores: 12 nodes with their times) and one output row. The job itself is a wait of
``job_s``.

Slots are spread over worker processes, each with ONE queue connection, running its slots as a discrete-event
loop (a heap of what each slot does next and when). With ``processes == slots`` every slot is its own
connection, as real runners are; PostgreSQL's ``max_connections`` (100 by default) and two shared cores make
that impossible at 256 slots, so there a process multiplexes slots on one connection, as a pooler would. The
time a slot waited for its process (``lag``) is printed, so a run where the simulation, not the queue, fell
behind shows itself.

The database's CPU: for PostgreSQL, the server processes' CPU (psutil) over the measured window: the backends
of this benchmark's own database (its name is in their command line) and the server's shared processes (WAL
writer, checkpointer, background writer), which other databases on a shared server also use. For SQLite the
engine runs inside the workers, so the database's CPU is the workers' CPU (SQLite and the Python around it).

A slot whose lease ran out before its next call (the simulation fell behind by more than a lease: with
compressed leases of a few seconds on a loaded machine) gets LeaseLost as a runner would; it is counted in
``lost`` and the slot claims again (the job went back to the queue and another slot runs it).

Slots start spread over one job length (a fleet's GPUs do not end their jobs in step), and the first job length
of every run is left out of the figures (warm-up).

Time compression: a slot whose jobs last ``job_s / k`` with a lease of ``lease / k`` makes the same calls per
second as ``k`` slots with jobs of ``job_s`` and that lease: claims, prompts, dones and heartbeats all scale by
k. What does not scale is the number of connections and of running rows (the running rows sit in their own
index range, and claims walk the ready range), so ``--slots 256 --job-s 1 --lease 3`` puts the load of 1,280
GPUs with 5 s jobs (lease 15 s) on the queue's CPU, disk and locks, but not its connection count.
"""

from __future__ import annotations

import heapq
import json
import multiprocessing
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from own_postgres import server_processes
from workload import pg_database

from comfysup.errors import LeaseLost
from comfysup.queue.base import NewJob
from comfysup.queue.values import Output

CTX = multiprocessing.get_context("fork")
TRIVIAL = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
           "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "scale"}}}
TRIVIAL_JSON = json.dumps(TRIVIAL, sort_keys=True, separators=(",", ":"))
CLASSES = ("CheckpointLoaderSimple", "CLIPTextEncode", "CLIPTextEncode", "EmptyLatentImage", "KSampler",
           "VAEDecode", "SaveImage", "LoraLoader", "CLIPTextEncode", "ConditioningCombine", "ImageScale", "SaveImage")


def trace_of(started: float, ended: float) -> dict[str, Any]:
    """A trace of the size and shape a runner stores for a 12-node job (``Trace.as_dict``)."""
    step = (ended - started) / (len(CLASSES) + 2)
    nodes = [{"id": str(i + 1), "class_type": c, "started": started + (i + 1) * step, "seconds": round(step, 6)}
             for i, c in enumerate(CLASSES)]
    phases = [["claimed", started], ["posted", started + 0.001], ["executing", started + step],
              ["downloading", ended - step], ["recorded", ended]]
    return {"phases": phases, "nodes": nodes, "cached": [], "total_nodes": len(CLASSES),
            "progress": {"phase": "downloading", "node": len(CLASSES), "nodes": len(CLASSES), "cached": 0}}


@dataclass(frozen=True)
class Cell:
    backend: str  # "sqlite" or "postgres"
    slots: int
    job_s: float
    lease_s: float
    seconds: float  # measured window, after one job length of warm-up
    processes: int
    tenants: int = 0  # jobs spread over this many tenants (0: all the default tenant's)


def jobs_needed(cell: Cell) -> int:
    return int(cell.slots * (cell.seconds + cell.job_s * 2) / cell.job_s * 1.3) + cell.slots * 2 + 100


def fill(queue: Any, n: int, tenants: int = 0) -> None:
    """``n`` jobs; with ``tenants``, job i is tenant ``t<i mod tenants>``'s, so every tenant has jobs queued."""
    batch = 5000
    for start in range(0, n, batch):
        queue.intake.submit([NewJob(id=str(uuid.uuid4()), workflow=TRIVIAL, spec_hash=f"s{start + i}",
                                    workflow_json=TRIVIAL_JSON, workflow_name="scale",
                                    tenant=f"t{(start + i) % tenants}" if tenants else "")
                             for i in range(min(batch, n - start))])


def _worker(open_queue: Any, cell: Cell, slots: list[int], t0: float, out: str, measured: Any) -> None:
    """Run ``slots`` from t0 until t0 + warm-up + window; write every call's (kind, start, seconds, lag). The
    connection stays open until the parent has ``measured`` the server's CPU (a backend's CPU goes with it)."""
    queue = open_queue()
    end = t0 + cell.job_s + cell.seconds
    beat = cell.lease_s / 3
    host = f"scale{os.getpid()}"
    owners = {s: f"{host}/{os.getpid()}/gpu{s}/{uuid.uuid4().hex[:8]}" for s in slots}
    held: dict[int, Any] = {}
    started: dict[int, float] = {}
    gen = dict.fromkeys(slots, 0)  # a slot's job number: a heartbeat of an ended job is dropped
    heap: list[tuple[float, int, str, int]] = [(t0 + cell.job_s * s / cell.slots, s, "claim", 0) for s in slots]
    heapq.heapify(heap)
    calls: list[tuple[str, float, float, float]] = []
    prompt = 0
    idle_claims = lost = 0
    while heap:
        due, slot, kind, job = heapq.heappop(heap)
        if kind == "heartbeat" and job != gen[slot]:
            continue
        if due >= end:
            break
        now = time.time()
        if due > now:
            time.sleep(due - now)
        t = time.time()
        lag = t - due
        if kind == "claim":
            claim = queue.leases.claim(owners[slot], f"gpu{slot}", cell.lease_s)
            calls.append(("claim", t, time.time() - t, lag))
            if claim is None:  # the fill ran out: count it, try again as a runner's poll would
                idle_claims += 1
                heapq.heappush(heap, (time.time() + 0.25, slot, "claim", 0))
                continue
            prompt += 1
            t2 = time.time()
            try:
                queue.leases.record_prompt(claim, f"gpu{slot}", prompt, url="http://127.0.0.1:8188")
            except LeaseLost:  # the slot fell behind its lease (the simulation's lag): as a runner, drop it
                lost += 1
                heapq.heappush(heap, (time.time(), slot, "claim", 0))
                continue
            calls.append(("record_prompt", t2, time.time() - t2, 0.0))
            held[slot], started[slot] = claim, time.time()
            gen[slot] += 1
            heapq.heappush(heap, (started[slot] + cell.job_s, slot, "done", gen[slot]))
            if beat < cell.job_s:
                heapq.heappush(heap, (started[slot] + beat, slot, "heartbeat", gen[slot]))
        elif kind == "heartbeat":
            try:
                queue.leases.heartbeat(held[slot], cell.lease_s)
            except LeaseLost:
                lost += 1
                gen[slot] += 1  # its done is dropped too
                del held[slot]
                heapq.heappush(heap, (time.time(), slot, "claim", 0))
                continue
            calls.append(("heartbeat", t, time.time() - t, lag))
            if due + beat < started[slot] + cell.job_s:
                heapq.heappush(heap, (due + beat, slot, "heartbeat", job))
        else:
            if job != gen[slot]:
                continue  # the job's lease was lost at a heartbeat
            claim = held.pop(slot)
            outputs = [Output(name=f"scale_{prompt:05d}_.png", size=1_234_567, sha256=uuid.uuid4().hex * 2,
                              node_id="7")]
            try:
                queue.leases.heartbeat(claim, cell.lease_s)  # the runner's renewal before its download
                t2 = time.time()
                calls.append(("renew", t, t2 - t, lag))
                queue.leases.complete(claim, outputs, trace=trace_of(started[slot], t))
                calls.append(("complete", t2, time.time() - t2, 0.0))
            except LeaseLost:
                lost += 1
            heapq.heappush(heap, (time.time(), slot, "claim", 0))
    measured.wait(60.0)  # bounded: a worker whose parent died ends anyway
    queue.close()
    Path(out).write_text(json.dumps({"calls": calls, "idle_claims": idle_claims, "lost": lost}))


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def postgres_processes(database: str) -> list[Any]:
    """The PostgreSQL server's processes that serve this database, and its shared ones (not other databases')."""
    import psutil

    procs = []
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if not (p.info["name"] or "").startswith("postgres") and not cmd.startswith("postgres"):
            continue
        if database in cmd or not any(w in cmd for w in ("127.0.0.1(", "[local]", "::1(")):
            procs.append(p)  # this benchmark's backends, the postmaster, WAL writer, checkpointer, ...
    return procs


def cpu_seconds(procs: list[Any]) -> dict[int, float]:
    got = {}
    for p in procs:
        try:
            t = p.cpu_times()
            got[p.pid] = t.user + t.system
        except Exception:  # a backend that ended
            pass
    return got


def run_cell(cell: Cell, open_queue: Any, workdir: Path, database: str | None,
             postmaster: Any = None) -> dict[str, Any]:
    """One cell; ``open_queue`` opens a fresh connection to an already filled queue. ``postmaster``: the server is
    the benchmark's own (bench/own_postgres.py), and every one of its processes counts as this database's."""
    import psutil

    per = [list(range(cell.slots))[i::cell.processes] for i in range(cell.processes)]
    t0 = time.time() + 1.0 + 0.02 * cell.processes
    outs = [workdir / f"w{i}.json" for i in range(cell.processes)]
    measured = CTX.Event()
    procs = [CTX.Process(target=_worker, args=(open_queue, cell, s, t0, str(o), measured))
             for s, o in zip(per, outs, strict=True)]
    for p in procs:
        p.start()
    workers = [psutil.Process(p.pid) for p in procs]
    window = (t0 + cell.job_s, t0 + cell.job_s + cell.seconds)
    time.sleep(max(0.0, window[0] - time.time()))
    if postmaster is not None:
        db_procs = server_processes(postmaster)
        mine = {p.pid for p in db_procs}
    else:
        db_procs = postgres_processes(database) if database else []
        mine = {p.pid for p in db_procs if database and database in " ".join(p.cmdline())}
    before = (cpu_seconds(workers), cpu_seconds(db_procs), time.time())
    time.sleep(max(0.0, window[1] - time.time()))
    after = (cpu_seconds(workers), cpu_seconds(db_procs), time.time())
    measured.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a worker failed (exit {p.exitcode})")
    calls: list[tuple[str, float, float, float]] = []
    idle = lost = 0
    for o in outs:
        got = json.loads(o.read_text())
        calls += [tuple(c) for c in got["calls"] if window[0] <= c[1] < window[1]]
        idle += got["idle_claims"]
        lost += got["lost"]
    wall = after[2] - before[2]
    client_cpu = sum(after[0].get(k, 0.0) - v for k, v in before[0].items())
    db_cpu = sum(after[1].get(k, 0.0) - v for k, v in before[1].items()) if database else client_cpu
    # This database's own backends alone: on a shared server the WAL writer, checkpointer and postmaster also
    # work for other databases (other people's tests here), which the total above takes in.
    own_cpu = sum(after[1].get(k, 0.0) - v for k, v in before[1].items() if k in mine) if database else client_cpu
    by = {k: [c for c in calls if c[0] == k] for k in ("claim", "record_prompt", "heartbeat", "renew", "complete")}
    claims = [c[2] for c in by["claim"]]
    done = len(by["complete"])
    gap = statistics.median(c[2] for c in by["complete"]) + statistics.median(claims) + \
        statistics.median(c[2] for c in by["record_prompt"]) + statistics.median(c[2] for c in by["renew"]) \
        if done and claims else float("nan")
    return {"cell": cell, "claims_s": len(claims) / wall, "done_s": done / wall,
            "heartbeats_s": len(by["heartbeat"]) / wall, "p50_ms": pct(claims, 0.5) * 1e3,
            "p99_ms": pct(claims, 0.99) * 1e3, "complete_p99_ms": pct([c[2] for c in by["complete"]], 0.99) * 1e3,
            "lag_p99_ms": pct([c[3] for c in calls], 0.99) * 1e3, "db_cpu_pct": db_cpu / wall * 100,
            "db_cpu_ms_job": db_cpu / max(1, done) * 1e3, "own_ms_job": own_cpu / max(1, done) * 1e3,
            "client_cpu_pct": client_cpu / wall * 100,
            "busy": cell.job_s / (cell.job_s + gap), "idle_claims": idle, "lost": lost,
            "expected_s": cell.slots / cell.job_s,
            # Every write transaction of a job: SQLite serialises them on one lock. Medians, not sums: on a shared
            # machine a sum takes in every moment a process waited for a CPU.
            "write_ms_job": sum(statistics.median(c[2] for c in v) * len(v) for v in by.values() if v)
            / max(1, done) * 1e3}


HEADER = (f"{'backend':>8} {'tenants':>7} {'slots':>5} {'job s':>5} {'lease':>5} {'procs':>5} {'claims/s':>8} "
          f"{'want/s':>7} {'hb/s':>6} {'p50 ms':>7} {'p99 ms':>7} {'done p99':>8} {'lag p99':>7} {'DB CPU %':>8} "
          f"{'ms/job':>6} {'own ms/job':>10} {'clients %':>9} {'busy':>6} {'lost':>5}")


def row(r: dict[str, Any]) -> str:
    c = r["cell"]
    return (f"{c.backend:>8} {c.tenants:>7} {c.slots:>5} {c.job_s:>5g} {c.lease_s:>5g} {c.processes:>5} "
            f"{r['claims_s']:>8.1f} {r['expected_s']:>7.1f} {r['heartbeats_s']:>6.1f} {r['p50_ms']:>7.2f} "
            f"{r['p99_ms']:>7.2f} "
            f"{r['complete_p99_ms']:>8.2f} {r['lag_p99_ms']:>7.1f} {r['db_cpu_pct']:>8.1f} {r['db_cpu_ms_job']:>6.2f} "
            f"{r['own_ms_job']:>10.2f} {r['client_cpu_pct']:>9.1f} {r['busy']:>6.4f} {r['lost']:>5}")


def capacity(results: list[dict[str, Any]], cores: float, target: float = 0.7) -> list[str]:
    """GPUs one queue keeps busy, from the cost per job of the cells that kept up (claims/s at least 95% of what
    their slots asked): at low rates a fixed cost (each PostgreSQL backend's periodic work, the server's
    shared processes) is spread over few jobs and overstates the cost of one. SQLite serialises every write on
    one lock, so its ceiling is the lock's time per job; PostgreSQL's is its backends' CPU per job over the
    server's cores. ``target``: the share of the lock or the CPU one can fill before the p99 climbs."""
    lines = []
    for backend in ("sqlite", "postgres"):
        rs = [r for r in results if r["cell"].backend == backend]
        if not rs:
            continue
        kept = [r for r in rs if r["claims_s"] >= 0.95 * r["expected_s"]] or rs
        # SQLite: the least lock time a job of the cells that kept up (under contention a transaction's wall
        # time takes in its wait for the lock too); PostgreSQL: the busiest cell that kept up.
        if backend == "sqlite":
            best = min(kept, key=lambda r: r["write_ms_job"])
        else:
            best = max(kept, key=lambda r: r["done_s"])
        c = best["cell"]
        if backend == "sqlite":
            per_job = best["write_ms_job"] / 1e3
            limit = f"the write lock held {best['write_ms_job']:.2f} ms a job"
        else:
            per_job = best["own_ms_job"] / 1e3 / cores
            limit = (f"{best['own_ms_job']:.2f} ms of its backends' CPU a job ({best['db_cpu_ms_job']:.2f} with the "
                     f"server's shared processes) on {cores:g} core(s)")
        jobs_s = target / per_job
        lines.append(f"{backend}: at {c.slots} slots x {c.job_s:g} s ({best['done_s']:.0f} jobs/s), {limit} -> "
                     f"{jobs_s:,.0f} jobs/s at {target:.0%}: "
                     + ", ".join(f"{jobs_s * j:,.0f} GPUs at {j:g} s jobs" for j in (1, 5)))
    return lines


def run_fleet(workdir: Path, backends: list[str], slots: list[int], job_s: list[float], lease_s: float | None,
              seconds: float, max_processes: int, postgres_url: str, pg_cores: float,
              postmaster: Any = None, tenants: tuple[int, ...] = (0,)) -> list[dict[str, Any]]:
    """Every cell, backends (then tenant counts) alternating within each (slots, job length) so the machine's
    drift hits all alike. ``postmaster``: the server at ``postgres_url`` is the benchmark's own (its processes' CPU
    is the database's)."""
    from comfysup.queue.sqlite import SQLiteQueue

    results = []
    print(HEADER, flush=True)
    for n in slots:
        for j in job_s:
            for backend, spread in [(b, t) for b in backends for t in tenants]:
                cell = Cell(backend, n, j, lease_s if lease_s else 15.0, seconds, min(n, max_processes), spread)
                # numbered: a tenant count may come twice (--tenants 1000,0,1000,0)
                here = workdir / f"{backend}-{n}-{j:g}-{spread}-{len(results)}"
                here.mkdir()
                if backend == "sqlite":
                    path = here / "queue.db"
                    q = SQLiteQueue(path)
                    fill(q, jobs_needed(cell), spread)
                    q.close()
                    results.append(run_cell(cell, lambda path=path: SQLiteQueue(path, create=False), here, None))
                else:
                    from comfysup.queue.postgres import PostgresQueue

                    url, name, drop = pg_database(postgres_url, "comfysup_scale")
                    try:
                        q = PostgresQueue(url)
                        fill(q, jobs_needed(cell), spread)
                        q.close()
                        results.append(run_cell(cell, lambda url=url: PostgresQueue(url), here, name, postmaster))
                    finally:
                        drop()
                print(row(results[-1]), flush=True)
    print()
    for line in capacity(results, pg_cores):
        print(line)
    return results
