"""bench/chaos.py: every row of the chaos suite at full scale, with the checker's figures.

Each row runs a real ``comfysup run`` on ``cpu:2`` with fake_comfy servers (B1 and K4: ``comfysup
submit``), injects its faults, drains, and is judged by tests/chaos/checker.py. The seed is printed and
recorded; ``--seed`` (or ``CHAOS_SEED``) replays the same fault schedule.

    .venv/bin/python bench/chaos.py                          # every row, full scale (about 40 minutes)
    .venv/bin/python bench/chaos.py --rows K1,K3 --scale 0.1  # a tenth of the counts
    .venv/bin/python bench/chaos.py --json chaos.json --markdown chaos.md

Rows that need root (F1 mounts a tmpfs) are reported as skipped, with the reason, where it is refused.
The exit status is 1 when any row failed. A failed row's folder is kept (its logs, queue, execution
log and fault log are the evidence); a passed row's folder is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself must not be on the path: its queue.py would shadow the standard library's queue module.
sys.path[:] = [str(ROOT), str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from chaos import pg_rows, power_rows, scenarios  # noqa: E402  (after the path above)
from chaos.checker import Report  # noqa: E402
from chaos.faults import SEED_VARIABLE, run_seed  # noqa: E402


@dataclass(frozen=True)
class Row:
    """A row of the fault table: what it injects, its function, and its sizes at full scale."""

    id: str
    fault: str
    run: Callable[..., Report]
    sizes: dict[str, int]
    scaled: tuple[str, ...]
    """The sizes that --scale multiplies (counts of faults and jobs; not a file's lines)."""


ROWS = [
    Row("K1", "kill -9 a runner at random moments (and right after a POST)", scenarios.k1_runner_kills,
        {"jobs": 2000, "kills": 400, "aimed": 100}, ("jobs", "kills", "aimed")),
    Row("K2", "kill -9 the supervisor, start it again", scenarios.k2_supervisor_kills, {"kills": 100}, ("kills",)),
    Row("K3", "kill -9 a ComfyUI server mid-prompt, and just after a job's file landed",
        scenarios.k3_server_kills, {"jobs": 600, "kills": 200, "file_kills": 50}, ("jobs", "kills", "file_kills")),
    Row("K4", "kill -9 comfysup submit mid-file", scenarios.k4_submit_kills,
        {"kills": 200, "lines": 2000}, ("kills",)),
    Row("K5", "kill -9 a runner between ComfyUI's success and the done record", scenarios.k5_kill_after_success,
        {"jobs": 400, "kills": 200}, ("jobs", "kills")),
    Row("Z1", "SIGSTOP a runner past its lease, then SIGCONT", scenarios.z1_stopped_runners,
        {"jobs": 200, "stops": 200}, ("jobs", "stops")),
    Row("Z2", "the database write-locked by another process past the lease", scenarios.z2_lock_past_the_lease,
        {"jobs": 100, "locks": 20}, ("jobs", "locks")),
    Row("D1", "the database write-locked for 0.1-4 s at random", scenarios.d1_short_locks,
        {"jobs": 100, "locks": 1000}, ("jobs", "locks")),
    Row("D2", "a long reader holding a read transaction", scenarios.d2_long_reader, {"jobs": 10000}, ("jobs",)),
    Row("F1", "the result store's disk full (bytes and inodes)", scenarios.f1_disk_full, {"jobs": 200}, ("jobs",)),
    Row("T1", "30% of prompts fail transiently (500, drop, oom, hang)", scenarios.t1_transient_failures,
        {"jobs": 1000}, ("jobs",)),
    Row("O1", "OOM storms: 70% of posts run out of memory (POST /free, one uncounted retry)", scenarios.o1_oom_storms,
        {"jobs": 500}, ("jobs",)),
    Row("H1", "servers answering garbage (fake_comfy's hostile catalogue, half the jobs)", scenarios.h1_hostile_server,
        {"jobs": 400}, ("jobs",)),
    Row("H2", "prompts stuck after /interrupt (a node that ignores the flag)", scenarios.h2_stuck_prompts,
        {"jobs": 200, "stuck": 40}, ("jobs", "stuck")),
    Row("S1", "hostile output names", scenarios.s1_hostile_names, {"jobs": 500}, ("jobs",)),
    Row("S2", "listening sockets", scenarios.s2_listening_sockets, {"jobs": 200}, ("jobs",)),
    Row("S3", "a canary secret in every job's extra_data", scenarios.s3_canary_secret, {"jobs": 500}, ("jobs",)),
    Row("B1", "fuzzed jobs.jsonl files (hypothesis)", scenarios.b1_fuzzed_lines, {"examples": 2000}, ("examples",)),
    Row("R1", "the RabbitMQ consumer killed between a batch's commit and its ack",
        scenarios.r1_consumer_killed_before_ack, {"jobs": 600}, ("jobs",)),
    Row("R2", "the broker restarted mid-stream (rabbitmqctl stop_app / start_app)", scenarios.r2_broker_restarted,
        {"jobs": 400, "restarts": 8}, ("jobs", "restarts")),
    Row("R3", "every broker connection closed (rabbitmqctl close_all_connections)", scenarios.r3_connections_closed,
        {"jobs": 400, "closes": 20}, ("jobs", "closes")),
    Row("A1", "jobs submitted through the API v2 while the API, runners and servers are killed; clients retry "
        "with the same Idempotency-Key", scenarios.a1_api_kills,
        {"api_kills": 50, "runner_kills": 30, "server_kills": 30}, ("api_kills", "runner_kills", "server_kills")),
    Row("U1", "outputs to a bucket (SeaweedFS) stopped and started again while jobs upload; a runner killed in "
        "each outage", scenarios.u1_own_server, {"jobs": 200, "outages": 20}, ("jobs", "outages")),
    Row("U2", "the bucket (SeaweedFS) down for minutes, short upload backoff, runners killed meanwhile; 3 attempts "
        "a job", scenarios.u2_own_server, {"jobs": 300, "down_seconds": 150, "kills": 40}, ("jobs", "kills")),
    Row("G1", "the queue's PostgreSQL killed or stopped at random moments, outages shorter and longer than a lease",
        pg_rows.g1_postgres_outages, {"jobs": 200, "outages": 40}, ("jobs", "outages")),
    Row("P1", "power cut (tests/lazyfs.py: unsynced writes and names forgotten, every process killed) mid-run, just "
        "after an output landed, mid-submit; then comfysup run again", power_rows.p1_power_cuts,
        {"cuts": 60, "jobs_per_cut": 6}, ("cuts",)),
    Row("P1S3", "P1 with the outputs in a bucket (SeaweedFS), the staging folder on the lazy disk",
        power_rows.p1_bucket_own_server, {"cuts": 30, "jobs_per_cut": 6}, ("cuts",)),
    Row("P2", "power cut during comfysup submit of large files (new input images, long jobs files)",
        power_rows.p2_power_cuts_in_submits, {"cuts": 60, "inputs": 4, "input_kib": 8192, "lines": 2000}, ("cuts",)),
]


def sizes_for(row: Row, scale: float, overrides: dict[str, dict[str, int]]) -> dict[str, int]:
    sizes = {k: max(1, round(v * scale)) if k in row.scaled else v for k, v in row.sizes.items()}
    sizes.update(overrides.get(row.id, {}))
    return sizes


def run_row(row: Row, folder: Path, seed: int, sizes: dict[str, int]) -> dict[str, Any]:
    started = time.monotonic()
    result: dict[str, Any] = {"row": row.id, "fault": row.fault, "sizes": sizes}
    try:
        report = row.run(folder, seed, **sizes)
    except scenarios.CannotMount as exc:
        result.update(status="skipped", reason=str(exc))
    except Exception as exc:  # a row that could not finish (a timeout waiting for the drain): a failure
        result.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:2000]}",
                      traceback=traceback.format_exc()[-4000:])
    else:
        result.update(status="ok" if report.ok else "FAILED", report=report.as_dict(), summary=report.summary(),
                      explain=report.explain())
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def markdown(results: list[dict[str, Any]], seed: int, command: str) -> str:
    lines = [f"Seed {seed}; command: `{command}`", "",
             "| row | fault | injected | jobs | done / dead | executions | re-executions matched (by cause) "
             "| unmatched | lost | double | concurrent | missing / partial files | leaks | time | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rep = r.get("report")
        if rep is None:
            lines.append(f"| {r['row']} | {r['fault']} | {_sizes(r['sizes'])} | | | | | | | | | | | {r['seconds']} s "
                         f"| {r['status']}: {r.get('reason', '')[:200]} |")
            continue
        figures = rep["figures"]
        injected = _injected(r["row"], figures, rep)
        causes = ", ".join(f"{k} {v}" for k, v in sorted(rep["re_executions"].items())) or "0"
        states = rep["states"]
        lines.append(
            f"| {r['row']} | {r['fault']} | {injected} | {rep['jobs']} | {states.get('done', 0)} / "
            f"{states.get('dead', 0)} | {rep['executions']} | {sum(rep['re_executions'].values())} ({causes}) | "
            f"{rep['unmatched']} | {rep['lost']} | {rep['double_terminal']} | {rep['concurrent']} | "
            f"{rep['missing_files']} / {rep['partial_files']} | {rep['leaks']} | {r['seconds']:.0f} s "
            f"| {r['status']} |")
    return "\n".join(lines) + "\n"


def _sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sizes.items())


