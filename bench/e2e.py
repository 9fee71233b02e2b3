"""bench/e2e.py: how close `comfysup run` keeps K servers to always rendering, against the ideal and a bare client.

N jobs through `comfysup run` on K fake_comfy servers (launched by the supervisor exactly as ComfyUI
would be) whose prompts take a fixed T ms, against (a) the ideal N·T/K and (b) a bare client in the same
run: one thread per server that posts, waits for the end on the WebSocket, reads /history and downloads
the file, with nothing durable, on urllib3 (requests' own transport, leaner than the requests most scripts use;
comfysup's runner has used the standard library's http.client since 2026-12, cheaper again) and websocket-client
(comfysup's too). Reports
efficiency (ideal / actual), the overhead per job in ms over the bare client, and the CPU time per job of
comfysup's processes (runners, supervisor, monitor) against the bare client's.

    .venv/bin/python bench/e2e.py                       # T = 20, 200, 2000 ms; K = 1, 2, 4
    .venv/bin/python bench/e2e.py --t-ms 200 --k 4      # one cell
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and bench/queue.py would shadow the standard
# library's queue module for everything imported after it: it goes last, where it still gives real_drivers.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import psutil
import tomli_w
import urllib3
import websocket
from real_drivers import wait_for_end


def _bench_runner():
    """bench/runner.py's bare client, loaded by path (bench/queue.py would shadow the stdlib's queue)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_runner", Path(__file__).resolve().parent / "runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_runner = _bench_runner()
free_port, start_fake = _runner.free_port, _runner.start_fake

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
NODES = len(TRIVIAL)


def prompt(n: int, salt: int) -> dict:
    workflow = json.loads(json.dumps(TRIVIAL))
    workflow["1"]["inputs"]["color"] = (n * 7919 + salt * 104729) % 16777216
    workflow["3"]["inputs"]["filename_prefix"] = f"e{salt}_{n}"
    return workflow


def jobs_for(t_ms: float, k: int, quick: bool) -> int:
    """Enough jobs for about 10 s of ideal work (4 s with --quick), at least 4 per server."""
    seconds = 4.0 if quick else 10.0
    return max(4 * k, int(seconds * 1000 / max(t_ms, 1) * k))


def bare_client(url: str, n_jobs: int, salt: int, out: Path) -> float:
    """The least a client can do: one socket, post, wait for the end, read history, download; nothing durable."""
    pool = urllib3.connection_from_url(url, maxsize=1, retries=False)
    client_id = str(uuid.uuid4())
    ws = websocket.create_connection(f"ws{url[4:]}/ws?clientId={client_id}", timeout=30,
                                     skip_utf8_validation=True)
    start = time.perf_counter()
    for n in range(n_jobs):
        prompt_id = str(uuid.uuid4())
        body = json.dumps({"prompt": prompt(n, salt), "prompt_id": prompt_id, "client_id": client_id}).encode()
        assert pool.urlopen("POST", "/prompt", body=body, headers={"Content-Type": "application/json"},
                            timeout=30.0).status == 200
        wait_for_end(ws, prompt_id)
        entry = json.loads(pool.urlopen("GET", f"/history/{prompt_id}", timeout=30.0).data)[prompt_id]
        for image in entry["outputs"]["3"]["images"]:
            body = pool.urlopen("GET", f"/view?{urlencode(image)}", timeout=30.0).data
            (out / image["filename"]).write_bytes(body)
    elapsed = time.perf_counter() - start
    ws.close()
    pool.close()
    return elapsed


def idle_gaps(url: str, last: int, runs_out: list[float] | None = None) -> list[float]:
    """The server's idle time in ms between its ``last`` executions, from the fake's own record
    (/fake/stats: when each execution started and ended): how long the GPU would have waited for the next
    prompt, whoever is to blame for it (the client, the queue, or the server's own HTTP and WebSocket).
    ``runs_out`` gets each of those executions' own time in ms (T, plus what the fake itself takes beyond
    it on a busy machine: its messages, the PNG, the history)."""
    stats = json.loads(urllib3.request("GET", f"{url}/fake/stats", timeout=10.0).data)
    runs = sorted((r["started_at"], r["ended_at"]) for p in stats["prompts"].values() for r in p["executions"]
                  if r["ended_at"] is not None)[-last:]
    if runs_out is not None:
        runs_out.extend((end - start) * 1000 for start, end in runs)
    return [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(runs)]


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else float("nan")


