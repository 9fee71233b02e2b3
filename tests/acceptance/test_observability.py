"""See everything on a running ``comfysup run``: /metrics checked against the queue, the status
page in a real headless browser, ``status --watch``, ``submit --wait``, webhooks sent by the supervisor,
JSON logs — and a canary secret in none of them.

One supervisor on ``gpus = "cpu:2"`` (fake_comfy launched as ComfyUI) runs a scripted set of jobs: a retry
after an out-of-memory error, a validation failure, and a long job with step progress that is still
running while the page, the watch and the browser look at it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from supervisor_support import REPO, TRIVIAL, Supervised, job_id, wait_for

from comfysup.gpus import GpuSampler
from comfysup.observability.webhooks import verify
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.trace import figures
from tests.webhook_support import Receiver

CANARY = "sk-canary-observe-42c0de19f3"
SECRET = "whsec-observe-8811"
PROGRESS = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 77}},
    "2": {"class_type": "ComfysupProgressDemo", "inputs": {"image": ["1", 0], "steps": 60, "step_seconds": 0.15}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "long"}},
}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1280,1100"]


def line(n: int, **extra: Any) -> dict[str, Any]:
    body = {"id": job_id(n), "workflow": TRIVIAL, "set": {"1.color": n, "3.filename_prefix": f"job{n}"},
            "meta": {"kind": "trivial", "n": n}}
    body.update(extra)
    return body


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browse(browser: str, url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """A fresh headless chromium on ``url``: its own profile folder, nothing fetched but the page."""
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=60)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


AS_FROM_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "sys.argv[0] = 'comfysup'; runpy.run_module('comfysup', run_name='__main__')")
"""``python -m comfysup`` with Ctrl-C's default action, as a person's terminal starts it."""


def watch_frames(config: Path, frames: int) -> tuple[int, list[str]]:
    """``comfysup status --watch`` for ``frames`` frames, then Ctrl-C (SIGINT), as a person stops it."""
    # SIGINT as a terminal leaves it, whatever this worker process inherited or was left with: a child started
    # while SIGINT is ignored keeps it ignored, and Python then never raises KeyboardInterrupt (seen under xdist).
    proc = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, "status", "--config", str(config), "--watch",
                             "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    seen: list[str] = []
    current: list[str] = []
    deadline = time.monotonic() + 30
    while len(seen) < frames and time.monotonic() < deadline:
        text = proc.stdout.readline()
        if not text:
            break
        if text.startswith("\f"):
            seen.append("".join(current))
            current = []
        else:
            current.append(text)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert len(seen) >= frames, (seen, out, err)
    return proc.returncode, seen


@pytest.mark.timeout(120)
def test_a_running_supervisor_can_be_seen_every_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    receiver = Receiver(fail_first=1).start()
    # An OOM is run again once without counting: the second one is the counted retry.
    h = Supervised(tmp_path, script={job_id(5): ["oom", "oom", "ok"], job_id(6): ["invalid"]}, node_ms=20,
                   extra_sections={"webhooks": {"url": f"{receiver.url}/hook", "secret": SECRET, "allow_private": True,
                                                "base_delay_seconds": 0.05, "max_delay_seconds": 0.2}})
    jobs = [line(n) for n in range(1, 7)]
    jobs.append({"id": job_id(7), "workflow": PROGRESS, "meta": {"kind": "long"},
                 "extra_data": {"api_key_comfy_org": CANARY}})
    jobs[0]["extra_data"] = {"auth_token_comfy_org": CANARY}
    jobs[0]["meta"] = {"kind": "trivial", "api_token": CANARY}  # meta is the user's, and shown: masked
    jobs_path = tmp_path / "jobs.jsonl"
    jobs_path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    ids = [j["id"] for j in jobs]
    outputs: list[str] = []
    try:
        proc = h.start(env={"COMFYSUP_LOG_FORMAT": "json"})
        h.wait_ready(proc)
        base = h.metrics_url(proc)
        assert base.startswith("http://127.0.0.1:")
        waiter = subprocess.Popen([sys.executable, "-m", "comfysup", "submit", "--config", str(h.config_path),
                                   str(jobs_path), "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=REPO)
        queue = SQLiteQueue(h.config.resolve(h.config.queue.path), create=False)

        def long_job_has_steps() -> dict[str, Any] | None:
            [job] = queue.reads.get_many([job_id(7)]) or [None]  # submit --wait may not have inserted it yet
            return job.progress if job and job.state == "running" and (job.progress or {}).get("steps") else None

        progress = wait_for(long_job_has_steps, 30, "the long job to report its steps", h.describe)
        assert (progress["node_id"], progress["class_type"], progress["steps"]) == ("2", "ComfysupProgressDemo", 60)

        # -- while it runs: status --watch, the page, and a real browser ---------------------------------
        code, frames = watch_frames(h.config_path, 2)
        assert code == 0  # Ctrl-C ends watching without an error
        assert any(job_id(7) in f and "ComfysupProgressDemo, step " in f for f in frames), frames
        assert all("jobs/min" in f and "cpu0" in f and "cpu1" in f for f in frames)
        outputs += frames
        page = requests.get(base, timeout=5)
        assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
        assert job_id(7) in page.text and "ComfysupProgressDemo, step " in page.text
        outputs.append(page.text)
        browser = chromium()
        if browser is None:
            print("chromium is not installed (apt-get install chromium): the browser part was skipped")
        else:
            shot = tmp_path / "status-page.png"
            taken = browse(browser, base, tmp_path / "chrome-shot", f"--screenshot={shot}")
            assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]
            assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
            with capsys.disabled():
                print(f"\nstatus page screenshot: {shot}")
            dom = browse(browser, base, tmp_path / "chrome-dom", "--dump-dom")
            assert dom.returncode == 0, dom.stderr[-2000:]
            assert "<h2>Running</h2>" in dom.stdout and job_id(7) in dom.stdout and "step " in dom.stdout
            assert "cpu0" in dom.stdout and "cpu1" in dom.stdout
            outputs.append(dom.stdout)

        # -- submit --wait ends with the summary: one job is dead, so exit 1 -----------------------------
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 1, (out, err)
        assert "submitted 7 job(s)" in out and "summary: 6 done, 1 dead-lettered, 0 cancelled" in out
        assert f"{job_id(6)} dead: POST /prompt 400" in out
        assert "7/7" in err and "100%" in err  # tqdm's bar reached the end
        outputs += [out, err]
        records = {j.id: j for j in queue.reads.get_many(ids)}
        assert Counter(j.state for j in records.values()) == {"done": 6, "dead": 1}

        # -- webhooks from the supervisor's monitor: each job once, signed; the first try failed ----------
        def all_delivered() -> bool:
            return {json.loads(r.body)["id"] for r in receiver.got if r.answered == 204} == set(ids)

        wait_for(all_delivered, 20, "every job's webhook", h.describe)
        for request in (r for r in receiver.got if r.answered == 204):
            assert verify(SECRET, request.headers["X-Comfysup-Timestamp"], request.body,
                          request.headers["X-Comfysup-Signature"])
        outputs += [r.body.decode() for r in receiver.got]

        # -- /metrics against the queue ------------------------------------------------------------------
        attempts = [a for j in records.values() for a in j.attempts]
        # A job queued behind a running prompt and given back to a runner that waited for work ("withdrawn") never
        # ran: an attempt in the queue, none of a slot's.
        ran = [a for a in attempts if a.kind != "withdrawn"]
        by_kind = Counter((a.outcome, a.kind or "none") for a in attempts)
        assert by_kind[("retry", "oom")] == 1 and by_kind[("dead", "validation")] == 1

        def scrape() -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] | None:
            text = requests.get(f"{base}metrics", timeout=5).text
            values = samples(text)
            finished = sum(v for (n, _), v in values.items() if n == "comfysup_slot_jobs_total")
            tries = metric(values, "comfysup_webhook_tries_total", result="delivered")
            return (text, values) if finished == len(ran) and tries == len(ids) else None

        text, values = wait_for(scrape, 20, "the slots' counts and the webhooks to settle in /metrics", h.describe)
        outputs.append(text)
        status = queue.reads.status()
        for state, count in status.counts.items():
            assert metric(values, "comfysup_jobs", state=state) == count, state
        for (outcome, kind), count in by_kind.items():
            assert metric(values, "comfysup_attempts_total", outcome=outcome, kind=kind) == count, (outcome, kind)
        assert metric(values, "comfysup_retries_total", kind="oom") == 1
        assert metric(values, "comfysup_dead_letters_total", kind="validation") == 1
        # 1, or 2 when the first OOM was given back uncounted (a job queued behind it): its row has kind oom too
        assert metric(values, "comfysup_oom_total") == sum(n for (_, kind), n in by_kind.items() if kind == "oom")
        assert metric(values, "comfysup_job_duration_seconds_count", workflow="trivial", state="done") == 5
        assert metric(values, "comfysup_job_duration_seconds_count", workflow="trivial", state="dead") == 1
        assert metric(values, "comfysup_job_duration_seconds_count", workflow="long", state="done") == 1
        first = records[job_id(7)].attempts[0]  # its wait in ComfyUI's queue is queueing, not duration
        long_run = records[job_id(7)].finished_at - first.started_at - figures(first.trace)[0]  # type: ignore[operator]
        assert metric(values, "comfysup_job_duration_seconds_sum", workflow="long", state="done") == \
            pytest.approx(long_run)
        assert metric(values, "comfysup_job_queue_wait_seconds_count", workflow="trivial") == 6
        nodes = sum(len((a.trace or {}).get("nodes") or []) + len((a.trace or {}).get("cached") or [])
                    for a in attempts)
        cached = sum(len((a.trace or {}).get("cached") or []) for a in attempts)
        assert metric(values, "comfysup_nodes_total") == nodes
        assert metric(values, "comfysup_nodes_cached_total") == cached
        assert metric(values, "comfysup_node_cache_hit_ratio") == pytest.approx(cached / nodes)
        for slot in ("cpu0", "cpu1"):
            assert metric(values, "comfysup_slot_up", slot=slot, device="cpu") == 1
            assert metric(values, "comfysup_slot_busy", slot=slot, device="cpu") == 0
        assert metric(values, "comfysup_webhook_tries_total", result="retry") == 1
        assert metric(values, "comfysup_webhook_deliveries_pending") == 0
        assert ("comfysup_gpu_memory_total_bytes" in text) == bool(GpuSampler().sample())  # absent without NVML
        assert not any(i in text for i in ids)  # labels never carry job ids

        # -- files on the page, read-only and only from the store ----------------------------------------
        page = requests.get(base, timeout=5).text
        outputs.append(page)
        done = records[job_id(1)]
        [output] = done.outputs
        link = f"/files/{job_id(1)}/{output.name}"
        assert f"href='{link}'" in page
        got = requests.get(f"{base.rstrip('/')}{link}", timeout=5)
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == output.sha256
        assert requests.get(f"{base}files/{job_id(1)}/..%2F..%2Fqueue.db", timeout=5).status_code == 404
        assert requests.post(base, timeout=5).status_code == 405

        shown = subprocess.run([sys.executable, "-m", "comfysup", "show", "--config", str(h.config_path), job_id(1)],
                               capture_output=True, text=True, cwd=REPO, timeout=30)
        assert " executing " in shown.stdout and "webhook" in shown.stdout
        outputs += [shown.stdout, shown.stderr]

        # -- a monitor that dies is started again (forking from a supervisor that has no threads) --------
        monitor = (h.state() or {})["monitor_pid"]
        runners = sorted(s["runner_pid"] for s in (h.state() or {})["slots"])
        os.kill(monitor, signal.SIGKILL)
        again = wait_for(lambda: (h.state() or {}).get("metrics_url") not in (None, base)
                         and (h.state() or {}).get("metrics_url"), 20, "a new monitor", h.describe)
        assert requests.get(f"{again}metrics", timeout=5).status_code == 200
        assert sorted(s["runner_pid"] for s in (h.state() or {})["slots"]) == runners  # nothing else restarted
        queue.close()
        assert h.stop(proc) == 0
    finally:
        h.cleanup()
        receiver.stop()

    # -- JSON logs: every line of the supervisor's log is an object; the runners' name job, slot, attempt --
    events = [json.loads(text) for text in h.log().splitlines() if text.strip()]
    done_events = [e for e in events if e.get("event") == "done"]
    assert sorted(e["job"] for e in done_events) == sorted(i for i in ids if i != job_id(6))
    assert all(e["slot"] in ("cpu0", "cpu1") and e["attempt"] >= 1 for e in done_events)
    retry = next(e for e in events if e.get("event") == "retry")
    assert (retry["job"], retry["kind"]) == (job_id(5), "oom")
    outputs.append(h.log())
    everything = "\n".join(outputs)
    assert CANARY not in everything and SECRET not in everything


def test_a_taken_metrics_port_leaves_the_supervisor_working_and_webhooks_going(tmp_path: Path) -> None:
    """The endpoint cannot bind: said once, no restart loop, jobs still run and webhooks still go."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    receiver = Receiver(fail_first=0).start()
    port = holder.getsockname()[1]
    h = Supervised(tmp_path, extra_sections={"webhooks": {"url": f"{receiver.url}/hook", "allow_private": True}})
    doc = h.config_path.read_text().replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{port}"')
    h.config_path.write_text(doc)
    try:
        proc = h.start()
        h.wait_ready(proc)
        [n] = h.submit([line(1)])
        assert h.wait_terminal([n])[n].state == "done"
        wait_for(lambda: any(r.answered == 204 for r in receiver.got), 20, "the webhook", h.describe)
        assert (h.state() or {}).get("metrics_url") is None
        assert h.log().count("cannot serve /metrics") == 1 and "restarting it" not in h.log()
        assert h.stop(proc) == 0
    finally:
        h.cleanup()
        receiver.stop()
        holder.close()


