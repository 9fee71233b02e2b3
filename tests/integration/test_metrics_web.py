"""The parts of /metrics and the status page, without sockets: counting each ended attempt once, the live
gauges, NVML sampling, the page's escaping, and files served only from inside the result store."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from queue_contract import T0, make_job

from comfysup.gpus import GpuSample, GpuSampler
from comfysup.observability.metrics import Metrics, Observer
from comfysup.observability.views import overview
from comfysup.observability.web import App, render_page
from comfysup.queue.base import Output
from comfysup.queue.sqlite import SQLiteQueue


@pytest.fixture
def queue(tmp_path: Path) -> Any:
    q = SQLiteQueue(tmp_path / "queue.db")
    yield q
    q.close()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_each_ended_attempt_is_counted_once_even_when_its_write_lands_late(queue: SQLiteQueue) -> None:
    queue.intake.submit([make_job(i) for i in range(4)], now=T0 - 30)
    registry = CollectorRegistry()
    observer = Observer(registry, since=T0)
    c0 = queue.leases.claim("a", "gpu0", 60, now=T0)
    queue.leases.retry_later(c0, T0, "oom", now=T0 + 1, kind="oom", trace={"nodes": [{"id": "1"}], "cached": ["2"]})
    c0 = queue.leases.claim("a", "gpu0", 60, now=T0 + 2)
    queue.leases.complete(c0, [], now=T0 + 10, trace={"nodes": [{"id": "1"}, {"id": "2"}], "cached": []})
    assert observer.catch_up(queue) == 2
    assert observer.catch_up(queue) == 0  # nothing new: nothing counted twice
    c1 = queue.leases.claim("b", "gpu1", 60, now=T0)
    c2 = queue.leases.claim("c", "gpu1", 60, now=T0)
    queue.leases.dead(c1, "POST /prompt 400", now=T0 + 12, kind="validation")
    assert observer.catch_up(queue) == 1
    queue.leases.dead(c2, "gave up", now=T0 + 5, kind="timeout")  # stamped before the last one, committed after
    assert observer.catch_up(queue) == 1
    assert value(registry, "comfysup_attempts_total", outcome="retry", kind="oom") == 1
    assert value(registry, "comfysup_attempts_total", outcome="done", kind="none") == 1
    assert value(registry, "comfysup_retries_total", kind="oom") == 1
    assert value(registry, "comfysup_oom_total") == 1
    assert value(registry, "comfysup_dead_letters_total", kind="validation") == 1
    assert value(registry, "comfysup_dead_letters_total", kind="timeout") == 1
    assert value(registry, "comfysup_nodes_total") == 4 and value(registry, "comfysup_nodes_cached_total") == 1
    assert observer.cache_ratio() == 0.25
    # Per workflow, once per job that ended: queue wait from submit to the first start, duration after.
    assert value(registry, "comfysup_job_queue_wait_seconds_count", workflow="test") == 3
    assert value(registry, "comfysup_job_queue_wait_seconds_sum", workflow="test") == 90
    assert value(registry, "comfysup_job_duration_seconds_sum", workflow="test", state="done") == 10
    assert value(registry, "comfysup_job_duration_seconds_count", workflow="test", state="dead") == 2
    early = Observer(CollectorRegistry(), since=T0 + 11)
    assert early.catch_up(queue) == 1  # only what ended after it started: counters start at zero


def test_a_scrape_shows_the_attempts_that_ended_before_it_not_one_scrape_later(queue: SQLiteQueue) -> None:
    queue.intake.submit([make_job(i) for i in range(2)], now=T0 - 30)
    metrics = Metrics(queue, lambda: None, since=T0)
    queue.leases.complete(queue.leases.claim("a", "gpu0", 60, now=T0), [], now=T0 + 1)
    assert 'comfysup_attempts_total{kind="none",outcome="done"} 1.0' in metrics.exposition().decode()
    queue.leases.dead(queue.leases.claim("a", "gpu0", 60, now=T0 + 2), "POST /prompt 400", now=T0 + 3,
                      kind="validation")
    text = metrics.exposition().decode()
    assert 'comfysup_attempts_total{kind="validation",outcome="dead"} 1.0' in text
    assert 'comfysup_dead_letters_total{kind="validation"} 1.0' in text


class FakeNVML:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}aaa"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=141 * 2**30, used=(h + 1) * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if h == 1:
            raise RuntimeError("Not Supported")
        return SimpleNamespace(gpu=37, memory=5)


def test_gpu_samples_from_nvml_honour_cuda_visible_devices_and_are_absent_without_a_driver() -> None:
    both = GpuSampler(env={}, nvml=FakeNVML()).sample()  # type: ignore[arg-type]
    assert [(g.index, g.memory_used_bytes, g.memory_total_bytes, g.utilization) for g in both] == \
        [(0, 2**30, 141 * 2**30, 0.37), (1, 2 * 2**30, 141 * 2**30, None)]
    assert [g.index for g in GpuSampler(env={"CUDA_VISIBLE_DEVICES": "1"}, nvml=FakeNVML()).sample()] == [1]  # type: ignore[arg-type]
    none = GpuSampler(env={}, nvml=FakeNVML(fail=True))  # type: ignore[arg-type]
    assert none.sample() == [] and "no NVIDIA driver" in none.note


def test_live_gauges_come_from_the_queue_the_supervisor_state_and_nvml(queue: SQLiteQueue) -> None:
    queue.intake.submit([make_job(i) for i in range(3)])
    claim = queue.leases.claim("a", "cpu0", 60)
    assert claim is not None
    queue.leases.set_progress(claim, {"node": 1, "nodes": 2})
    state = {"pid": os.getpid(), "updated_at": 1e12, "state": "running", "slots": [
        {"name": "cpu0", "device": "cpu", "state": "running", "restarts": 2, "runner_restarts": 1,
         "job": claim.id, "jobs": 7},
        {"name": "cpu1", "device": "cpu", "state": "failed", "restarts": 5, "runner_restarts": 0, "job": None,
         "jobs": 0}]}
    gpus = [GpuSample(0, "NVIDIA H200", 5 * 2**30, 141 * 2**30, 0.5)]
    metrics = Metrics(queue, lambda: state, lambda: gpus, lambda: {"delivered": 3, "retry": 1})
    text = metrics.exposition().decode()
    r = metrics.registry

    def v(metric: str, **labels: str) -> float | None:
        return r.get_sample_value(metric, labels)

    assert (v("comfysup_jobs", state="queued"), v("comfysup_jobs", state="running")) == (2, 1)
    assert v("comfysup_slot_up", slot="cpu0", device="cpu") == 1 and v("comfysup_slot_up", slot="cpu1",
                                                                        device="cpu") == 0
    assert v("comfysup_slot_restarts", slot="cpu1", device="cpu") == 5
    assert v("comfysup_slot_busy", slot="cpu0", device="cpu") == 1
    assert v("comfysup_slot_jobs_total", slot="cpu0", device="cpu") == 7
    assert v("comfysup_gpu_memory_used_bytes", gpu="0", name="NVIDIA H200") == 5 * 2**30
    assert v("comfysup_gpu_utilization_ratio", gpu="0", name="NVIDIA H200") == 0.5
    assert v("comfysup_webhook_tries_total", result="delivered") == 3
    assert v("comfysup_webhook_deliveries_pending") == 0
    assert claim.id not in text  # the running job is a 1 in comfysup_slot_busy, never a label
    stale = {**state, "pid": 0}  # the supervisor is gone: nothing is up, whatever the file says
    assert Metrics(queue, lambda: stale).registry.get_sample_value(
        "comfysup_slot_up", {"slot": "cpu0", "device": "cpu"}) == 0
    assert "comfysup_gpu" not in Metrics(queue, lambda: None).exposition().decode()  # no driver: absent


def app_with_a_done_job(tmp_path: Path, queue: SQLiteQueue) -> tuple[App, str]:
    job = make_job(1)
    queue.intake.submit([job])
    claim = queue.leases.claim("a", "cpu0", 60)
    assert claim is not None
    folder = tmp_path / "store" / job.id
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a b.png").write_bytes(b"\x89PNG fake")
    (folder / "page.html").write_text("<script>alert(1)</script>")
    (tmp_path / "secret.txt").write_text("outside the store")
    (folder / "link.png").symlink_to(tmp_path / "secret.txt")
    queue.leases.complete(claim, [Output("sub/a b.png", 9, "ab" * 32, str(folder / "sub" / "a b.png")),
                           Output("page.html", 25, "cd" * 32, str(folder / "page.html"))])
    metrics = Metrics(queue, lambda: None)
    return App(queue, metrics, lambda: None, tmp_path / "store"), job.id


def test_files_are_served_read_only_and_only_from_inside_the_store(tmp_path: Path, queue: SQLiteQueue) -> None:
    app, job = app_with_a_done_job(tmp_path, queue)
    ok = app.get(f"/files/{job}/sub/a%20b.png")
    assert (ok.status, ok.content_type, ok.content()) == (200, "image/png", b"\x89PNG fake")
    assert "Content-Disposition" not in ok.headers and "sandbox" in ok.headers["Content-Security-Policy"]
    html = app.get(f"/files/{job}/page.html")
    assert html.status == 200 and html.headers["Content-Disposition"].startswith("attachment")  # never rendered
    for path in (f"/files/{job}/../../secret.txt", f"/files/{job}/sub/..%2F..%2F..%2Fsecret.txt",
                 f"/files/{job}/link.png", f"/files/{job}/%2e%2e/%2e%2e/secret.txt", "/files/not-a-uuid/a.png",
                 f"/files/{job.upper()}/sub/a%20b.png", f"/files/{job}//etc/passwd", f"/files/{job}/sub%00.png",
                 f"/files/{job}/sub", f"/files/{job}/missing.png", "/files/", "/etc/passwd"):
        answer = app.get(path)
        assert answer.status == 404, path
        assert b"outside the store" not in answer.content()


def test_a_job_folder_that_is_a_symlink_is_not_served(tmp_path: Path, queue: SQLiteQueue) -> None:
    app, _ = app_with_a_done_job(tmp_path, queue)
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0")
    other = "6f1c1b0e-2d7a-4e43-9a55-0d8e7f0c1a11"
    (tmp_path / "store" / other).symlink_to(outside)
    answer = app.get(f"/files/{other}/passwd")
    assert answer.status == 404 and b"root" not in answer.content()


def test_the_page_links_the_files_and_escapes_what_it_shows(tmp_path: Path, queue: SQLiteQueue) -> None:
    app, job = app_with_a_done_job(tmp_path, queue)
    bad = make_job(2)
    queue.intake.submit([bad])
    claim = queue.leases.claim("a", "cpu0", 60)
    assert claim is not None
    queue.leases.dead(claim, "<img src=x onerror=alert(1)> node 2")
    page = app.get("/")
    text = page.body.decode()
    assert page.status == 200 and "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert f"href='/files/{job}/sub/a%20b.png'" in text and "<img class=thumb" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "<img src=x" not in text
    assert 'http-equiv="refresh" content="2"' in text
    view = overview(queue, None, done=5)
    assert render_page(view, 2.0).count("<tr>") >= 3
    assert app.get("/metrics").content_type.startswith("text/plain; version=0.0.4")
    # Each slot's warm-up and memory recoveries
    slot = {"name": "gpu0", "device": "cuda:0", "state": "running", "warmup_seconds": 3.25, "oom_frees": 1,
            "oom_retries": 1, "device_restarts": 1}
    page_with_slot = render_page(overview(queue, {"pid": os.getpid(), "slots": [slot], "updated_at": 0}), 2.0)
    assert "<th>warm-up" in page_with_slot and "<td>3.2 s" in page_with_slot
    assert "OOM /free 1, OOM retried 1, device restarts 1" in page_with_slot


@pytest.fixture
def status_server(tmp_path: Path, queue: SQLiteQueue) -> Any:
    """The status endpoint in this process with a 1 s header deadline, 32 connections held at most."""
    import threading

    from comfysup.observability.web import serve

    server = serve("127.0.0.1:0", App(queue, Metrics(queue, lambda: None), lambda: None, tmp_path / "store"),
                   max_connections=32, header_seconds=1.0, body_seconds=1.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(60)
def test_stalled_sockets_hold_no_thread_each_and_are_closed(status_server: str) -> None:
    """300 sockets that send nothing: a few threads serve them all (the rest wait, or get 503 past 32), each is
    closed after the 1 s deadline, and the endpoint answers again at once."""
    import socket
    import threading
    import time

    from tests.api_support import address, closed_within, exchange, status_of

    before = threading.active_count()
    socks = [socket.create_connection(address(status_server), timeout=10) for _ in range(300)]
    try:
        assert threading.active_count() <= before + 8, threading.active_count()
        deadline = time.monotonic() + 20
        assert all(closed_within(s, max(0.1, deadline - time.monotonic())) for s in socks)
        assert threading.active_count() <= before + 8
    finally:
        for s in socks:
            s.close()
    answer = exchange(status_server, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert status_of(answer) == 200 and b"nosniff" in answer


@pytest.mark.timeout(60)
def test_past_max_connections_new_ones_get_503_at_once(status_server: str) -> None:
    import socket

    from tests.api_support import address, exchange, status_of

    held = [socket.create_connection(address(status_server), timeout=10) for _ in range(40)]
    try:
        answers = [exchange(status_server, b"GET /metrics HTTP/1.0\r\n\r\n", timeout=5) for _ in range(3)]
        assert {status_of(a) for a in answers} == {503}, answers
    finally:
        for s in held:
            s.close()


@pytest.mark.timeout(60)
def test_a_request_sent_a_byte_at_a_time_is_closed_at_the_deadline(status_server: str) -> None:
    import socket
    import time

    from tests.api_support import address, trickled_until_closed

    with socket.create_connection(address(status_server), timeout=10) as sock:
        started = time.monotonic()
        closed = trickled_until_closed(sock, b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 200)
        assert closed and time.monotonic() - started < 5


@pytest.mark.timeout(60)
def test_a_malformed_request_line_is_one_log_line(status_server: str, caplog: pytest.LogCaptureFixture,
                                                  capfd: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from tests.api_support import exchange, status_of

    # A handler an earlier in-process CLI call left on the root logger writes to that test's closed capture
    # stream, and logging prints its own "--- Logging error --- Traceback" for it: not this server's doing.
    monkeypatch.setattr(logging.root, "handlers", [h for h in logging.root.handlers if not (
        isinstance(h, logging.StreamHandler) and getattr(h.stream, "closed", False))])
    caplog.set_level(logging.INFO, logger="comfysup.observability.web")
    assert b"400" in exchange(status_server, b"GARBAGE\r\n\r\n")  # an HTTP/0.9 request line: a bare error page
    assert status_of(exchange(status_server, b"GET /metrics HTTP/1.0\r\n\r\n")) == 200
    lines = [r.getMessage() for r in caplog.records if "GARBAGE" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.1" in lines[0] and "\n" not in lines[0], lines
    assert not [r for r in caplog.records if r.exc_info]
    err = capfd.readouterr().err
    # logging's own report of a handler that an earlier in-process CLI call left writing to that test's closed
    # capture stream ("--- Logging error ---" … "Arguments: …") is not this server's traceback: cut before the check.
    err = re.sub(r"--- Logging error ---\n.*?\nArguments: [^\n]*\n", "", err, flags=re.S)
    assert "Traceback" not in err, err


def test_each_outbox_says_how_much_it_holds_and_its_oldest_age_and_a_full_staging_folder_is_not_ready(
        tmp_path: Path, queue: SQLiteQueue) -> None:
    """/metrics, the page and /ready: uploads (storing jobs), webhooks and broker results, and the staging bound."""
    queue.default_callback_url = "http://hooks.example/x"  # type: ignore[misc]
    queue.intake.submit([make_job(1), make_job(2)], now=T0)
    storing = queue.leases.claim("box/1/cpu0/t", "cpu0", 60, now=T0)
    ended = queue.leases.claim("box/1/cpu1/t", "cpu1", 60, now=T0)
    assert storing is not None and ended is not None
    queue.leases.complete(storing, [Output("a.png", 300, "ab" * 32, "/staging/a.png")], now=T0, staged_in="/staging")
    queue.leases.dead(ended, "broken", now=T0)  # a webhook to deliver
    metrics = Metrics(queue, lambda: None)
    registry = metrics.registry
    assert value(registry, "comfysup_jobs", state="storing") == 1
    assert value(registry, "comfysup_outbox_items", outbox="uploads") == 1
    assert value(registry, "comfysup_outbox_bytes", outbox="uploads") == 300
    assert value(registry, "comfysup_outbox_items", outbox="webhooks") == 1
    assert value(registry, "comfysup_outbox_items", outbox="broker") == 0
    assert value(registry, "comfysup_outbox_oldest_age_seconds", outbox="uploads") > 1000  # since T0 (2023)
    full = {"pid": os.getpid(), "updated_at": 9e9, "slots": [{"name": "cpu0", "state": "running", "ready": True}],
            "staging": {"bytes": 5, "max_bytes": 5, "full": True, "reason": "the staging folder is full (x)"}}
    app = App(queue, metrics, lambda: full, tmp_path / "store")
    ready = app.get("/ready")
    assert ready.status == 503 and b"the staging folder is full (x)" in ready.content()
    page = app.get("/").body.decode()
    assert "<b>1</b> storing" in page and "outboxes: uploads 1" in page and "no new job is claimed" in page


def test_tenants_in_metrics_status_and_the_page_name_only_declared_tenants(queue: SQLiteQueue) -> None:
    from comfysup import records
    from comfysup.queue.tenants import TenantLimits

    queue.tenants = {"studio": TenantLimits(weight=3.0)}
    queue.intake.submit([records.replace(make_job(1), tenant="studio"),
                         records.replace(make_job(2), tenant="studio"),
                         records.replace(make_job(3), tenant="stray")], now=T0)
    claim = queue.leases.claim("a", "cpu0", 60, now=T0)  # stray's: no seconds used yet, and first by name
    queue.leases.complete(claim, [], now=T0 + 12.5)
    metrics = Metrics(queue, lambda: None)
    sample = metrics.registry.get_sample_value
    assert sample("comfysup_tenant_jobs", {"tenant": "studio", "state": "queued"}) == 2
    assert sample("comfysup_tenant_jobs_done_total", {"tenant": "studio"}) == 0
    assert sample("comfysup_tenant_gpu_seconds_total", {"tenant": "other"}) == 12.5
    assert sample("comfysup_tenant_jobs_done_total", {"tenant": "other"}) == 1
    assert 'tenant="stray"' not in metrics.exposition().decode()
    page = render_page(overview(queue, None, now=T0 + 13), 5)
    assert "<h2>Tenants</h2>" in page and "studio" in page and "stray" in page
