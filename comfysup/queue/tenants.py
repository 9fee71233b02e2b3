"""Tenants in the queue: who a job belongs to, and the limits the queue keeps for each.

Every job has a tenant (``default`` when none is named). The claim (the dialects' ``head`` statement) serves the
tenant furthest below its weighted share of slot time first: tenants are walked in the order of
``(gpu_seconds + running_seconds) / weight``, where ``gpu_seconds`` is the running total of the seconds that
tenant's attempts executed, added by a trigger as each attempt ends, and ``running_seconds`` what its running
attempts are expected to take: each claim adds its tenant's last attempt's seconds (at least a millisecond, so that
tenants level with each other take turns), kept in the attempt's row, and the attempt's end takes them back.
Inside the tenant, priority then submission order (and model affinity) as before. A tenant that submits while it
has no job queued or running starts level with the least-served tenant that has work, or with the most-served one
when none has, and expects its attempts to take what that tenant's last took until one of its own ends
(``arrive``): shares count while a tenant has work, so an idle tenant does not come back with a credit that would
take the whole fleet from the others. A tenant at its ``max_running`` is passed over. ``max_queued`` bounds a
tenant's queued jobs: a submit that would pass it is refused whole (``TenantFull``). A storing job (its outputs
staged on its machine for the bucket, comfysup.queue.uploads) holds no slot: it counts toward neither bound, and
among its tenant's jobs done once its uploader has stored it.

The limits come from the config's ``[tenants.NAME]`` (comfysup.config.schema.TenantConfig); each process writes
the ones it knows into the ``tenants`` table once, in its first claim or submit, so the claim reads them there.
Every machine of a queue should declare the same tenants.

On PostgreSQL a claim never waits for its tenant's row (an end holds it until its commit): while another
transaction holds it, the claim's attempt expects nothing and its tenant is charged when it ends. Two claims at
once must not both see a tenant one below its cap: while any declared tenant has a ``max_running``, every claim
takes one transaction-scoped advisory lock (CLAIM_LOCK) before it counts, so each count includes every claim
committed before it. A submit to a tenant with ``max_queued`` takes that tenant's own
advisory lock (``TENANT_QUEUED_LOCK``, the tenant's name) before it counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from comfysup.errors import QueueError
from comfysup.records import Record

DEFAULT = "default"
"""The tenant of a job that names none."""
CLAIM_LOCK = 0x636F6D6679636C6D
"""PostgreSQL's advisory lock key of the claims while a tenant has a cap ("comfyclm")."""
TENANT_QUEUED_LOCK = 0x636F6D66
"""PostgreSQL's advisory lock class of a tenant's queued count (the second key is the name's hash)."""


class TenantLimits(Record):
    """What the queue keeps of a declared tenant: its share's ``weight``, and its bounds (0: none)."""

    weight: float = 1.0
    max_running: int = 0
    max_queued: int = 0


class TenantFull(QueueError):
    """A submit would take a tenant past its ``max_queued``; nothing was inserted. ``comfysup submit`` exits 4."""

    exit_code = 4

    def __init__(self, tenant: str, queued: int, max_queued: int) -> None:
        self.tenant, self.queued, self.max_queued = tenant, queued, max_queued
        super().__init__(f"tenant {tenant!r}: {queued} queued job(s) with this submit, more than its max_queued "
                         f"of {max_queued}; nothing was submitted: wait for some to run, or raise "
                         f"[tenants.{tenant}] max_queued")


def tenant_of(name: str | None) -> str:
    """The tenant a job belongs to: ``name``, or DEFAULT when none is given."""
    return name or DEFAULT


class TenantBook:
    """One process's view of the declared tenants, held by its queue database (``SQLDb.tenants``)."""

    def __init__(self, limits: Mapping[str, TenantLimits] | None = None) -> None:
        self.limits: dict[str, TenantLimits] = dict(limits or {})
        self.written = False

    @property
    def capped(self) -> bool:
        """Some declared tenant has a ``max_running``: a claim must count under the claim lock."""
        return any(t.max_running for t in self.limits.values())

    def write(self, db: Any, cur: Any) -> None:
        """The declared weights and caps into the ``tenants`` table, once per process."""
        if self.written:
            return
        rows = [{"name": name, "weight": t.weight, "max_running": t.max_running or None}
                for name, t in sorted(self.limits.items())]
        if rows:
            cur.execute(db.sql["seed_default"], max(rows, key=lambda r: r["name"] != DEFAULT))
            cur.executemany(db.sql["declare_tenant"], rows)
        self.written = True

    def arrive(self, db: Any, cur: Any, tenants: Iterable[str]) -> None:
        """Before a submit's jobs are inserted: a row for each tenant it names, and one that has no job queued or
        running starts level with the least-served tenant that has (``level_tenant``)."""
        self.write(db, cur)
        for name in sorted(set(tenants)):
            cur.execute(db.sql["seed_default"], {"name": name})
            cur.execute(db.sql["add_tenant"], {"name": name})
            cur.execute(db.sql["level_tenant"], {"name": name})

    def admit(self, db: Any, cur: Any, tenants: Iterable[str], lock: bool) -> None:
        """After a submit's jobs are inserted: each ``max_queued`` checked against the queued jobs this transaction
        sees (its own included); raises TenantFull."""
        for name in sorted(set(tenants)):
            bound = self.limits.get(name, TenantLimits()).max_queued
            if not bound:
                continue
            if lock:
                cur.execute(db.sql["lock_tenant_queue"], {"kind": TENANT_QUEUED_LOCK, "name": name})
            queued = int(cur.execute(db.sql["tenant_queued"], {"name": name}).fetchone()["n"])
            if queued > bound:
                raise TenantFull(name, queued, bound)