def test_status_watch_and_submit_wait_without_a_supervisor(tmp_path: Path) -> None:
    """Without comfysup run the watch still shows the queue; --wait on jobs that are already terminal
    returns at once with the summary (exit 0 when all are done)."""
    h = Supervised(tmp_path)
    [n] = h.submit([line(1)])
    queue = SQLiteQueue(h.config.resolve(h.config.queue.path), create=False)
    claim = queue.leases.claim(f"test/{os.getpid()}/x/{uuid.uuid4().hex[:8]}", "x", 60)
    assert claim is not None and claim.id == n
    queue.leases.complete(claim, [])
    queue.close()
    code, frames = watch_frames(h.config_path, 1)
    assert code == 0 and "done 1" in frames[0] and "no state file" in frames[0]
    jobs_path = tmp_path / "again.jsonl"
    jobs_path.write_text(json.dumps(line(1)) + "\n")
    again = subprocess.run([sys.executable, "-m", "comfysup", "submit", "--config", str(h.config_path),
                            str(jobs_path), "--wait"], capture_output=True, text=True, cwd=REPO, timeout=30)
    assert again.returncode == 0, again.stderr
    assert "1 already submitted" in again.stdout and "summary: 1 done, 0 dead-lettered, 0 cancelled" in again.stdout
