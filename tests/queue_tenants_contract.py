"""The tenants' part of the queue contract, mixed into ``QueueContract`` so that both backends run it: a tenant
on every job, the claim served to the tenant furthest below its weighted share of slot time, caps, affinity
inside the tenant chosen, and max_queued refusing a submit whole."""

from __future__ import annotations

from typing import Any

import pytest

from comfysup import records
from comfysup.queue.base import Output, Queue
from comfysup.queue.tenants import TenantFull, TenantLimits
from comfysup.workflows import model_key

T0 = 1_700_000_000.0
LEASE = 30.0


def jobs_of(tenant: str, first: int, n: int, *, model: str | None = None) -> list[Any]:
    from tests.queue_contract import make_job, model_job

    made = [make_job(first + i) if model is None else model_job(first + i, model) for i in range(n)]
    return [records.replace(j, tenant=tenant) for j in made]


def run(q: Queue, owner: str, seconds: float, at: float) -> str:
    """Claim one job at ``at`` and complete it ``seconds`` later: the tenant it served."""
    claim = q.leases.claim(owner, "gpu0", LEASE, now=at)
    assert claim is not None
    q.leases.complete(claim, [], now=at + seconds)
    return q.reads.get(claim.id).tenant


class TenantsContract:
    def test_a_job_names_its_tenant_and_one_that_names_none_is_the_default(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        q.intake.submit([*jobs_of("acme", 1, 1), make_job(2)], now=T0)
        assert q.reads.get(jobs_of("acme", 1, 1)[0].id).tenant == "acme"
        assert q.reads.get(make_job(2).id).tenant == "default"
        counts = {t.tenant: t for t in q.reads.tenant_counts()}
        assert (counts["acme"].queued, counts["default"].queued) == (1, 1)

    def test_the_claim_serves_the_tenant_furthest_below_its_share_of_slot_time(self, q: Queue) -> None:
        q.intake.submit(jobs_of("a", 0, 20) + jobs_of("b", 100, 20), now=T0)
        # a ran one long job (100 s), b none: b is served until its seconds pass a's, long jobs counting long
        assert run(q, "r", 100.0, T0) == "a"
        served = [run(q, "r", 30.0, T0 + 200 + i * 40) for i in range(5)]
        assert served == ["b", "b", "b", "b", "a"]  # b at 120 s > a at 100 s: a again
        counts = {t.tenant: t for t in q.reads.tenant_counts()}
        assert counts["a"].gpu_seconds == pytest.approx(130.0) and counts["b"].gpu_seconds == pytest.approx(120.0)
        assert (counts["a"].done, counts["b"].done) == (2, 4)

    def test_weights_share_the_slot_time(self, q: Queue) -> None:
        q.tenants = {"a": TenantLimits(weight=3.0), "b": TenantLimits(weight=1.0)}
        q.intake.submit(jobs_of("a", 0, 40) + jobs_of("b", 100, 40), now=T0)
        served = [run(q, "r", 10.0, T0 + i * 20) for i in range(40)]
        assert served.count("a") == 30 and served.count("b") == 10

    def test_inside_a_tenant_priority_then_age(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        q.intake.submit([records.replace(make_job(1), tenant="a"),
                         records.replace(make_job(2, priority=5), tenant="a")], now=T0)
        assert q.leases.claim("r", "gpu0", LEASE, now=T0).id == make_job(2).id

    def test_a_tenant_alone_gets_every_slot(self, q: Queue) -> None:
        q.intake.submit(jobs_of("solo", 0, 4), now=T0)
        assert all(q.leases.claim(f"r{i}", f"gpu{i}", LEASE, now=T0) is not None for i in range(4))

    def test_a_tenant_at_its_cap_is_passed_over_until_a_job_of_it_ends(self, q: Queue) -> None:
        q.tenants = {"a": TenantLimits(max_running=2)}
        q.intake.submit(jobs_of("a", 0, 5) + jobs_of("b", 100, 5), now=T0)
        q.db.transaction(lambda cur: cur.execute("UPDATE tenants SET gpu_seconds = 1000 WHERE name = 'b'"))
        claims = [q.leases.claim(f"r{i}", f"gpu{i}", LEASE, now=T0) for i in range(4)]
        assert [q.reads.get(c.id).tenant for c in claims] == ["a", "a", "b", "b"]
        q.leases.complete(claims[0], [], now=T0 + 1)
        assert q.reads.get(q.leases.claim("r9", "gpu9", LEASE, now=T0 + 1).id).tenant == "a"

    def test_a_tenant_capped_alone_leaves_its_jobs_queued(self, q: Queue) -> None:
        q.tenants = {"a": TenantLimits(max_running=1)}
        q.intake.submit(jobs_of("a", 0, 3), now=T0)
        assert q.leases.claim("r0", "gpu0", LEASE, now=T0) is not None
        assert q.leases.claim("r1", "gpu1", LEASE, now=T0) is None

    def test_affinity_works_inside_the_tenant_chosen(self, q: Queue) -> None:
        q.intake.submit(jobs_of("a", 0, 2, model="x.safetensors") + jobs_of("a", 10, 1, model="y.safetensors")
                        + jobs_of("b", 20, 2, model="y.safetensors"), now=T0)
        q.db.transaction(lambda cur: cur.execute("UPDATE tenants SET gpu_seconds = 1000 WHERE name = 'b'"))
        key = model_key(jobs_of("a", 10, 1, model="y.safetensors")[0].workflow)
        claim = q.leases.claim("r", "gpu0", LEASE, now=T0, prefer_model=key, max_wait_seconds=60)
        assert claim.id == jobs_of("a", 10, 1)[0].id  # a's y job, not b's (b is above its share)

    def test_max_queued_refuses_the_whole_submit(self, q: Queue) -> None:
        q.tenants = {"a": TenantLimits(max_queued=3)}
        q.intake.submit(jobs_of("a", 0, 2), now=T0)
        with pytest.raises(TenantFull) as refused:
            q.intake.submit(jobs_of("a", 10, 2) + jobs_of("b", 20, 1), now=T0)
        assert (refused.value.tenant, refused.value.queued, refused.value.max_queued) == ("a", 4, 3)
        assert q.reads.states([j.id for j in jobs_of("b", 20, 1)]) == {}
        q.intake.submit(jobs_of("a", 10, 1), now=T0)  # up to the bound is fine

    def test_a_tenant_is_charged_its_execution_not_its_wait_in_comfyuis_queue(self, q: Queue) -> None:
        q.intake.submit(jobs_of("a", 0, 2), now=T0)
        posted = q.leases.claim("r", "gpu0", LEASE, now=T0)
        q.leases.complete(posted, [], now=T0 + 100, trace={"comfyui_wait_s": 93.0, "run_s": 7.0})
        lost = q.leases.claim("r", "gpu0", LEASE, now=T0 + 100)  # no trace (a runner that died): claim to end
        q.leases.release(lost, "shutdown", now=T0 + 104)
        assert next(t for t in q.reads.tenant_counts() if t.tenant == "a").gpu_seconds == pytest.approx(11.0)

    def test_a_tenant_back_from_idle_starts_level_with_the_busy_ones(self, q: Queue) -> None:
        q.intake.submit(jobs_of("a", 0, 3) + jobs_of("b", 100, 1), now=T0)
        assert run(q, "r", 10.0, T0) == "a"
        assert run(q, "r", 10.0, T0 + 20) == "b"  # b is idle from now on
        for i in range(2):
            run(q, "r", 50.0, T0 + 40 + i * 60)  # a alone: 110 s
        q.intake.submit(jobs_of("a", 10, 3) + jobs_of("c", 200, 3), now=T0 + 200)  # c new: level with a
        q.intake.submit(jobs_of("b", 300, 3), now=T0 + 200)  # b back: level with a too, not 100 s ahead
        counts = {t.tenant: t.gpu_seconds for t in q.reads.tenant_counts()}
        assert counts["a"] == counts["b"] == counts["c"] == pytest.approx(110.0)
        served = [run(q, "r", 10.0, T0 + 300 + i * 20) for i in range(6)]
        assert sorted(served) == ["a", "a", "b", "b", "c", "c"]

    def test_running_jobs_count_in_the_share_at_the_seconds_their_tenant_last_took(self, q: Queue) -> None:
        """A claim adds its tenant's last attempt's seconds to the tenant's share until that attempt ends: tenants
        level with each other take turns while their jobs run, where charging only at the end served one tenant
        until its first job ended. A tenant new to the queue expects what the tenant it starts level with took."""
        q.intake.submit(jobs_of("a", 0, 5), now=T0)
        assert run(q, "r", 60.0, T0) == "a"
        q.intake.submit(jobs_of("b", 100, 5), now=T0 + 100)  # level with a at 60 s, expecting 60 s a job
        held = [q.leases.claim(f"r{i}", "gpu0", LEASE, now=T0 + 100) for i in range(6)]
        assert [q.reads.get(c.id).tenant for c in held] == ["a", "b", "a", "b", "a", "b"]
        for claim in held[:4]:
            q.leases.complete(claim, [], now=T0 + 110)  # 10 s each, not the 60 expected: 10 charged, 60 taken back
        counts = {t.tenant: t.gpu_seconds for t in q.reads.tenant_counts()}
        assert (counts["a"], counts["b"]) == (pytest.approx(80.0), pytest.approx(80.0))
        q.leases.complete(held[5], [], now=T0 + 130)  # b: 110 executed, its last 30 s; a: 80 + 60 expected
        served = [q.leases.claim(f"s{i}", "gpu0", LEASE, now=T0 + 130) for i in range(3)]
        assert [q.reads.get(c.id).tenant for c in served] == ["b", "a", "b"]  # b 110 + 30 = a's 140: a by name

    def test_a_queue_without_tenants_writes_no_tenant_row_as_jobs_end(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        q.intake.submit([make_job(n) for n in range(3)], now=T0)
        for i in range(2):
            run(q, "r", 5.0, T0 + i * 10)
        (alone,) = q.reads.tenant_counts()
        assert (alone.tenant, alone.done, alone.gpu_seconds) == ("default", 2, 0.0)
        q.intake.submit(jobs_of("b", 10, 1), now=T0 + 30)  # the first other tenant: default's done seeded
        run(q, "r", 5.0, T0 + 40)
        counts = {t.tenant: t for t in q.reads.tenant_counts()}
        assert counts["default"].done + counts["b"].done == 3 and counts["default"].done >= 2

    def test_a_storing_job_holds_no_slot_of_its_tenant_and_counts_done_once_stored(self, q: Queue) -> None:
        """Storing (outputs staged on the machine, waiting for the bucket): neither running for max_running nor
        queued for max_queued; its seconds are charged as its attempt ends, and it is done when stored."""
        q.tenants = {"a": TenantLimits(max_running=1, max_queued=1)}
        first, second = jobs_of("a", 0, 2)
        q.intake.submit([first], now=T0)
        claim = q.leases.claim("hostA/1/gpu0/t", "gpu0", LEASE, now=T0)
        q.leases.complete(claim, [Output("a.png", 1, "00", "/staging/j/a.png")], now=T0 + 4, staged_in="/staging/j")
        q.intake.submit([second], now=T0 + 5)  # storing is not queued: within max_queued
        assert q.leases.claim("hostA/1/gpu1/t", "gpu1", LEASE, now=T0 + 5).id == second.id  # nor running
        counts = next(t for t in q.reads.tenant_counts() if t.tenant == "a")
        assert (counts.queued, counts.running, counts.done, counts.gpu_seconds) == (0, 1, 0, pytest.approx(4.0))
        (staged,) = q.uploads.staged("hostA")
        assert staged.tenant == "a"
        assert q.uploads.stored(staged, [Output("a.png", 1, "00", "s3://b/a.png")], now=T0 + 6)
        assert next(t for t in q.reads.tenant_counts() if t.tenant == "a").done == 1
