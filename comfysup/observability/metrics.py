"""Prometheus metrics, computed from the queue, the supervisor's state and NVML (prometheus-client).

Two kinds of values:

- Gauges read at scrape time: jobs by state, the oldest queued job's age, per slot (server up, restarts,
  busy, jobs finished), per GPU (memory used and total, utilisation), pending webhook deliveries.
- Counters and histograms observed as attempts end: attempts, retries and dead letters by reason class
  (the attempts table's ``kind``), OOMs, nodes run and served from ComfyUI's cache (from the traces), and
  per workflow the queue wait and run time of each job that ends, and of each attempt its wait in ComfyUI's
  queue apart from the rest of it (one figure each, never one in the other). The :class:`Observer` reads the
  attempts that ended since its last look (``Queue.ended_since``, an index range, never a scan), keeps
  the keys of the last LOOKBACK_SECONDS so a write that committed late is counted once and only once,
  and counts from the moment this process started, as Prometheus counters do (``rate()`` handles the
  reset of a restart). What it reads and keeps does not follow the rate of jobs: each look reads the
  attempts that are new (no traces: the database counts their nodes) and counts the look-back window
  in the index; only when that count differs from the keys it kept does it read the window's keys, to
  find the late ones. It keeps one small key per attempt of the window, and nothing else.

Labels are bounded and never carry a job id or a secret: state, kind, outcome, slot, device, gpu index
and name, and the workflow name (the workflow file's stem or the job's ``meta.kind``, cut to 64 chars).
With several machines on one PostgreSQL queue, every supervisor reports the same queue-wide values
(aggregate them with ``max``), and its own slots and GPUs.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from comfysup.config import MetricsConfig
from comfysup.gpus import GpuSample
from comfysup.observability.brokermetrics import broker_metrics
from comfysup.observability.slotgauges import label, slot_metrics
from comfysup.observability.tenantmetrics import tenant_metrics
from comfysup.queue.base import STORING, TERMINAL, EndedAttempt, OutboxLevel, Queue
from comfysup.slotstate import ready_slots, staleness

LOOKBACK_SECONDS = 120.0
"""An attempt's end is stamped before its transaction waits for the write lock (SQLite's busy timeout is
30 s by default), so a row can appear up to that long after rows with later stamps; looking this far back
and skipping what was counted catches it exactly once."""
WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600, float("inf"))
RUN_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, float("inf"))
PAGE = 1000
"""Attempts read at once: a catch-up after a stall reads this many rows at a time, never all of them."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "other"
class Observer:
    """Counters and histograms fed by the attempts that end; ``catch_up`` is cheap to call often."""

    def __init__(self, registry: CollectorRegistry, since: float,
                 max_workflow_labels: int = MetricsConfig.max_workflow_labels) -> None:
        self.max_workflow_labels = max_workflow_labels
        self.workflows: set[str] = set()
        """The workflow label values in use: past ``max_workflow_labels`` a new one counts as ``other``, so a
        submitter choosing ``meta.kind`` freely cannot grow the exposition (and Prometheus) without bound."""
        self.cursor = since
        """The latest end observed (never before the start: earlier attempts are not this process's)."""
        self.start = since
        self.node_total = self.node_cached = 0
        self.seen: set[tuple[str, int, float]] = set()
        """(job id, attempt, started_at) of each attempt counted that ended in the look-back window: exactly
        those, so its size is what ``Queue.ended_count`` says of the window when no write landed late."""
        self.expiry: list[tuple[float, tuple[str, int, float]]] = []
        """A heap of (ended_at, key) of ``seen``: keys leave as the window moves on, in end order."""
        self.lock = threading.Lock()
        self.attempts = Counter("comfysup_attempts", "Attempts that ended, by outcome and reason class (kind).",
                                ["outcome", "kind"], registry=registry)
        self.retries = Counter("comfysup_retries", "Attempts that failed and were retried, by reason class.",
                               ["kind"], registry=registry)
        self.dead = Counter("comfysup_dead_letters", "Jobs dead-lettered, by the reason class of the last attempt.",
                            ["kind"], registry=registry)
        self.oom = Counter("comfysup_oom", "Attempts that ended in an out-of-memory error of ComfyUI.",
                           registry=registry)
        self.nodes = Counter("comfysup_nodes", "Nodes of ended attempts: run by ComfyUI or served from its cache.",
                             registry=registry)
        self.cached = Counter("comfysup_nodes_cached", "Nodes ComfyUI served from its cache (execution_cached).",
                              registry=registry)
        self.wait = Histogram("comfysup_job_queue_wait_seconds", "From submit to the first attempt's start (its "
                              "claim, plus its wait in ComfyUI's queue behind another prompt), of each job that "
                              "ended.", ["workflow"], buckets=WAIT_BUCKETS, registry=registry)
        self.run = Histogram("comfysup_job_duration_seconds", "From the first attempt's start (as above) to the "
                             "end, retries included, of each job that ended.", ["workflow", "state"],
                             buckets=RUN_BUCKETS, registry=registry)
        self.comfy_wait = Histogram("comfysup_attempt_comfyui_wait_seconds", "Of each attempt that ended with a "
                                    "trace: how long its prompt waited in ComfyUI's queue behind the prompt ahead "
                                    "of it ([runner] queue_ahead), from its POST to its execution_start.",
                                    ["workflow"], buckets=WAIT_BUCKETS, registry=registry)
        self.attempt_run = Histogram("comfysup_attempt_run_seconds", "Of each attempt that ended with a trace: its "
                                     "time from its claim to its end less that wait (execution, downloads, the "
                                     "record).", ["workflow", "outcome"], buckets=RUN_BUCKETS, registry=registry)

    def catch_up(self, queue: Queue) -> int:
        """Observe every attempt that ended since the last call; returns how many were new.

        The attempts that ended at or after the cursor are read (a few rows a second); those that ended
        before it, in the look-back window, are only counted by the index. A count above the keys kept
        means a write landed late: then the window's keys (small tuples, no row) show which, and the
        rows are read again from the oldest end among them."""
        with self.lock:
            since = max(self.start, self.cursor - LOOKBACK_SECONDS)
            read_from = self.cursor
            if queue.reads.ended_count(since, self.cursor) != len(self.seen):
                read_from = self._late(queue, since, read_from)
            new = 0
            while True:
                rows = queue.reads.ended_since(read_from, limit=PAGE)
                for row in rows:
                    key = (row.job_id, row.attempt, row.started_at)
                    if key in self.seen:
                        continue
                    self.seen.add(key)
                    heapq.heappush(self.expiry, (row.ended_at, key))
                    self.observe(row)
                    self.cursor = max(self.cursor, row.ended_at)
                    new += 1
                if len(rows) < PAGE or rows[-1].ended_at == read_from:
                    break
                read_from = rows[-1].ended_at  # a full page: the next one starts where it stopped
            horizon = self.cursor - LOOKBACK_SECONDS
            while self.expiry and self.expiry[0][0] < horizon:
                self.seen.discard(heapq.heappop(self.expiry)[1])
            return new

    def _late(self, queue: Queue, since: float, read_from: float) -> float:
        """Where to read from so that the window's attempts not yet counted are read; drops the keys of
        attempts no longer in the queue (pruned), so the counts agree again."""
        keys = queue.reads.ended_keys(since, self.cursor)
        present = {(job_id, attempt, started_at) for job_id, attempt, started_at, _ in keys}
        gone = self.seen - present
        if gone:
            self.seen -= gone
            self.expiry = [entry for entry in self.expiry if entry[1] not in gone]
            heapq.heapify(self.expiry)
        for job_id, attempt, started_at, ended_at in keys:
            if (job_id, attempt, started_at) not in self.seen:
                read_from = min(read_from, ended_at)
        return read_from

    def observe(self, row: EndedAttempt) -> None:
        kind = label(row.kind)
        self.attempts.labels(outcome=label(row.outcome), kind=kind).inc()
        if row.outcome == "retry":
            self.retries.labels(kind=kind).inc()
        elif row.outcome == "dead":
            self.dead.labels(kind=kind).inc()
        if row.kind == "oom":
            self.oom.inc()
        ran, cached = row.nodes_run, row.nodes_cached
        if ran or cached:
            self.nodes.inc(ran + cached)
            self.cached.inc(cached)
            self.node_total += ran + cached
            self.node_cached += cached
        if row.run_s is not None:
            workflow = self.workflow_label(row.workflow_name)
            self.comfy_wait.labels(workflow=workflow).observe(max(0.0, row.comfyui_wait_s or 0.0))
            self.attempt_run.labels(workflow=workflow, outcome=label(row.outcome)).observe(max(0.0, row.run_s))
        if row.outcome in TERMINAL or row.outcome == STORING:  # storing: the job's run is over, its upload waits
            workflow = self.workflow_label(row.workflow_name)
            # The first attempt's wait in ComfyUI's queue (a job queued ahead) is queueing, not duration.
            started = row.first_started_at + (row.first_comfyui_wait_s or 0.0)
            self.wait.labels(workflow=workflow).observe(max(0.0, started - row.submitted_at))
            self.run.labels(workflow=workflow, state=row.outcome).observe(max(0.0, row.ended_at - started))

    def workflow_label(self, name: str | None) -> str:
        value = label(name, "unnamed")
        if value not in self.workflows:
            if len(self.workflows) >= self.max_workflow_labels:
                return OTHER
            self.workflows.add(value)
        return value

    def cache_ratio(self) -> float | None:
        return None if not self.node_total else self.node_cached / self.node_total


