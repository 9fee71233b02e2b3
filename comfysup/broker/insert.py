"""A batch of broker messages into the queue: each message's job with its tenant, the insert, and the messages
the queue refused with their reasons (an id it holds with other content, a tenant past its max_queued), which go
to the invalid queue while the rest of the batch is inserted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, TypeVar

from comfysup.config.tenants import TENANT_NAME
from comfysup.jobs import JobLineError, NewJob
from comfysup.queue.base import Queue, SubmitConflict
from comfysup.queue.tenants import TenantFull, tenant_of
from comfysup.records import replace

M = TypeVar("M")


def with_tenant(job: NewJob, header: Any) -> NewJob:
    """The job with its tenant: its line's, else the message's ``tenant`` header, else ``default``; a header that
    is no tenant's name is the message's problem (JobLineError)."""
    if job.tenant or header is None:
        return replace(job, tenant=tenant_of(job.tenant))
    if isinstance(header, bytes):
        header = header.decode("utf-8", "replace")
    if not isinstance(header, str) or not TENANT_NAME.fullmatch(header):
        raise JobLineError(f"the tenant header {str(header)[:80]!r} is not a tenant's name: 1 to 64 letters, "
                           "digits, '_', '.' or '-'")
    return replace(job, tenant=header)


def insert(queue: Queue, valid: Mapping[str, tuple[NewJob, M]], counts: Counter[str]) -> list[tuple[M, str]]:
    """Insert the jobs of ``valid`` (id -> job and its message), counting ``inserted`` and ``existing``; what the
    queue refused, with its reason. A refused part is left out and the rest inserted again."""
    refused: list[tuple[M, str]] = []
    jobs = [job for job, _ in valid.values()]
    while jobs:
        try:
            result = queue.intake.submit(jobs)
        except SubmitConflict as exc:
            bad = set(exc.ids)
            refused += [(m, f"id {i} is already in the queue with different content; give the changed job a new "
                         "id") for i, (_, m) in valid.items() if i in bad]
            jobs = [j for j in jobs if j.id not in bad]
        except TenantFull as exc:  # that tenant's jobs of the batch refused, the others inserted
            refused += [(m, str(exc)) for j, m in valid.values() if j.tenant == exc.tenant]
            jobs = [j for j in jobs if j.tenant != exc.tenant]
        else:
            counts["inserted"] += result.inserted
            counts["existing"] += result.existing
            break
    return refused