def _injected(row: str, f: dict[str, Any], rep: dict[str, Any]) -> str:
    """What the row's fault counter says actually happened (not what was asked for)."""
    faults = rep["faults"]
    if row == "K1":
        after_post = f.get("kills_after_post", 0)
        return f"{f.get('kills', 0) + after_post} runner kills ({after_post} right after a POST)"
    if row == "K3":
        return (f"{f.get('kills', 0)} kills mid-prompt, {f.get('kills_after_a_file', 0)} just after a file landed "
                f"({f.get('adopted_from_files', 0)} adopted from the output folder)")
    if row == "K4":
        return f"{f.get('kills', 0)} kills ({f.get('finished_before_the_kill', 0)} finished first)"
    if row == "K5":
        return f"{f.get('kills', 0)} kills, {f.get('kills_before_the_done_record', 0)} before the done record"
    if row in ("Z2", "D1"):
        return f"{f.get('locks', 0)} locks" + (f", {f['locked_seconds']} s locked" if "locked_seconds" in f else "")
    if row == "B1":
        return f"{f.get('files', 0)} files, {f.get('bad_lines', 0)} bad lines"
    if row == "H1":
        return (f"{f.get('hostile_jobs', 0)} jobs met {f.get('mutations', 0)} of {f.get('catalogue', 0)} mutations "
                f"(longest attempt {f.get('longest_attempt_seconds')} s, "
                f"{f.get('runner_restarts', 0)} runner restarts)")
    if row == "H2":
        return (f"{f.get('stuck_prompts', 0)} stuck prompts, {f.get('stuck_restarts', 0)} server restarts "
                f"(longest stuck attempt {f.get('longest_stuck_attempt_seconds')} s)")
    if row in ("P1", "P1S3", "P2"):
        during = ", ".join(f"{k} {v}" for k, v in sorted(f.get("cuts_during", {}).items()))
        return (f"{f.get('cuts', 0)} power cuts ({during}); {f.get('files_with_unsynced_writes', 0)} files with "
                f"unsynced writes, {f.get('pages_undone', 0)} overwritten pages undone, "
                f"{f.get('unsynced_pages_kept', 0)} unsynced pages and {f.get('unsynced_folders_kept', 0)} folders' "
                f"entries kept; submits {f.get('submits', {})}")
    if row == "D2":
        return f"WAL peaks {f.get('wal_peak_mib')} MiB"
    if row == "G1":
        return (f"{f.get('outages_short', 0)} outages under {f.get('quiet_limit')} s, {f.get('outages_long', 0)} past "
                f"the {f.get('lease_seconds')} s lease ({f.get('kills', 0)} kills, {f.get('stops', 0)} stops); "
                f"{f.get('interruptions', 0)} interruptions, {f.get('interrupted_in_long_outages', 0)} in outages "
                f"past the lease; {f.get('submits_refused', 0)} submits refused")
    return ", ".join(f"{v} {k}" for k, v in sorted(faults.items())) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(r.id for r in ROWS), help="comma-separated row ids")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the counts (default 1: full scale)")
    parser.add_argument("--size", action="append", default=[], metavar="ROW.KEY=N",
                        help="override one size, e.g. D1.locks=300 (repeatable)")
    parser.add_argument("--seed", type=int, default=None, help=f"replay a seed (or set {SEED_VARIABLE})")
    parser.add_argument("--dir", type=Path, default=None, help="where the rows run (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the folders of passed rows")
    parser.add_argument("--json", type=Path, default=None, help="write every row's result here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)
    if args.seed is not None:
        os.environ[SEED_VARIABLE] = str(args.seed)
    seed = run_seed()
    overrides: dict[str, dict[str, int]] = {}
    for item in args.size:
        key, _, value = item.partition("=")
        row_id, _, name = key.partition(".")
        overrides.setdefault(row_id, {})[name] = int(value)
    wanted = [r for r in ROWS if r.id in args.rows.split(",")]
    base = args.dir or Path(tempfile.mkdtemp(prefix="comfysup-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    command = "python bench/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"rows {', '.join(r.id for r in wanted)} in {base}", flush=True)
    results = []
    for row in wanted:
        sizes = sizes_for(row, args.scale, overrides)
        folder = base / row.id
        print(f"{row.id}: {row.fault} ({_sizes(sizes)}) ...", flush=True)
        result = run_row(row, folder, seed, sizes)
        results.append(result)
        print(f"{row.id}: {result['status']} in {result['seconds']} s: {result.get('explain') or result.get('reason')}",
              flush=True)
        if result.get("report"):
            print(f"{row.id}: figures {json.dumps(result['report']['figures'])}", flush=True)
        if result["status"] == "ok" and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(base / f"lazyfs-{row.id}", ignore_errors=True)  # P1, P2: the lazy disk's backing folder
        if args.json:
            args.json.write_text(json.dumps({"seed": seed, "command": command, "rows": results}, indent=1))
    table = markdown(results, seed, f"{command} (seed {seed})")
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