def run_bare(k: int, n: int, node_ms: float, tmp: Path) -> tuple[float, float, list[float], list[float]]:
    """(mean seconds per server, CPU seconds of this process, the servers' idle gaps in ms, their executions'
    times in ms) for n jobs over k servers, a thread per server."""
    fakes = [start_fake(tmp / f"bare{i}", node_ms) for i in range(k)]
    try:
        out = tmp / "bare-out"
        out.mkdir()
        for _proc, url in fakes:
            bare_client(url, 2, 99, out)  # warm-up
        per = [n // k + (1 if i < n % k else 0) for i in range(k)]
        elapsed = [0.0] * k
        threads = [threading.Thread(target=lambda i=i: elapsed.__setitem__(
            i, bare_client(fakes[i][1], per[i], 10 + i, out))) for i in range(k)]
        cpu = time.process_time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = time.process_time() - cpu
        execs: list[float] = []
        gaps = [g for i, (_proc, url) in enumerate(fakes) for g in idle_gaps(url, per[i], execs)]
        return sum(elapsed) / k, cpu, gaps, execs  # each server's own span, as for comfysup
    finally:
        for proc, _url in fakes:
            proc.terminate()
            proc.wait()


def run_comfysup(k: int, n: int, node_ms: float, tmp: Path) -> tuple[float, float, float, dict[str, float],
                                                                    list[float], list[float]]:
    """(mean span per server from its first claim to its last done, runner RSS MiB, supervisor RSS MiB, CPU
    seconds by process kind, the servers' idle gaps in ms, their executions' times in ms)."""
    config = tmp / "config.toml"
    base_port = free_port()
    config.write_bytes(tomli_w.dumps({
        "queue": {"path": str(tmp / "var" / "queue.db")}, "store": {"dir": str(tmp / "var" / "results")},
        "comfyui": {"main": str(ROOT / "fake_comfy" / "main.py"), "python": sys.executable, "gpus": f"cpu:{k}",
                    "base_port": base_port, "base_directory": str(tmp / "var" / "comfyui"),
                    "extra_args": ["--node-ms", str(node_ms)], "startup_seconds": 30.0},
        "runner": {"jitter": False}, "metrics": {"listen": "127.0.0.1:0"}}).encode())
    # Warm-up jobs first, as the bare client warms its servers up: a fake's first prompts are slower, and
    # the processes' start-up is not per-job work. The measured batch is submitted once they are done.
    warm, jobs = tmp / "warm.jsonl", tmp / "jobs.jsonl"
    warm.write_text("".join(json.dumps({"id": str(uuid.uuid4()), "workflow": prompt(i, 4)}) + "\n"
                            for i in range(2 * k)))
    jobs.write_text("".join(json.dumps({"id": str(uuid.uuid4()), "workflow": prompt(i, 3)}) + "\n"
                            for i in range(n)))
    subprocess.run([sys.executable, "-m", "comfysup", "submit", str(warm), "--config", str(config)], check=True,
                   capture_output=True, cwd=ROOT)
    log = open(tmp / "supervisor.log", "wb")  # noqa: SIM115 - closed below, after the process ends
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "run", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    db_path = tmp / "var" / "queue.db"
    runner_rss = supervisor_rss = 0.0
    cpu: dict[str, float] = {}
    deadline = time.monotonic() + 30 + n * node_ms * NODES / 1000 * 3
    try:
        sup = psutil.Process(proc.pid)
        while not db_path.exists() or _left(db_path) > 0:  # the warm-up
            if time.monotonic() > deadline:
                raise SystemExit(f"comfysup run did not finish its warm-up; see {tmp / 'supervisor.log'}")
            time.sleep(0.1)
        started = cpu_by_kind(sup)
        subprocess.run([sys.executable, "-m", "comfysup", "submit", str(jobs), "--config", str(config)], check=True,
                       capture_output=True, cwd=ROOT)
        while time.monotonic() < deadline:
            with sqlite3.connect(db_path) as db:
                left = db.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'dead')").fetchone()[0]
            try:
                supervisor_rss = max(supervisor_rss, sup.memory_info().rss / 2**20)
                for child in sup.children():
                    if child.name().startswith("comfysup-") and not child.name().startswith("comfysup-monito"):
                        runner_rss = max(runner_rss, child.memory_info().rss / 2**20)
            except psutil.Error:
                pass
            if left == 0:
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"comfysup run did not finish in time; see {tmp / 'supervisor.log'}")
        cpu = {kind: seconds - started[kind] for kind, seconds in cpu_by_kind(sup).items()}
        with sqlite3.connect(db_path) as db:  # the measured batch's jobs each server ran
            ran = dict(db.execute("SELECT a.server, count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id "
                                  "WHERE j.submitted_at = (SELECT max(submitted_at) FROM jobs) GROUP BY a.server"
                                  ).fetchall())
        execs: list[float] = []
        gaps = [g for i in range(k) for g in idle_gaps(f"http://127.0.0.1:{base_port + i}", ran.get(f"cpu{i}", 0),
                                                      execs)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        log.close()
    if os.environ.get("E2E_GAPS"):
        with sqlite3.connect(db_path) as db:
            rows = db.execute("SELECT a.server, a.started_at, j.finished_at FROM attempts a JOIN jobs j "
                              "ON a.job_id = j.id ORDER BY a.started_at").fetchall()
        last_end: dict[str, float] = {}
        for server, start, end in rows:
            gap = (start - last_end[server]) * 1000 if server in last_end else float("nan")
            print(f"  {server} gap {gap:7.1f} ms  run {(end - start) * 1000:7.1f} ms")
            last_end[server] = end
    batch = "j.submitted_at = (SELECT max(submitted_at) FROM jobs)"  # one submit: one time for all its jobs
    with sqlite3.connect(db_path) as db:
        first, last, done = db.execute("SELECT min(a.started_at), max(j.finished_at), sum(j.state = 'done') "
                                       f"FROM jobs j JOIN attempts a ON a.job_id = j.id WHERE {batch}").fetchone()
        spans = dict(db.execute("SELECT a.server, max(j.finished_at) - min(a.started_at) FROM attempts a "
                                f"JOIN jobs j ON j.id = a.job_id WHERE {batch} GROUP BY a.server").fetchall())
    if done != n:
        raise SystemExit(f"only {done} of {n} jobs done")
    # Each server's span from its own first claim to its own last done: the supervisor brings its K servers
    # up one after another, and that start-up stagger (once per run, carried to the end of a short run) is
    # not per-job overhead. A server that got no job at all counts the whole run.
    return (sum(spans.get(f"cpu{i}", last - first) for i in range(k)) / k, runner_rss, supervisor_rss, cpu, gaps,
            execs)


def _left(db_path: Path) -> int:
    with sqlite3.connect(db_path) as db:
        try:
            return db.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'dead')").fetchone()[0]
        except sqlite3.OperationalError:  # the schema is still being created
            return 1


