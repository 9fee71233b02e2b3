"""The storing part of the queue contract (uploads through an outbox), mixed into ``QueueContract`` so that both
backends run it: a job recorded storing is held by no runner and no lease, only its machine's uploader ends it,
every end is fenced, and status, cancel and requeue know the state."""

from __future__ import annotations

from comfysup.errors import LeaseLost
from comfysup.queue.base import Output, Queue

T0 = 1_700_000_000.0
LEASE = 30.0
STAGED = [Output(name="a.png", size=10, sha256="aa" * 32, path="/staging/j/a.png"),
          Output(name="b.png", size=5, sha256="bb" * 32, path="/staging/j/b.png")]


def stage(q: Queue, n: int = 1, owner: str = "hostA/1/gpu0/t", now: float = T0) -> str:
    from tests.queue_contract import make_job

    q.intake.submit([make_job(n)], now=now)
    claim = q.leases.claim(owner, "gpu0", LEASE, now=now)
    assert claim is not None
    q.leases.complete(claim, STAGED, now=now + 1, staged_in="/staging/j")
    return claim.id


class StoringContract:
    def test_a_staged_job_is_storing_on_its_machine_and_no_claim_or_lease_takes_it(self, q: Queue) -> None:
        job_id = stage(q)
        record = q.reads.get(job_id)
        assert (record.state, record.machine, record.staged_in, record.owner) == ("storing", "hostA", "/staging/j",
                                                                                 None)
        assert [o.path for o in record.outputs] == ["/staging/j/a.png", "/staging/j/b.png"]
        assert [a.outcome for a in record.attempts] == ["storing"]
        assert q.leases.claim("hostB/1/gpu0/t", "gpu0", LEASE, now=T0 + 10_000) is None  # long past any lease
        assert q.reads.get(job_id).state == "storing"
        assert q.reads.active_count() == 0  # drained for the runners: the uploader ends it
        status = q.reads.status(now=T0 + 2)
        assert (status.counts["storing"], status.counts["running"], status.counts["done"]) == (1, 0, 0)
        assert q.uploads.staging_bytes("hostA") == 15 and q.uploads.staging_bytes("hostB") == 0
        assert [j.id for j in q.uploads.staged("hostA")] == [job_id] and q.uploads.staged("hostB") == []
        [(machine, level)] = q.uploads.by_machine(now=T0 + 11).items()
        assert (machine, level.items, level.bytes, level.oldest_age_seconds) == ("hostA", 1, 15, 10)

    def test_a_stale_attempt_cannot_write_a_storing_job(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        q.intake.submit([make_job(1)], now=T0)
        claim = q.leases.claim("hostA/1/gpu0/t", "gpu0", LEASE, now=T0)
        assert claim is not None
        q.leases.complete(claim, STAGED, now=T0 + 1, staged_in="/staging/j")
        for write in (lambda: q.leases.heartbeat(claim, LEASE, now=T0 + 2),
                      lambda: q.leases.complete(claim, [], now=T0 + 2),
                      lambda: q.leases.dead(claim, "late", now=T0 + 2)):
            try:
                write()
            except LeaseLost:
                continue
            raise AssertionError("a write of the attempt that staged the job went through")
        assert q.leases.release_owner("hostA/1/gpu0/t", "runner died") == []
        assert q.reads.get(claim.id).state == "storing"

    def test_stored_makes_it_done_once_with_the_objects_and_its_webhook(self, q: Queue) -> None:
        q.default_callback_url = "http://hooks.example/x"  # type: ignore[misc]
        job_id = stage(q)
        job = q.uploads.staged("hostA")[0]
        q.uploads.upload_failed(job, "cannot reach the service")
        assert q.reads.get(job_id).reason == "cannot reach the service"
        levels = q.deliveries.outboxes(now=T0 + 31)
        assert (levels["uploads"].items, levels["uploads"].bytes) == (1, 15)
        assert levels["uploads"].oldest_age_seconds == 30
        uploaded = [Output(name=o.name, size=o.size, sha256=o.sha256, path=f"s3://b/p/{job_id}/{o.name}")
                    for o in job.outputs]
        assert q.uploads.stored(job, uploaded, now=T0 + 40)
        assert not q.uploads.stored(job, uploaded, now=T0 + 41)  # a second uploader: nothing changes
        record = q.reads.get(job_id)
        assert (record.state, record.reason, record.finished_at) == ("done", None, T0 + 40)
        assert [o.path for o in record.outputs] == [o.path for o in uploaded] and all(o.id for o in record.outputs)
        assert len(q.deliveries.deliveries(job_id)) == 1
        assert q.reads.status(now=T0 + 41).counts["done"] == 1
        assert q.deliveries.outboxes(now=T0 + 41)["uploads"].items == 0
        assert q.deliveries.outboxes(now=T0 + 41)["webhooks"].items == 1

    def test_give_up_dead_letters_a_storing_job(self, q: Queue) -> None:
        job_id = stage(q)
        job = q.uploads.staged("hostA")[0]
        assert q.uploads.give_up(job, "could not store the outputs in the bucket for 1 h", now=T0 + 3600)
        record = q.reads.get(job_id)
        assert (record.state, record.reason) == ("dead", "could not store the outputs in the bucket for 1 h")
        assert not q.uploads.stored(job, [], now=T0 + 3601)

    def test_cancel_ends_a_storing_job_at_once_and_its_uploader_is_refused(self, q: Queue) -> None:
        job_id = stage(q)
        job = q.uploads.staged("hostA")[0]
        assert q.intake.cancel([job_id], now=T0 + 5) == {job_id: "cancelled"}
        assert q.reads.get(job_id).state == "cancelled"
        assert not q.uploads.stored(job, [], now=T0 + 6)
        assert q.reads.get(job_id).state == "cancelled"

    def test_requeue_of_a_storing_job_runs_it_again_and_fences_its_old_uploader(self, q: Queue) -> None:
        job_id = stage(q)
        job = q.uploads.staged("hostA")[0]
        assert q.intake.requeue_dead([job_id], now=T0 + 5) == {job_id: "requeued"}
        assert q.intake.requeue_dead(None, now=T0 + 5) == {}  # all dead jobs: a storing one only by name
        record = q.reads.get(job_id)
        assert (record.state, record.attempt, record.outputs, record.staged_in) == ("queued", 0, [], None)
        claim = q.leases.claim("hostB/1/gpu0/t", "gpu0", LEASE, now=T0 + 6)
        assert claim is not None and (claim.id, claim.attempt) == (job_id, 1)
        q.leases.complete(claim, STAGED, now=T0 + 7, staged_in="/staging/j")
        assert not q.uploads.stored(job, [], now=T0 + 8)  # hostA came back: attempt 1 is hostB's now
        assert q.reads.get(job_id).machine == "hostB"
