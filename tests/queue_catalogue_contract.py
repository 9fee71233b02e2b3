"""The node catalogues' part of the queue contract, mixed into ``QueueContract`` so that both
backends run it: catalogues stored once per content, the one each server has now, and the claim that
passes over a job the claiming server's catalogue refused."""

from __future__ import annotations

from typing import Any

from comfysup import records
from comfysup.queue.base import Queue

T0 = 1_700_000_000.0
LEASE = 30.0
CAT_A = {"EmptyImage": {"input": {"required": {"width": ["INT", {"min": 1}]}}}, "SaveImage": {"output_node": True}}
CAT_B = {**CAT_A, "FooNode": {"input": {}}}


class CatalogueContract:
    def count(self, q: Queue, table: str) -> int:
        raise NotImplementedError

    def test_a_catalogue_is_stored_once_per_content(self, q: Queue) -> None:
        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        assert q.fleet.record_catalogue("gpu1", "host1", dict(CAT_A), now=T0) == a
        b = q.fleet.record_catalogue("gpu0", "host2", CAT_B, now=T0)
        assert b != a
        assert self.count(q, "catalogues") == 2
        found = {c.id: c for c in q.fleet.catalogues()}
        assert found[a].info == CAT_A
        assert sorted(found[a].servers) == ["gpu0@host1", "gpu1@host1"]
        assert found[b].servers == ["gpu0@host2"]

    def test_a_server_restarted_with_another_catalogue_has_only_the_new_one(self, q: Queue) -> None:
        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        b = q.fleet.record_catalogue("gpu0", "host1", CAT_B, now=T0 + 1)
        assert [c.id for c in q.fleet.catalogues()] == [b]
        assert a != b

    def test_the_claim_passes_over_a_job_its_catalogue_refused(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        b = q.fleet.record_catalogue("gpu1", "host1", CAT_B, now=T0)
        first = records.replace(make_job(1, priority=5), refused=((a, "node 1 (FooNode) is not installed"),))
        q.intake.submit([first, make_job(2)], now=T0)
        claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0, catalogue=a)
        assert claim is not None and claim.id == make_job(2).id
        assert q.leases.claim("runner-a2", "gpu0", LEASE, now=T0, catalogue=a) is None
        claim = q.leases.claim("runner-b", "gpu1", LEASE, now=T0, catalogue=b)
        assert claim is not None and claim.id == first.id
        assert q.reads.get(first.id).attempt == 1

    def test_the_affine_claim_passes_over_a_refused_job_too(self, q: Queue) -> None:
        from tests.queue_contract import model_job

        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        refused = records.replace(model_job(1, "x.safetensors"), refused=((a, "no x"),))
        q.intake.submit([refused, model_job(2, "y.safetensors")], now=T0)
        claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0, prefer_model="x.safetensors", max_wait_seconds=30,
                        catalogue=a)
        assert claim is not None and claim.id == model_job(2, "y").id

    def test_refuse_releases_uncounted_while_another_server_can_run_it(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        b = q.fleet.record_catalogue("gpu1", "host1", CAT_B, now=T0)
        q.intake.submit([make_job(1)], now=T0)
        claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0, catalogue=a)
        assert claim is not None
        assert q.fleet.refuse(claim, a, "node 1 (EmptyImage): width 0 is below its minimum 1", now=T0) is False
        job = q.reads.get(claim.id)
        assert (job.state, job.attempt) == ("queued", 0)
        assert q.leases.claim("runner-a", "gpu0", LEASE, now=T0, catalogue=a) is None
        again = q.leases.claim("runner-b", "gpu1", LEASE, now=T0, catalogue=b)
        assert again is not None and again.id == claim.id and again.attempt == 1

    def test_refuse_dead_letters_a_job_no_server_can_run(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        b = q.fleet.record_catalogue("gpu1", "host1", CAT_B, now=T0)
        q.intake.submit([records.replace(make_job(1), refused=((b, "class 'X' is not installed"),))], now=T0)
        claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0, catalogue=a)
        assert claim is not None
        assert q.fleet.refuse(claim, a, "class 'X' is not installed", now=T0) is True
        job: Any = q.reads.get(claim.id)
        assert job.state == "dead"
        assert job.reason == "no server can run it: class 'X' is not installed"

    def test_a_changed_catalogue_dead_letters_the_jobs_every_current_one_refused(self, q: Queue) -> None:
        """gpu1 could run job 1 (refused only by gpu0's catalogue A); gpu1 restarts without FooNode, on A too:
        no server can run the job now and no claim would ever take it, so it is dead-lettered there and
        then, with its webhook due. A job some server can still run stays queued."""
        from tests.queue_contract import make_job

        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        q.fleet.record_catalogue("gpu1", "host1", CAT_B, now=T0)
        stranded = records.replace(make_job(1, callback_url="http://hooks.example/1"),
                                       refused=((a, "class 'FooNode' is not installed"),))
        q.intake.submit([stranded, make_job(2)], now=T0)
        assert q.reads.get(stranded.id).state == "queued"
        q.fleet.record_catalogue("gpu1", "host1", CAT_A, now=T0 + 1)  # gpu1 restarted without the custom node
        job: Any = q.reads.get(stranded.id)
        assert (job.state, job.reason) == ("dead", "no server can run it: class 'FooNode' is not installed")
        assert [d.url for d in q.deliveries.deliveries(stranded.id)] == ["http://hooks.example/1"]
        assert q.reads.get(make_job(2).id).state == "queued"

    def test_a_resubmitted_job_keeps_its_refusals_once(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        a = q.fleet.record_catalogue("gpu0", "host1", CAT_A, now=T0)
        job = records.replace(make_job(1), refused=((a, "no"),))
        q.intake.submit([job], now=T0)
        assert q.intake.submit([job], now=T0 + 1).existing == 1
        assert self.count(q, "job_refusals") == 1