def cpu_by_kind(sup: psutil.Process) -> dict[str, float]:
    """CPU seconds (user + system) so far of the supervisor, its runners and its monitor (servers excluded);
    taken after the warm-up and at the end, so start-up is not counted as per-job work."""
    out = {"supervisor": sum(sup.cpu_times()[:2]), "runners": 0.0, "monitor": 0.0}
    for child in sup.children():
        try:
            name = child.name()
            if name.startswith("comfysup-monito"):
                out["monitor"] += sum(child.cpu_times()[:2])
            elif name.startswith("comfysup-"):
                out["runners"] += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--t-ms", default="20,200,2000", help="prompt times in ms, comma-separated")
    parser.add_argument("--k", default="1,2,4", help="servers, comma-separated")
    parser.add_argument("--quick", action="store_true", help="about 4 s of ideal work a cell instead of 10")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"comfysup run on K fake servers, prompts of T ms; {os.cpu_count()} CPUs, load average {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f}; efficiency = ideal N*T/K / actual; CPU ms per job: bare client | "
          "comfysup runners + supervisor + monitor; exec ms: a prompt's mean time in the fake (T and the fake's own "
          "work); busy: the share of comfysup's span its servers executed (1.0: the server never waited)")
    print(f"{'T ms':>6} {'K':>2} {'N':>5} {'ideal s':>8} {'bare s':>8} {'comfysup s':>10} {'eff bare':>9} "
          f"{'eff comfysup':>12} {'overhead ms/job':>16} {'CPU bare':>8} {'CPU ours':>17} {'runner MiB':>10} "
          f"{'superv. MiB':>11} {'idle ms bare':>12} {'idle ms ours':>12} {'exec ms bare':>12} {'exec ms ours':>12} "
          f"{'busy ours':>9}")
    for t_ms in (float(x) for x in args.t_ms.split(",")):
        for k in (int(x) for x in args.k.split(",")):
            n = jobs_for(t_ms, k, args.quick)
            with tempfile.TemporaryDirectory(prefix="comfysup-e2e-") as name:
                tmp = Path(name)
                node_ms = t_ms / NODES
                bare, bare_cpu, bare_gaps, bare_execs = run_bare(k, n, node_ms, tmp)
                ours, runner_mib, sup_mib, cpu, our_gaps, our_execs = run_comfysup(k, n, node_ms, tmp)
            ideal = n * t_ms / 1000 / k
            overhead = (ours - bare) / n * k * 1000  # per job, on its server's timeline
            ours_cpu = "+".join(f"{cpu[kind] / n * 1000:.1f}" for kind in ("runners", "supervisor", "monitor"))
            busy = sum(our_execs) / 1000 / k / ours
            print(f"{t_ms:>6.0f} {k:>2} {n:>5} {ideal:>8.2f} {bare:>8.2f} {ours:>10.2f} {ideal / bare:>9.3f} "
                  f"{ideal / ours:>12.3f} {overhead:>16.2f} {bare_cpu / n * 1000:>8.1f} {ours_cpu:>17} "
                  f"{runner_mib:>10.1f} {sup_mib:>11.1f} {median(bare_gaps):>12.1f} {median(our_gaps):>12.1f} "
                  f"{mean(bare_execs):>12.2f} {mean(our_execs):>12.2f} {busy:>9.3f}", flush=True)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


if __name__ == "__main__":
    main()