class Live(Collector):
    """The gauges read at scrape time (prometheus-client calls ``collect`` on every scrape)."""

    def __init__(self, queue: Queue, state: Callable[[], dict[str, Any] | None], gpus: Callable[[], list[GpuSample]],
                 observer: Observer, deliveries: Callable[[], dict[str, int]] = dict) -> None:
        self.queue = queue
        self.state = state
        self.gpus = gpus
        self.observer = observer
        self.deliveries = deliveries

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        status = self.queue.reads.status(now, dead_limit=0)
        jobs = GaugeMetricFamily("comfysup_jobs", "Jobs by state (waiting: queued, waiting to retry; posted: "
                                 "claimed ahead, waiting in its server's queue behind the prompt that runs there; "
                                 "running: executing, downloading, recording; storing: its outputs staged, "
                                 "waiting for the bucket).", labels=["state"])
        for state, count in sorted(status.counts.items()):
            jobs.add_metric([state], count)
        yield jobs
        oldest = GaugeMetricFamily("comfysup_oldest_queued_age_seconds", "Age of the oldest queued job (0: none).")
        oldest.add_metric([], 0.0 if status.oldest_queued_at is None else max(0.0, now - status.oldest_queued_at))
        yield oldest
        yield from self._readiness(now, status.counts.get("queued", 0))
        ratio = self.observer.cache_ratio()
        if ratio is not None:
            hit = GaugeMetricFamily("comfysup_node_cache_hit_ratio", "Nodes served from ComfyUI's cache over all "
                                    "nodes of the attempts that ended since this process started.")
            hit.add_metric([], ratio)
            yield hit
        yield from outbox_metrics(self.queue.deliveries.outboxes())
        pending = GaugeMetricFamily("comfysup_webhook_deliveries_pending", "Webhook deliveries not yet sent "
                                    "(due, or waiting for their next try).")
        pending.add_metric([], self.queue.deliveries.pending_deliveries())
        yield pending
        tries = CounterMetricFamily("comfysup_webhook_tries", "Webhook tries by this deliverer, by result "
                                    "(delivered, retry: failed and tried again later, failed: given up).",
                                    labels=["result"])
        for result in ("delivered", "retry", "failed"):
            tries.add_metric([result], self.deliveries().get(result, 0))
        yield tries
        totals = self.queue.assets.asset_totals()  # type: ignore[attr-defined]
        for name, key, text in (("comfysup_input_files", "assets", "Input files in the asset store (one per content)."),
                                ("comfysup_input_bytes", "bytes", "Bytes of the input files in the asset store.")):
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], totals[key])
            yield gauge
        uploads = CounterMetricFamily("comfysup_input_uploads", "Input files uploaded to ComfyUI servers (all runners "
                                      "of this queue; once per server and content unless evicted).")
        uploads.add_metric([], totals["uploads"])
        yield uploads
        yield from self._slots(now)
        yield from self._gpus()
        yield from tenant_metrics(self.queue.reads.tenant_counts(), self.queue.tenants)
        state = self.state()
        yield from broker_metrics((state or {}).get("broker"), self.queue.deliveries.announcement_backlog())

    def _readiness(self, now: float, queued: int) -> Iterable[Metric]:
        """What an autoscaler scales on (with comfysup_jobs and comfysup_oldest_queued_age_seconds): the slots
        that take jobs now, and the queued jobs per ready slot (GET /ready's bound is on the same number)."""
        ready = ready_slots(self.state(), now)
        slots = GaugeMetricFamily("comfysup_ready_slots", "Slots of this machine that take jobs now (server answering "
                                  "and warm, runner running).")
        slots.add_metric([], ready)
        per = GaugeMetricFamily("comfysup_queued_jobs_per_ready_slot", "Jobs queued (ready to run) per ready slot of "
                                "this machine; the queued count itself when no slot is ready.")
        per.add_metric([], queued / ready if ready else float(queued))
        yield from (slots, per)

    def _slots(self, now: float) -> Iterable[Metric]:
        state = self.state()
        if state is None:
            return
        slots = [slot for slot in state.get("slots") or [] if isinstance(slot, dict)]
        yield from slot_metrics(slots, running=staleness(state, now) is None)

    def _gpus(self) -> Iterable[Metric]:
        samples = self.gpus()
        if not samples:
            return  # no driver: per-GPU metrics are absent, not zero
        labels = ["gpu", "name"]
        used = GaugeMetricFamily("comfysup_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=labels)
        total = GaugeMetricFamily("comfysup_gpu_memory_total_bytes", "GPU memory in all (NVML).", labels=labels)
        busy = GaugeMetricFamily("comfysup_gpu_utilization_ratio", "Fraction of time a kernel ran (NVML).",
                                 labels=labels)
        for g in samples:
            key = [str(g.index), label(g.name)]
            used.add_metric(key, g.memory_used_bytes)
            total.add_metric(key, g.memory_total_bytes)
            if g.utilization is not None:
                busy.add_metric(key, g.utilization)
        yield from (used, total, busy)


class Metrics:
    """The registry of one monitor process: observed counters plus the live gauges."""

    def __init__(self, queue: Queue, state: Callable[[], dict[str, Any] | None],
                 gpus: Callable[[], list[GpuSample]] = list, deliveries: Callable[[], dict[str, int]] = dict,
                 since: float | None = None, max_workflow_labels: int = MetricsConfig.max_workflow_labels) -> None:
        self.registry = CollectorRegistry()
        self.queue = queue
        self.observer = Observer(self.registry, time.time() if since is None else since, max_workflow_labels)
        self.registry.register(Live(queue, state, gpus, self.observer, deliveries))

    def catch_up(self) -> int:
        return self.observer.catch_up(self.queue)

    def exposition(self) -> bytes:
        """The text of a scrape. The counters are caught up first: the registry collects them before the
        live gauges, so a catch-up inside ``Live.collect`` would show this scrape's attempts only in the next."""
        self.catch_up()
        return generate_latest(self.registry)


def outbox_metrics(levels: dict[str, OutboxLevel]) -> Iterator[Metric]:
    """Each outbox (uploads: storing jobs; webhooks: deliveries to send; broker: announcements to confirm): what it
    holds, the age of its oldest, and the staged bytes of the uploads."""
    items = GaugeMetricFamily("comfysup_outbox_items", "What each outbox holds (uploads: jobs whose outputs wait "
                              "for the bucket; webhooks: deliveries not yet sent; broker: results not yet "
                              "confirmed by the broker).", labels=["outbox"])
    oldest = GaugeMetricFamily("comfysup_outbox_oldest_age_seconds", "Age of each outbox's oldest item (0: empty).",
                               labels=["outbox"])
    for name, level in sorted(levels.items()):
        items.add_metric([name], level.items)
        oldest.add_metric([name], max(0.0, level.oldest_age_seconds or 0.0))
    yield items
    yield oldest
    staged = GaugeMetricFamily("comfysup_outbox_bytes", "Bytes each outbox holds where known (uploads: the staged "
                               "outputs of this queue's storing jobs, every machine's).", labels=["outbox"])
    for name, level in sorted(levels.items()):
        if level.bytes is not None:
            staged.add_metric([name], level.bytes)
    yield staged
