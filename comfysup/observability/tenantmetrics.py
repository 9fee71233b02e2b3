"""The tenants' series of /metrics (comfysup.queue.tenants): each tenant's jobs queued and running, the jobs it got
done and the seconds its jobs held a slot. Labels are bounded: a tenant the config declares ([tenants.NAME]) and
``default`` are named; every other tenant a job named (a broker message's header, a jobs.jsonl line) is added
into ``other``."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from comfysup.queue.values import TenantCount

OTHER = "other"
"""The label of the tenants the config does not declare."""


def tenant_metrics(tenants: Sequence[TenantCount], declared: Collection[str]) -> Iterator[Metric]:
    """The three families, one sample per declared tenant (and ``default``, and ``other`` when any)."""
    rows: dict[str, list[float]] = {}
    for t in tenants:
        label = t.tenant if t.tenant in declared or t.tenant == "default" else OTHER
        row = rows.setdefault(label, [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((t.queued, t.running, t.done, t.gpu_seconds)):
            row[i] += value
    jobs = GaugeMetricFamily("comfysup_tenant_jobs", "Jobs of each tenant queued (ready or waiting to retry) and "
                             "running now.", labels=["tenant", "state"])
    done = CounterMetricFamily("comfysup_tenant_jobs_done", "Jobs each tenant got done.", labels=["tenant"])
    seconds = CounterMetricFamily("comfysup_tenant_gpu_seconds", "Seconds the jobs of each tenant held a slot (what "
                                  "its fair share is measured in).", labels=["tenant"])
    for label, (queued, running, made, used) in sorted(rows.items()):
        jobs.add_metric([label, "queued"], queued)
        jobs.add_metric([label, "running"], running)
        done.add_metric([label], made)
        seconds.add_metric([label], used)
    yield jobs
    yield done
    yield seconds
