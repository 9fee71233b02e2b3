"""The behaviour every queue backend promises (comfysup/queue/base.py), written once.

Like huey's storage tests: a backend's test module subclasses ``QueueContract`` and says how to make
its queue; every test here then runs against that backend. Time is passed explicitly (``now=``), so
leases and retry delays are tested without sleeping.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from comfysup import records
from comfysup.errors import LeaseLost, NotFound
from comfysup.queue.base import Claim, JobPulse, NewJob, Output, PromptRecord, Queue, SubmitConflict
from comfysup.workflows import model_key
from tests.queue_assets_contract import AssetsContract
from tests.queue_catalogue_contract import CatalogueContract
from tests.queue_search_contract import SearchContract
from tests.queue_storing_contract import StoringContract
from tests.queue_tenants_contract import TenantsContract

T0 = 1_700_000_000.0
LEASE = 30.0
WAIT = 30.0
"""affinity_max_wait_seconds in the affinity tests."""


def make_job(n: int, *, priority: int = 0, seed: int | None = None, extra: dict[str, Any] | None = None,
             meta: dict[str, Any] | None = None, callback_url: str = "") -> NewJob:
    """A small valid job; ``seed`` changes its content (and so its spec_hash) without changing its id."""
    workflow = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "color": seed or n}},
                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": f"j{n}"}}}
    extra = extra or {}
    meta = meta if meta is not None else {"n": n}
    text = json.dumps(workflow, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(f"{text}\0{json.dumps(extra, sort_keys=True)}\0{json.dumps(meta, sort_keys=True)}"
                            f"\0{priority}".encode()).hexdigest()
    return NewJob(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-test/{n}")), workflow=workflow,
                  spec_hash=digest, priority=priority, extra_data=extra, meta=meta,
                  params={"1.color": seed or n}, workflow_name="test", workflow_json=text, callback_url=callback_url)


def model_job(n: int, model: str, *, priority: int = 0) -> NewJob:
    """A job whose checkpoint loader loads ``model``: its model key is derived by the queue."""
    workflow = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": model}},
                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": f"m{n}"}}}
    return NewJob(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-test/{n}")), workflow=workflow,
                  spec_hash=f"model-{n}-{model}-{priority}", priority=priority, workflow_name="model")


BIG_TEMPLATE = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
    "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse " * 200, "clip": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "batch"}},
}


def batch_job(n: int, template: dict[str, Any] = BIG_TEMPLATE) -> NewJob:
    """A line of a batch as comfysup submit makes it: the template's text and hash, and the line's own set."""
    params = {"1.color": n, "3.filename_prefix": f"b{n}"}
    workflow = json.loads(json.dumps(template))
    workflow["1"]["inputs"]["color"] = n
    workflow["3"]["inputs"]["filename_prefix"] = f"b{n}"
    stored = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return NewJob(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-test/{n}")), workflow=workflow,
                  spec_hash=hashlib.sha256(json.dumps(workflow, sort_keys=True).encode()).hexdigest(),
                  params=params, workflow_json=json.dumps(workflow, sort_keys=True, separators=(",", ":")),
                  template_json=stored, template_hash=hashlib.sha256(stored.encode()).hexdigest(), model_key="")


class QueueContract(CatalogueContract, AssetsContract, StoringContract, SearchContract, TenantsContract):
    """Subclass with ``make_queue(self, tmp_path) -> Queue`` and ``count(self, q, table) -> int`` (rows in
    one of the backend's tables); the name keeps pytest from collecting it."""

    def make_queue(self, tmp_path: Path) -> Queue:
        raise NotImplementedError

    def count(self, q: Queue, table: str) -> int:
        raise NotImplementedError

    @pytest.fixture
    def q(self, tmp_path: Path) -> Any:
        queue = self.make_queue(tmp_path)
        yield queue
        queue.close()

    # -- helpers ----------------------------------------------------------------------------------------

    @staticmethod
    def submit(q: Queue, *jobs: NewJob, now: float = T0) -> None:
        result = q.intake.submit(list(jobs), now=now)
        assert result.inserted == len(jobs)

    @staticmethod
    def claim(q: Queue, owner: str = "runner-a", server: str = "gpu0", now: float = T0,
              lease: float = LEASE) -> Claim:
        claim = q.leases.claim(owner, server, lease, now=now)
        assert claim is not None, "expected a claimable job"
        return claim

    # -- submit -----------------------------------------------------------------------------------------

    def test_submit_inserts_a_batch_and_keeps_its_content(self, q: Queue) -> None:
        jobs = [make_job(i, priority=i % 3, extra={"k": i}, meta={"n": i, "tag": "x"}) for i in range(5)]
        result = q.intake.submit(jobs, now=T0)
        assert (result.inserted, result.existing) == (5, 0)
        got = q.reads.get(jobs[3].id)
        assert got.state == "queued"
        assert got.attempt == 0
        assert got.priority == 0
        assert got.workflow == jobs[3].workflow
        assert got.extra_data == {"k": 3}
        assert got.meta == {"n": 3, "tag": "x"}
        assert got.params == {"1.color": 3}
        assert got.workflow_name == "test"
        assert got.submitted_at == T0
        assert got.attempts == []
        assert got.outputs == []

    def test_submit_same_ids_same_content_counts_existing(self, q: Queue) -> None:
        q.intake.submit([make_job(1), make_job(2)], now=T0)
        result = q.intake.submit([make_job(1), make_job(2), make_job(3)], now=T0 + 5)
        assert (result.inserted, result.existing) == (1, 2)
        assert q.reads.get(make_job(1).id).submitted_at == T0  # the first submission is kept, not replaced
        assert q.reads.status(now=T0 + 5).counts["queued"] == 3

    def test_submit_conflict_inserts_nothing_from_the_whole_batch(self, q: Queue) -> None:
        q.intake.submit([make_job(1)], now=T0)
        batch = [make_job(10), make_job(11), make_job(1, seed=999), make_job(12)]
        with pytest.raises(SubmitConflict) as info:
            q.intake.submit(batch, now=T0)
        assert info.value.ids == [make_job(1).id]
        assert q.reads.get_many([j.id for j in batch]) == [q.reads.get(make_job(1).id)]
        assert q.reads.get(make_job(1).id).workflow == make_job(1).workflow  # the original is unchanged
        assert sum(q.reads.status(now=T0).counts.values()) == 1

    def test_submit_conflict_at_the_end_of_a_large_batch_inserts_nothing(self, q: Queue) -> None:
        """Backends insert in chunks; a conflict found in the last chunk must undo the first ones."""
        q.intake.submit([make_job(5000)], now=T0)
        batch = [make_job(i) for i in range(1200)] + [make_job(5000, seed=1)]
        with pytest.raises(SubmitConflict):
            q.intake.submit(batch, now=T0)
        assert sum(q.reads.status(now=T0).counts.values()) == 1

    def test_submit_accepts_a_generator(self, q: Queue) -> None:
        result = q.intake.submit((make_job(i) for i in range(700)), now=T0)
        assert (result.inserted, result.existing) == (700, 0)

    def test_submit_the_same_id_twice_in_one_batch(self, q: Queue) -> None:
        """Same content twice is one job counted once as existing; different content is a conflict."""
        result = q.intake.submit([make_job(1), make_job(1)], now=T0)
        assert (result.inserted, result.existing) == (1, 1)
        with pytest.raises(SubmitConflict):
            q.intake.submit([make_job(2), make_job(2, seed=77)], now=T0)
        with pytest.raises(NotFound):
            q.reads.get(make_job(2).id)

    # -- claim ------------------------------------------------------------------------------------------

    def test_claim_on_an_empty_queue_returns_none(self, q: Queue) -> None:
        assert q.leases.claim("runner-a", "gpu0", LEASE, now=T0) is None

    def test_claim_sets_attempt_owner_server_and_lease(self, q: Queue) -> None:
        job = make_job(1, extra={"api_key_comfy_org": "k-123456"})
        self.submit(q, job)
        claim = self.claim(q, "runner-a", "gpu0", now=T0 + 1, lease=20)
        assert (claim.id, claim.attempt, claim.owner, claim.server) == (job.id, 1, "runner-a", "gpu0")
        assert claim.lease_until == T0 + 21
        assert claim.workflow == job.workflow
        assert claim.extra_data == job.extra_data
        assert claim.last_server is None and claim.last_prompt_number is None
        assert not claim.cancel_requested
        record = q.reads.get(job.id)
        assert (record.state, record.owner, record.server, record.attempt) == ("running", "runner-a", "gpu0", 1)
        assert record.lease_until == T0 + 21
        assert record.started_at == T0 + 1
        assert len(record.attempts) == 1
        a = record.attempts[0]
        assert (a.attempt, a.owner, a.server, a.started_at, a.ended_at, a.outcome) == \
            (1, "runner-a", "gpu0", T0 + 1, None, None)
        assert q.leases.claim("runner-b", "gpu1", LEASE, now=T0 + 2) is None  # the claimed row is the lock

    def test_claim_order_is_priority_then_submission(self, q: Queue) -> None:
        q.intake.submit([make_job(1, priority=0), make_job(2, priority=5), make_job(3, priority=0)], now=T0)
        q.intake.submit([make_job(4, priority=5), make_job(5, priority=-1), make_job(6, priority=10)], now=T0 + 1)
        order = [self.claim(q, now=T0 + 2).id for _ in range(6)]
        assert order == [make_job(n).id for n in (6, 2, 4, 1, 3, 5)]
        assert q.leases.claim("runner-a", "gpu0", LEASE, now=T0 + 2) is None

    def test_claim_respects_run_after(self, q: Queue) -> None:
        self.submit(q, make_job(1, priority=9), make_job(2))
        first = self.claim(q, now=T0)
        assert first.id == make_job(1).id
        q.leases.retry_later(first, run_after=T0 + 100, reason="server went away", now=T0 + 1)
        second = self.claim(q, now=T0 + 2, lease=1000)
        assert second.id == make_job(2).id  # the higher priority job waits for its run_after
        assert q.leases.claim("runner-a", "gpu0", LEASE, now=T0 + 99.9) is None
        again = self.claim(q, now=T0 + 100)
        assert (again.id, again.attempt) == (make_job(1).id, 2)
        assert again.last_reason == "server went away"

    def test_each_claim_increments_the_attempt(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        for n in range(1, 4):
            claim = self.claim(q, now=T0 + n)
            assert claim.attempt == n
            q.leases.retry_later(claim, run_after=T0 + n, reason=f"try {n}", now=T0 + n)
        record = q.reads.get(make_job(1).id)
        assert [a.attempt for a in record.attempts] == [1, 2, 3]
        assert [a.outcome for a in record.attempts] == ["retry"] * 3
        assert [a.reason for a in record.attempts] == ["try 1", "try 2", "try 3"]

    # -- leases and fencing ------------------------------------------------------------------------------

    def test_heartbeat_extends_the_lease(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0, lease=10)
        assert q.leases.heartbeat(claim, 10, now=T0 + 8) is False
        assert q.reads.get(claim.id).lease_until == T0 + 18
        assert q.leases.claim("runner-b", "gpu1", 10, now=T0 + 15) is None  # not expired: renewed at T0+8

    def test_expired_lease_is_reclaimed_with_the_next_attempt(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        old = self.claim(q, "runner-a", "gpu0", now=T0, lease=10)
        assert q.leases.claim("runner-b", "gpu1", 10, now=T0 + 10) is None  # the lease runs to T0+10 inclusive
        new = self.claim(q, "runner-b", "gpu1", now=T0 + 11, lease=10)
        assert (new.id, new.attempt, new.owner) == (old.id, 2, "runner-b")
        record = q.reads.get(old.id)
        assert [(a.attempt, a.owner, a.outcome) for a in record.attempts] == \
            [(1, "runner-a", "lease_expired"), (2, "runner-b", None)]
        assert record.attempts[0].ended_at == T0 + 11

    @pytest.mark.parametrize("call", ["heartbeat", "complete", "retry_later", "dead", "cancelled", "release",
                                      "record_prompt"])
    def test_the_old_owner_is_fenced_out_after_a_reclaim(self, q: Queue, call: str) -> None:
        self.submit(q, make_job(1))
        old = self.claim(q, "runner-a", "gpu0", now=T0, lease=10)
        new = self.claim(q, "runner-b", "gpu1", now=T0 + 11, lease=10)
        before = q.reads.get(old.id)
        with pytest.raises(LeaseLost):
            self._write_with(q, call, old, now=T0 + 12)
        assert q.reads.get(old.id) == before
        q.leases.complete(new, [Output("a.png", 3, "00" * 32)], now=T0 + 13)  # the new owner still can
        assert q.reads.get(old.id).state == "done"

    @staticmethod
    def _write_with(q: Queue, call: str, claim: Claim, now: float) -> None:
        if call == "heartbeat":
            q.leases.heartbeat(claim, 10, now=now)
        elif call == "complete":
            q.leases.complete(claim, [Output("x.png", 1, "ab" * 32)], now=now)
        elif call == "retry_later":
            q.leases.retry_later(claim, run_after=now, reason="stale", now=now)
        elif call == "dead":
            q.leases.dead(claim, "stale", now=now)
        elif call == "cancelled":
            q.leases.cancelled(claim, "stale", now=now)
        elif call == "release":
            q.leases.release(claim, "stale", now=now)
        elif call == "record_prompt":
            q.leases.record_prompt(claim, "gpu9", 42)
        else:
            raise AssertionError(call)

    @pytest.mark.parametrize("call", ["heartbeat", "complete", "retry_later", "dead", "cancelled", "release"])
    def test_every_write_after_a_terminal_state_is_fenced(self, q: Queue, call: str) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.complete(claim, [], now=T0 + 1)
        before = q.reads.get(claim.id)
        with pytest.raises(LeaseLost):
            self._write_with(q, call, claim, now=T0 + 2)
        assert q.reads.get(claim.id) == before

    def test_a_claim_with_another_owner_or_attempt_is_fenced(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        for forged in (Claim(**{**claim._asdict(), "owner": "runner-z"}),
                       Claim(**{**claim._asdict(), "attempt": claim.attempt + 1})):
            with pytest.raises(LeaseLost):
                q.leases.complete(forged, [], now=T0 + 1)
        assert q.reads.get(claim.id).state == "running"

    # -- what a runner records ----------------------------------------------------------------------------

    def test_record_prompt_is_kept_for_the_next_attempt(self, q: Queue) -> None:
        """A runner that died (pid gone or lease expired) leaves its prompt for the next one to adopt."""
        self.submit(q, make_job(1), make_job(2))
        claim = self.claim(q, "runner-a", "gpu0", now=T0, lease=10)
        q.leases.record_prompt(claim, "gpu0", 17)
        record = q.reads.get(claim.id)
        assert record.attempts[0].prompt_number == 17
        assert record.attempts[0].server == "gpu0"
        again = self.claim(q, "runner-b", "gpu1", now=T0 + 11)  # the lease expired
        assert (again.id, again.last_server, again.last_prompt_number, again.attempt) == (claim.id, "gpu0", 17, 2)
        q.leases.record_prompt(again, "gpu1", 4)
        q.leases.release_owner("runner-b", "runner pid 9 died", now=T0 + 12)
        third = self.claim(q, "runner-c", "gpu0", now=T0 + 13)
        assert (third.id, third.last_server, third.last_prompt_number) == (claim.id, "gpu1", 4)

    def test_complete_and_claim_says_the_next_jobs_start_and_number_as_complete_does(self, q: Queue) -> None:
        """A done that claims the job to queue behind the next one (comfysup.runner.ahead) says in the same write
        what ``complete`` says: the next job executes, and its prompt's number (posted after the done before); the
        claim is made at the done's time. A number whose claim no longer holds changes nothing and is said (False),
        the done and the claim are kept."""
        self.submit(q, make_job(1), make_job(2), make_job(3), make_job(4), make_job(5))
        first = self.claim(q, "runner-a", "gpu0", now=T0)
        nxt = self.claim(q, "runner-a", "gpu0", now=T0)
        prompt = PromptRecord(nxt, "gpu0", 2, "http://gpu0", waiting=True)
        behind, held = q.leases.complete_and_claim(first, [], "runner-a", "gpu0", LEASE, now=T0 + 1, started=nxt,
                                                   prompt=prompt)
        assert held is True and behind is not None and behind.id == make_job(3).id
        assert behind.lease_until == T0 + 1 + LEASE and q.reads.get(behind.id).attempts[0].started_at == T0 + 1
        record = q.reads.get(nxt.id)
        assert (record.last_server, record.last_prompt_number, record.attempts[0].prompt_number) == ("gpu0", 2, 2)
        assert q.reads.states([first.id, nxt.id, behind.id]) == {first.id: "done", nxt.id: "running",
                                                                 behind.id: "running"}
        assert q.reads.get(first.id).finished_at == T0 + 1
        q.leases.release(behind, "taken out of the server's queue", count_attempt=False, now=T0 + 2)
        stale = PromptRecord(behind, "gpu0", 3, "http://gpu0", waiting=True)
        fourth, held = q.leases.complete_and_claim(nxt, [], "runner-a", "gpu0", LEASE, now=T0 + 3, prompt=stale)
        assert held is False and fourth is not None and fourth.id == make_job(3).id  # released: the head again
        assert q.reads.get(nxt.id).state == "done" and q.reads.get(behind.id).attempts[0].prompt_number is None

    def test_a_record_fenced_out_changes_nothing(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        behind = self.claim(q, "runner-a", "gpu0", now=T0)
        with pytest.raises(LeaseLost):
            q.leases.record_prompt(Claim(**{**behind._asdict(), "attempt": 9}), "gpu0", 2)
        assert q.reads.get(behind.id).attempts[0].prompt_number is None
        assert q.reads.get(behind.id).last_prompt_number is None

    def test_complete_records_the_prompt_of_the_job_queued_behind_the_next(self, q: Queue) -> None:
        """A done records, in its own transaction, the prompt of the job posted behind the next one (one write a
        job fewer): its number and server on the job and its attempt, shown posted until its start is said;
        a prompt whose claim no longer holds changes nothing and is said (False), the done is kept."""
        self.submit(q, make_job(1), make_job(2), make_job(3))
        first = self.claim(q, "runner-a", "gpu0", now=T0)
        nxt = self.claim(q, "runner-a", "gpu0", now=T0)
        behind = self.claim(q, "runner-a", "gpu0", now=T0)
        q.leases.record_prompt(nxt, "gpu0", 2, waiting=True)
        prompt = PromptRecord(behind, "gpu0", 3, "http://gpu0", waiting=True)
        assert q.leases.complete(first, [], now=T0 + 1, started=nxt, prompt=prompt) is True
        record = q.reads.get(behind.id)
        assert (record.last_server, record.last_prompt_number, record.attempts[0].prompt_number) == ("gpu0", 3, 3)
        assert q.reads.states([first.id, nxt.id, behind.id]) == {first.id: "done", nxt.id: "running",
                                                                 behind.id: "posted"}
        q.leases.release(behind, "taken out of the server's queue", count_attempt=False, now=T0 + 2)
        assert q.leases.complete(nxt, [], now=T0 + 3, prompt=prompt._replace(number=4)) is False
        assert q.reads.get(nxt.id).state == "done" and q.reads.get(behind.id).state == "queued"
        assert q.reads.get(behind.id).attempts[0].prompt_number == 3

    def test_an_attempt_records_its_server_url_for_a_claim_taken_over(self, q: Queue) -> None:
        """Server names are per machine: a claim taken over from another machine finds the earlier run's server
        by the URL its attempt recorded."""
        self.submit(q, make_job(1))
        claim = self.claim(q, "host-a/1/gpu0/t", "gpu0", now=T0, lease=10)
        assert q.leases.attempt_urls(claim.id) == []  # nothing recorded yet (nor named by the claim)
        q.leases.record_prompt(claim, "gpu0", 17, "http://10.0.0.1:8188")
        again = self.claim(q, "host-b/2/gpu0/t", "gpu0", now=T0 + 11)  # the lease expired
        assert q.leases.attempt_urls(claim.id) == [("http://10.0.0.1:8188", 17)]
        q.leases.record_prompt(again, "gpu0", 3, "http://10.0.0.2:8188")
        assert q.leases.attempt_urls(claim.id) == [("http://10.0.0.2:8188", 3), ("http://10.0.0.1:8188", 17)]
        assert q.leases.attempt_urls(claim.id, other_than=again) == [("http://10.0.0.1:8188", 17)]
        q.leases.record_prompt(again, "gpu0", 4)  # a caller that does not say keeps the URL
        assert q.leases.attempt_urls(claim.id)[0] == ("http://10.0.0.2:8188", 4)

    def test_a_claim_names_its_server_url_before_any_prompt_is_posted(self, q: Queue) -> None:
        """A machine killed between its POST and record_prompt (the job queued behind a running prompt is posted
        the moment that one starts) leaves no prompt recorded: the URL named by its claim still says where the
        prompt may be, and the next claim's own attempt is not counted as an earlier one."""
        self.submit(q, make_job(1))
        first = q.leases.claim("host-a/1/gpu0/t", "gpu0", 10, now=T0, url="http://10.0.0.1:8188")
        assert first is not None
        assert q.leases.attempt_urls(first.id) == [("http://10.0.0.1:8188", None)]
        assert q.leases.attempt_urls(first.id, other_than=first) == []
        # the lease expired
        again = q.leases.claim("host-b/2/gpu0/t", "gpu0", 10, now=T0 + 11, url="http://10.0.0.2:8188")
        assert again is not None and (again.id, again.last_server, again.last_prompt_number) == (first.id, None, None)
        assert q.leases.attempt_urls(again.id, other_than=again) == [("http://10.0.0.1:8188", None)]
        # One that never posted (released uncounted: refused, stopping) does not hide the earlier machine's.
        q.leases.release(again, "refused by this server's catalogue", count_attempt=False, now=T0 + 12)
        third = q.leases.claim("host-b/2/gpu1/t", "gpu1", 10, now=T0 + 13, url="http://10.0.0.3:8188")
        assert third is not None and third.id == first.id
        assert q.leases.attempt_urls(third.id, other_than=third) == [("http://10.0.0.2:8188", None),
                                                               ("http://10.0.0.1:8188", None)]

    def test_a_job_posted_behind_another_is_posted_until_it_executes(self, q: Queue) -> None:
        """A job queued ahead waits in its server's queue behind the one that runs there; status, states,
        its record and its pulse say posted, not running, until its execution starts: said by the end of the job
        ahead of it (the same transaction) or by its own write."""
        self.submit(q, make_job(1), make_job(2), make_job(3))
        ahead = self.claim(q, "runner-a", "gpu0", now=T0)
        behind = self.claim(q, "runner-a", "gpu0", now=T0)
        q.leases.record_prompt(ahead, "gpu0", 1)
        q.leases.record_prompt(behind, "gpu0", 2, waiting=True)
        status = q.reads.status(now=T0 + 1)
        assert (status.counts["running"], status.counts["posted"], status.counts["queued"]) == (1, 1, 1)
        assert {r.id: r.posted for r in status.running} == {ahead.id: False, behind.id: True}
        assert q.reads.states([ahead.id, behind.id]) == {ahead.id: "running", behind.id: "posted"}
        assert q.reads.get(behind.id).shown_state == "posted" and q.reads.get(ahead.id).shown_state == "running"
        assert q.reads.pulses([behind.id])[behind.id].waiting_since is not None
        q.leases.complete(ahead, [], now=T0 + 2, started=behind)  # its execution_start was read before this end
        assert q.reads.states([behind.id]) == {behind.id: "running"}
        assert q.reads.status(now=T0 + 3).counts["posted"] == 0
        third = self.claim(q, "runner-a", "gpu0", now=T0 + 3)
        q.leases.set_waiting(third, True)  # claimed ahead, not posted yet
        assert q.reads.states([third.id]) == {third.id: "posted"}
        q.leases.set_waiting(third, False)
        assert q.reads.states([third.id]) == {third.id: "running"}

    def test_a_posted_job_taken_back_is_not_posted_when_claimed_again(self, q: Queue) -> None:
        """A job released uncounted from its server's queue (a stop, a waiting peer) is queued; its next claim
        starts afresh, and the end of the job that was ahead of it cannot touch it (its claim no longer holds)."""
        self.submit(q, make_job(1), make_job(2))
        ahead = self.claim(q, "runner-a", "gpu0", now=T0)
        behind = self.claim(q, "runner-a", "gpu0", now=T0)
        q.leases.record_prompt(behind, "gpu0", 2, waiting=True)
        q.leases.release(behind, "taken out of the server's queue", count_attempt=False, now=T0 + 1)
        assert q.reads.states([behind.id]) == {behind.id: "queued"}
        q.leases.complete(ahead, [], now=T0 + 2, started=behind)  # a claim that no longer holds: left alone, no error
        again = self.claim(q, "runner-b", "gpu1", now=T0 + 3)
        assert again.id == behind.id and q.reads.states([again.id]) == {again.id: "running"}
        with pytest.raises(LeaseLost):
            q.leases.set_waiting(behind, False)

    def test_queue_position_counts_posted_jobs_then_the_queue_in_claim_order(self, q: Queue) -> None:
        """The API's queue_position. 1 is next: a posted job's place among those posted to its server,
        a queued job's behind every posted job and the queued jobs a claim takes first; None once it runs."""
        self.submit(q, make_job(1), make_job(2), make_job(3), make_job(4), make_job(5, priority=9))
        urgent = self.claim(q, "runner-a", "gpu0", now=T0)  # priority first
        nxt = self.claim(q, "runner-a", "gpu0", now=T0)
        then = self.claim(q, "runner-a", "gpu0", now=T0)
        q.leases.record_prompt(urgent, "gpu0", 1)
        q.leases.record_prompt(nxt, "gpu0", 2, waiting=True)
        q.leases.record_prompt(then, "gpu0", 3, waiting=True)
        assert q.reads.queue_position(urgent.id) is None
        assert (q.reads.queue_position(nxt.id), q.reads.queue_position(then.id)) == (1, 2)
        assert (q.reads.queue_position(make_job(3).id), q.reads.queue_position(make_job(4).id)) == (3, 4)
        q.leases.complete(urgent, [], now=T0 + 1, started=nxt)
        assert [q.reads.queue_position(make_job(i).id) for i in (1, 2, 3, 4, 5)] == [None, 1, 2, 3, None]
        assert q.reads.queue_position("00000000-0000-0000-0000-000000000000") is None
        q.intake.submit([make_job(6, priority=1)], now=T0 + 2)  # ahead of the queued ones of priority 0
        assert [q.reads.queue_position(make_job(i).id) for i in (6, 3, 4)] == [2, 3, 4]

    def test_queue_position_of_a_refused_job_counts_only_jobs_its_servers_could_run(self, q: Queue) -> None:
        """A job that one catalogue refused waits only behind the jobs that a server able to run it could run
        instead: one that only the refusing server could take is not ahead of it."""
        a = q.fleet.record_catalogue("gpu0", "host1", {"A": {}}, now=T0)
        b = q.fleet.record_catalogue("gpu1", "host1", {"B": {}}, now=T0)
        only_a = records.replace(make_job(1), refused=((b, "no B"),))
        anywhere = make_job(2)
        only_b = records.replace(make_job(3), refused=((a, "no A"),))
        self.submit(q, only_a, anywhere, only_b)
        assert q.reads.queue_position(only_b.id) == 2  # behind the job any server runs, not the one only gpu0 can
        assert q.reads.queue_position(only_a.id) == 1

    @pytest.mark.parametrize("how", ["retry_later", "release"])
    def test_a_runner_that_judged_its_prompt_forgets_its_number(self, q: Queue, how: str) -> None:
        """After its own retry or release the prompt was judged: the next attempt must not adopt it."""
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.record_prompt(claim, "gpu0", 17)
        if how == "retry_later":
            q.leases.retry_later(claim, run_after=T0, reason="out of memory", now=T0 + 1)
        else:
            q.leases.release(claim, "interrupted for shutdown", count_attempt=False, now=T0 + 1)
        again = self.claim(q, now=T0 + 2)
        assert again.last_prompt_number is None
        assert q.reads.get(claim.id).attempts[0].prompt_number == 17  # the history keeps it

    def test_complete_records_outputs_and_ends_the_attempt(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        outputs = [Output("a.png", 10, "aa" * 32, "/store/x/a.png"), Output("b.png", 20, "bb" * 32)]
        q.leases.complete(claim, outputs, now=T0 + 5)
        record = q.reads.get(claim.id)
        assert record.state == "done"
        assert [o._replace(id="") for o in record.outputs] == outputs
        assert len({str(uuid.UUID(o.id)) for o in record.outputs}) == 2  # each output an asset with its own UUID
        assert record.finished_at == T0 + 5
        assert record.owner is None and record.lease_until is None
        assert [(a.outcome, a.ended_at) for a in record.attempts] == [("done", T0 + 5)]
        assert q.leases.claim("runner-b", "gpu0", LEASE, now=T0 + 1000) is None  # done is terminal

    def test_an_output_is_found_by_its_asset_id_until_its_job_is_pruned(self, q: Queue) -> None:
        """Outputs are assets: each id names its job and place; gone with the job, none for other ids."""
        self.submit(q, make_job(1), make_job(2))
        q.leases.complete(self.claim(q, now=T0), [Output("a.png", 1, "aa" * 32), Output("b.png", 2, "bb" * 32)],
                   now=T0 + 1)
        q.leases.dead(self.claim(q, now=T0), "broken", now=T0 + 1)
        record = q.reads.get(make_job(1).id)
        assert [q.reads.output_asset(o.id) for o in record.outputs] == [(record, 0), (record, 1)]
        assert q.reads.output_asset(str(uuid.uuid4())) is None and q.reads.output_asset(make_job(1).id) is None
        assert q.intake.prune(T0 + 50).removed
        assert q.reads.output_asset(record.outputs[0].id) is None
        assert self.count(q, "output_assets") == 0

    def test_a_running_jobs_latest_preview_is_kept_until_its_attempt_ends(self, q: Queue) -> None:
        """One row a job, replaced (n counts), read only when n moved, fenced, gone with the attempt."""
        self.submit(q, make_job(1), make_job(2))
        claim, other = self.claim(q, now=T0), self.claim(q, now=T0)
        q.previews.set_preview(claim, "3", "image/jpeg", b"\xff\xd8one")
        q.previews.set_preview(claim, "3", "image/jpeg", b"\xff\xd8two")
        (got,) = q.previews.previews([claim.id, other.id, "nope"], {}).values()
        assert (got.n, got.node_id, got.content_type, got.data) == (2, "3", "image/jpeg", b"\xff\xd8two")
        assert q.previews.previews([claim.id], {claim.id: 2}) == {}  # unchanged: not read again
        stale = claim._replace(owner="runner-z")
        q.previews.set_preview(stale, None, "image/png", b"x")  # a lost claim writes nothing
        assert q.previews.previews([claim.id], {claim.id: 2}) == {}
        q.leases.complete(claim, [], now=T0 + 1)
        q.previews.set_preview(other, None, "image/png", b"\x89PNG")
        q.leases.retry_later(other, T0 + 5, "again", now=T0 + 2)
        assert q.previews.previews([claim.id, other.id], {}) == {}

    def test_dead_keeps_the_reason(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.dead(claim, "gave up after 1 attempts, last: boom", now=T0 + 3)
        record = q.reads.get(claim.id)
        assert (record.state, record.reason, record.finished_at) == ("dead", "gave up after 1 attempts, last: boom",
                                                                     T0 + 3)
        assert [(a.outcome, a.reason) for a in record.attempts] == [("dead", "gave up after 1 attempts, last: boom")]
        assert q.leases.claim("runner-b", "gpu0", LEASE, now=T0 + 1000) is None

    def test_cancelled_by_the_runner(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.cancelled(claim, "cancelled by user", now=T0 + 1)
        record = q.reads.get(claim.id)
        assert (record.state, record.reason) == ("cancelled", "cancelled by user")
        assert record.attempts[0].outcome == "cancelled"

    def test_retry_later_requeues_with_run_after_and_reason(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.retry_later(claim, run_after=T0 + 60, reason="connection refused", now=T0 + 1)
        record = q.reads.get(claim.id)
        assert (record.state, record.run_after, record.reason, record.attempt) == \
            ("queued", T0 + 60, "connection refused", 1)
        assert record.owner is None
        assert record.attempts[0].outcome == "retry"
        assert q.reads.status(now=T0 + 2).counts["waiting"] == 1
        assert q.reads.status(now=T0 + 60).counts["waiting"] == 0

    def test_release_counts_the_attempt(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.release(claim, "runner pid 123 died", now=T0 + 1)
        record = q.reads.get(claim.id)
        assert (record.state, record.attempt, record.owner) == ("queued", 1, None)
        assert record.attempts[0].outcome == "released"
        assert self.claim(q, "runner-b", now=T0 + 1).attempt == 2  # no wait for the lease

    def test_release_without_counting_the_attempt(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.leases.release(claim, "graceful stop", count_attempt=False, now=T0 + 1)
        record = q.reads.get(claim.id)
        assert (record.state, record.attempt) == ("queued", 0)
        assert [(a.outcome, a.ended_at) for a in record.attempts] == [("released_uncounted", T0 + 1)]
        again = self.claim(q, "runner-b", now=T0 + 2)
        assert again.attempt == 1
        assert len(q.reads.get(claim.id).attempts) == 2  # the history still shows both
        q.leases.complete(again, [], now=T0 + 3)
        assert q.reads.get(claim.id).state == "done"

    @pytest.mark.parametrize("count_attempt", [True, False])
    def test_release_owner_frees_every_claim_of_one_owner(self, q: Queue, count_attempt: bool) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3))
        a1 = self.claim(q, "runner-a", "gpu0", now=T0)
        b = self.claim(q, "runner-b", "gpu1", now=T0)
        a2 = self.claim(q, "runner-a", "gpu0", now=T0)
        released = q.leases.release_owner("runner-a", "runner pid 7 died", count_attempt=count_attempt, now=T0 + 1)
        assert sorted(released) == sorted([a1.id, a2.id])
        for claim in (a1, a2):
            record = q.reads.get(claim.id)
            assert (record.state, record.owner) == ("queued", None)
            assert record.attempt == (1 if count_attempt else 0)
            assert record.attempts[0].outcome == ("released" if count_attempt else "released_uncounted")
            assert record.attempts[0].ended_at == T0 + 1
            with pytest.raises(LeaseLost):
                q.leases.heartbeat(claim, LEASE, now=T0 + 2)
        assert q.reads.get(b.id).state == "running"
        assert q.leases.release_owner("runner-a", "again", now=T0 + 2) == []
        assert q.reads.running_owners() == ["runner-b"]

    # -- the people's side ------------------------------------------------------------------------------

    def test_cancel_queued_running_terminal_and_unknown(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3))
        running = self.claim(q, now=T0)
        finished = self.claim(q, now=T0)
        q.leases.complete(finished, [], now=T0 + 1)
        queued_id = make_job(3).id
        unknown = str(uuid.uuid4())
        result = q.intake.cancel([queued_id, running.id, finished.id, unknown], now=T0 + 2)
        assert result == {queued_id: "cancelled", running.id: "cancelling", finished.id: "already done",
                          unknown: "unknown"}
        record = q.reads.get(queued_id)
        assert (record.state, record.finished_at) == ("cancelled", T0 + 2)
        assert q.reads.get(running.id).state == "running"
        assert q.reads.get(running.id).cancel_requested
        assert q.leases.heartbeat(running, LEASE, now=T0 + 3) is True  # the runner learns it on its next heartbeat
        q.leases.cancelled(running, "cancelled by user", now=T0 + 4)
        assert q.reads.get(running.id).state == "cancelled"
        assert q.leases.claim("runner-a", "gpu0", LEASE, now=T0 + 5) is None

    def test_a_cancel_request_survives_a_release(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0)
        q.intake.cancel([claim.id], now=T0 + 1)
        q.leases.release(claim, "runner died", now=T0 + 2)
        assert self.claim(q, now=T0 + 3).cancel_requested

    def test_requeue_one_dead_job_resets_attempts_and_keeps_history(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2))
        claim = self.claim(q, now=T0)
        q.leases.retry_later(claim, run_after=T0, reason="transient", now=T0 + 1)
        claim = self.claim(q, now=T0 + 2)
        q.leases.dead(claim, "gave up", now=T0 + 3)
        other = make_job(2).id
        unknown = str(uuid.uuid4())
        result = q.intake.requeue_dead([claim.id, other, unknown], now=T0 + 4)
        assert result == {claim.id: "requeued", other: "not dead (queued)", unknown: "unknown"}
        record = q.reads.get(claim.id)
        assert (record.state, record.attempt, record.reason, record.finished_at) == ("queued", 0, None, None)
        assert [a.outcome for a in record.attempts] == ["retry", "dead"]
        again = self.claim(q, now=T0 + 5)
        assert (again.id, again.attempt) == (claim.id, 1)

    def test_requeue_all_dead_jobs(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3))
        for _ in range(2):
            q.leases.dead(self.claim(q, now=T0), "broken", now=T0 + 1)
        assert q.reads.status(now=T0 + 1).counts["dead"] == 2
        result = q.intake.requeue_dead(None, now=T0 + 2)
        assert sorted(result) == sorted([make_job(1).id, make_job(2).id])
        assert set(result.values()) == {"requeued"}
        status = q.reads.status(now=T0 + 2)
        assert (status.counts["dead"], status.counts["queued"]) == (0, 3)
        assert q.intake.requeue_dead(None, now=T0 + 3) == {}

    def test_get_unknown_raises_not_found(self, q: Queue) -> None:
        with pytest.raises(NotFound):
            q.reads.get(str(uuid.uuid4()))

    def test_get_many_keeps_the_order_asked_and_skips_unknown(self, q: Queue) -> None:
        self.submit(q, *[make_job(i) for i in range(5)])
        ids = [make_job(3).id, str(uuid.uuid4()), make_job(0).id, make_job(4).id]
        assert [j.id for j in q.reads.get_many(ids)] == [ids[0], ids[2], ids[3]]
        assert q.reads.get_many([]) == []

    def test_ids_starting_with_a_prefix(self, q: Queue) -> None:
        self.submit(q, *[make_job(i) for i in range(40)])
        ids = sorted(make_job(i).id for i in range(40))
        assert q.reads.ids_starting(ids[7][:13]) == [i for i in ids if i.startswith(ids[7][:13])] == [ids[7]]
        assert q.reads.ids_starting(ids[7], limit=1) == [ids[7]]
        first = ids[0][0]
        assert q.reads.ids_starting(first, limit=50) == [i for i in ids if i.startswith(first)]
        # no LIKE wildcard passes
        assert q.reads.ids_starting("%") == q.reads.ids_starting("_") == q.reads.ids_starting("") == []

    def test_iter_jobs_in_submission_order_filtered_by_state(self, q: Queue) -> None:
        jobs = [make_job(i, priority=i % 4) for i in range(1234)]
        q.intake.submit(jobs, now=T0)
        claimed = [self.claim(q, now=T0) for _ in range(3)]
        q.leases.complete(claimed[0], [], now=T0 + 1)
        assert [j.id for j in q.reads.iter_jobs()] == [j.id for j in jobs]
        assert [j.id for j in q.reads.iter_jobs(["running", "done"])] == \
            [j.id for j in jobs if j.id in {c.id for c in claimed}]
        assert [j.id for j in q.reads.iter_jobs(["done"])] == [claimed[0].id]
        assert next(iter(q.reads.iter_jobs(["running"]))).attempts[0].owner == "runner-a"
        assert list(q.reads.iter_jobs(["dead"])) == []

    def test_newest_pages_newest_first_with_a_cursor(self, q: Queue) -> None:
        jobs = [make_job(i) for i in range(7)]
        q.intake.submit(jobs, now=T0)
        seen, before = [], None
        for _ in range(4):
            before, page = q.reads.newest(before, limit=3)
            seen += [j.id for j in page]
            if before is None:
                break
        assert seen == [j.id for j in reversed(jobs)]
        assert q.reads.newest(None, limit=7)[0] is None

    def test_status_counts_every_state_and_waiting(self, q: Queue) -> None:
        self.submit(q, *[make_job(i) for i in range(8)])
        done = self.claim(q, now=T0)
        q.leases.complete(done, [], now=T0 + 1)
        dead1 = self.claim(q, now=T0)
        q.leases.dead(dead1, "first dead", now=T0 + 2)
        dead2 = self.claim(q, now=T0)
        q.leases.dead(dead2, "second dead", now=T0 + 3)
        waiting = self.claim(q, now=T0)
        q.leases.retry_later(waiting, run_after=T0 + 500, reason="later", now=T0 + 1)
        running = self.claim(q, "runner-b", "gpu1", now=T0 + 4, lease=60)
        q.intake.cancel([make_job(7).id], now=T0 + 5)
        status = q.reads.status(now=T0 + 10, dead_limit=5)
        assert status.counts == {"queued": 2, "waiting": 1, "posted": 0, "running": 1, "storing": 0, "done": 1,
                                 "dead": 2, "cancelled": 1}
        assert status.oldest_queued_at == T0
        assert [(r.id, r.owner, r.server, r.attempt, r.started_at, r.lease_until) for r in status.running] == \
            [(running.id, "runner-b", "gpu1", 1, T0 + 4, T0 + 64)]
        assert [(i, t, r) for i, t, r in status.recent_dead] == \
            [(dead2.id, T0 + 3, "second dead"), (dead1.id, T0 + 2, "first dead")]
        assert [i for i, _, _ in q.reads.status(now=T0 + 10, dead_limit=1).recent_dead] == [dead2.id]
        assert q.reads.status(now=T0 + 500).counts["waiting"] == 0

    def test_the_oldest_queued_job_counts_requeued_and_retried_jobs(self, q: Queue) -> None:
        self.submit(q, make_job(1), now=T0)
        self.submit(q, make_job(2), now=T0 + 10)
        self.submit(q, make_job(3), now=T0 + 20)
        first = self.claim(q, now=T0 + 30)
        q.leases.dead(first, "broken", now=T0 + 31)
        assert q.reads.status(now=T0 + 32).oldest_queued_at == T0 + 10
        q.intake.requeue_dead([first.id], now=T0 + 33)
        assert q.reads.status(now=T0 + 34).oldest_queued_at == T0
        again = self.claim(q, now=T0 + 35)
        q.leases.retry_later(again, run_after=T0 + 99, reason="later", now=T0 + 36)
        assert q.reads.status(now=T0 + 37).oldest_queued_at == T0  # waiting to retry is still queued
        for _ in range(3):
            q.leases.complete(self.claim(q, now=T0 + 100), [], now=T0 + 101)
        assert q.reads.status(now=T0 + 102).oldest_queued_at is None

    def test_status_of_an_empty_queue(self, q: Queue) -> None:
        status = q.reads.status(now=T0)
        assert status.counts == {"queued": 0, "waiting": 0, "posted": 0, "running": 0, "storing": 0, "done": 0,
                                 "dead": 0, "cancelled": 0}
        assert status.oldest_queued_at is None
        assert status.running == [] and status.recent_dead == []

    def test_running_owners(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3))
        assert q.reads.running_owners() == []
        self.claim(q, "runner-a", now=T0)
        self.claim(q, "runner-a", now=T0)
        self.claim(q, "runner-b", now=T0)
        assert sorted(q.reads.running_owners()) == ["runner-a", "runner-b"]

    def test_attempt_rows_tell_the_whole_story(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        c1 = self.claim(q, "runner-a", "gpu0", now=T0, lease=10)
        q.leases.record_prompt(c1, "gpu0", 3)
        c2 = self.claim(q, "runner-b", "gpu1", now=T0 + 20, lease=10)  # c1's lease expired
        q.leases.retry_later(c2, run_after=T0 + 21, reason="out of memory", now=T0 + 21)
        c3 = self.claim(q, "runner-a", "gpu0", now=T0 + 22)
        q.leases.release(c3, "graceful stop", count_attempt=False, now=T0 + 23)
        c4 = self.claim(q, "runner-b", "gpu1", now=T0 + 24)
        q.leases.record_prompt(c4, "gpu1", 9)
        q.leases.complete(c4, [Output("a.png", 1, "cd" * 32)], now=T0 + 30)
        rows = [(a.attempt, a.owner, a.server, a.started_at, a.ended_at, a.outcome, a.prompt_number)
                for a in q.reads.get(c1.id).attempts]
        assert rows == [
            (1, "runner-a", "gpu0", T0, T0 + 20, "lease_expired", 3),
            (2, "runner-b", "gpu1", T0 + 20, T0 + 21, "retry", None),
            (3, "runner-a", "gpu0", T0 + 22, T0 + 23, "released_uncounted", None),
            (3, "runner-b", "gpu1", T0 + 24, T0 + 30, "done", 9),
        ]
        assert q.reads.get(c1.id).attempt == 3

    def test_maintenance_is_cheap_to_call_often(self, q: Queue) -> None:
        self.submit(q, *[make_job(i) for i in range(50)])
        for _ in range(100):
            q.maintenance()
        assert q.reads.status(now=T0).counts["queued"] == 50

    # -- where results are, and the machines sharing the queue ---------------------------------------------

    def test_complete_names_the_machine_of_the_owner(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2))
        claim = self.claim(q, "render-07/4242/gpu3/abcd1234", "gpu3", now=T0)
        q.leases.complete(claim, [Output("a.png", 1, "ab" * 32, "/srv/results/x/a.png")], now=T0 + 1)
        record = q.reads.get(claim.id)
        assert record.machine == "render-07"
        assert record.outputs[0].path == "/srv/results/x/a.png"
        other = self.claim(q, "render-08/1/gpu0/ffff0000", "gpu0", now=T0)
        q.leases.dead(other, "broken", now=T0 + 1)
        assert q.reads.get(other.id).machine is None  # only a done job has files somewhere

    def test_a_record_carries_what_a_migration_needs(self, q: Queue) -> None:
        job = make_job(1)
        self.submit(q, job)
        claim = self.claim(q, now=T0)
        q.leases.record_prompt(claim, "gpu0", 17)
        record = q.reads.get(job.id)
        assert (record.spec_hash, record.last_server, record.last_prompt_number) == (job.spec_hash, "gpu0", 17)

    def test_machines_register_heartbeat_and_age(self, q: Queue) -> None:
        assert q.fleet.machines(now=T0) == []
        q.fleet.register_machine("render-07", 100, [{"name": "gpu0", "state": "starting"}], now=T0)
        q.fleet.register_machine("render-08", 200, [], now=T0 + 1)
        q.fleet.machine_heartbeat("render-07", 100, [{"name": "gpu0", "state": "running"}], now=T0 + 5)
        machines = q.fleet.machines(now=T0 + 7)
        assert [(m.host, m.pid, m.started_at, m.heartbeat_at, m.age_seconds) for m in machines] == \
            [("render-07", 100, T0, T0 + 5, 2.0), ("render-08", 200, T0 + 1, T0 + 1, 6.0)]
        assert machines[0].slots == [{"name": "gpu0", "state": "running"}]

    def test_a_restarted_supervisor_replaces_its_hosts_row(self, q: Queue) -> None:
        q.fleet.register_machine("render-07", 100, [], now=T0)
        q.fleet.register_machine("render-08", 200, [], now=T0)
        q.fleet.register_machine("render-07", 101, [{"name": "gpu0"}], now=T0 + 60)
        assert [(m.host, m.pid) for m in q.fleet.machines(now=T0 + 60)] == [("render-07", 101), ("render-08", 200)]

    def test_a_heartbeat_recreates_a_removed_row(self, q: Queue) -> None:
        q.fleet.register_machine("render-07", 100, [], now=T0)
        q.fleet.register_machine("render-07", 101, [], now=T0 + 1)  # another supervisor on the host took over
        q.fleet.machine_heartbeat("render-07", 100, [{"name": "gpu0"}], now=T0 + 2)  # the first one still beats
        assert [(m.pid, m.started_at) for m in q.fleet.machines(now=T0 + 2)] == [(100, T0 + 2), (101, T0 + 1)]

    def test_an_api_advertises_its_url_and_its_heartbeat_ages(self, q: Queue) -> None:
        assert q.endpoints.api_endpoint("render-07", now=T0) is None
        q.endpoints.advertise_api("render-07", "http://10.0.0.7:9189", 100, now=T0)
        q.endpoints.advertise_api("render-08", "https://b.example", 200, now=T0)
        q.endpoints.advertise_api("render-07", "http://10.0.0.7:9189", 100, now=T0 + 10)  # the heartbeat
        endpoint = q.endpoints.api_endpoint("render-07", now=T0 + 14)
        assert endpoint is not None
        assert (endpoint.host, endpoint.url, endpoint.age_seconds) == ("render-07", "http://10.0.0.7:9189", 4.0)
        other = q.endpoints.api_endpoint("render-08", now=T0 + 14)
        assert other is not None and (other.url, other.age_seconds) == ("https://b.example", 14.0)

    def test_a_stopping_api_withdraws_only_its_own_row(self, q: Queue) -> None:
        q.endpoints.advertise_api("render-07", "http://10.0.0.7:9189", 100, now=T0)
        # a new process took the host over
        q.endpoints.advertise_api("render-07", "http://10.0.0.7:9190", 101, now=T0 + 1)
        q.endpoints.withdraw_api("render-07", 100)  # the old one stops: the new one's row stays
        endpoint = q.endpoints.api_endpoint("render-07", now=T0 + 1)
        assert endpoint is not None and endpoint.url == "http://10.0.0.7:9190"
        q.endpoints.withdraw_api("render-07", 101)
        assert q.endpoints.api_endpoint("render-07", now=T0 + 2) is None

    # -- what people see: kinds, traces, progress, metrics' reads ----------------------------------

    def test_every_end_of_an_attempt_keeps_its_kind_and_trace(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3))
        trace = {"phases": [["claimed", T0], ["executing", T0 + 1]], "nodes": {"1": {"seconds": 0.5}}}
        c1 = self.claim(q, now=T0)
        q.leases.retry_later(c1, run_after=T0, reason="oom at node 2", now=T0 + 1, kind="oom", trace=trace)
        c1 = self.claim(q, now=T0 + 2)
        q.leases.complete(c1, [], now=T0 + 3, trace={"phases": [["recorded", T0 + 3]]})
        c2 = self.claim(q, now=T0)
        q.leases.dead(c2, "POST /prompt 400", now=T0 + 1, kind="validation", trace={"phases": []})
        c3 = self.claim(q, now=T0)
        q.leases.release(c3, "graceful stop", count_attempt=False, now=T0 + 1, kind="shutdown")
        c3 = self.claim(q, now=T0 + 2)
        q.leases.cancelled(c3, "cancelled by user", now=T0 + 3)
        one = q.reads.get(c1.id).attempts
        assert [(a.outcome, a.kind, a.trace) for a in one] == \
            [("retry", "oom", trace), ("done", None, {"phases": [["recorded", T0 + 3]]})]
        assert [(a.outcome, a.kind) for a in q.reads.get(c2.id).attempts] == [("dead", "validation")]
        assert [(a.outcome, a.kind, a.trace) for a in q.reads.get(c3.id).attempts] == \
            [("released_uncounted", "shutdown", None), ("cancelled", "cancelled", None)]

    def test_attempts_ended_by_the_queue_itself_have_a_kind(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2))
        self.claim(q, "runner-a", now=T0, lease=10)
        self.claim(q, "runner-b", now=T0, lease=100)
        again = self.claim(q, "runner-c", now=T0 + 11)  # runner-a's lease expired
        q.leases.release_owner("runner-b", "runner process died", now=T0 + 12)
        kinds = {a.owner: a.kind for j in (make_job(1), make_job(2)) for a in q.reads.get(j.id).attempts}
        assert kinds == {"runner-a": "lease_expired", "runner-b": "runner_died", "runner-c": None}
        assert again.attempt == 2

    def test_progress_is_fenced_shown_while_running_and_cleared_by_the_next_claim(self, q: Queue) -> None:
        self.submit(q, make_job(1))
        claim = self.claim(q, now=T0, lease=10)
        progress = {"node": 2, "nodes": 3, "step": 4, "steps": 20}
        q.leases.set_progress(claim, progress)
        assert q.reads.get(claim.id).progress == progress
        assert [r.progress for r in q.reads.status(now=T0).running] == [progress]
        again = self.claim(q, "runner-b", now=T0 + 11)  # the lease expired: a new attempt starts from nothing
        with pytest.raises(LeaseLost):
            q.leases.set_progress(claim, {"node": 3, "nodes": 3})
        assert q.reads.get(claim.id).progress is None
        q.leases.set_progress(again, {"node": 1, "nodes": 3})
        assert q.reads.get(claim.id).progress == {"node": 1, "nodes": 3}

    def test_a_terminal_job_gets_its_delivery_in_the_same_write(self, q: Queue) -> None:
        own = "http://hooks.example/own"
        self.submit(q, make_job(1, callback_url=own), make_job(2), make_job(3), make_job(4, callback_url=own),
                    make_job(5))
        c1 = self.claim(q, now=T0)
        q.leases.retry_later(c1, run_after=T0, reason="later", now=T0 + 1)
        assert q.deliveries.deliveries(c1.id) == []  # not terminal yet
        c1 = self.claim(q, now=T0 + 2)
        q.leases.complete(c1, [], now=T0 + 3)
        c2 = self.claim(q, now=T0 + 2)
        q.leases.dead(c2, "broken", now=T0 + 4)
        assert q.deliveries.deliveries(c2.id) == []  # no url of its own and no default
        q.default_callback_url = "http://hooks.example/all"  # type: ignore[attr-defined]
        c3 = self.claim(q, now=T0 + 2)
        q.leases.dead(c3, "broken", now=T0 + 5)
        q.intake.cancel([make_job(4).id], now=T0 + 6)  # a queued job cancelled by a person is terminal too
        c5 = self.claim(q, now=T0 + 2)
        with pytest.raises(LeaseLost):  # a stale write changes nothing, and so delivers nothing
            q.leases.complete(Claim(**{**c5._asdict(), "attempt": 7}), [], now=T0 + 7)
        assert q.deliveries.deliveries(c5.id) == []
        rows = [(d.job_id, d.url, d.attempts, d.created_at, d.next_at, d.state)
                for j in (1, 3, 4) for d in q.deliveries.deliveries(make_job(j).id)]
        assert rows == [(c1.id, own, 0, T0 + 3, T0 + 3, "pending"),
                        (c3.id, "http://hooks.example/all", 0, T0 + 5, T0 + 5, "pending"),
                        (make_job(4).id, own, 0, T0 + 6, T0 + 6, "pending")]
        assert q.deliveries.pending_deliveries() == 3

    def test_a_terminal_job_gets_its_broker_announcement_in_the_same_write(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3), make_job(4))
        c1 = self.claim(q, now=T0)
        q.leases.complete(c1, [], now=T0 + 1)
        assert q.deliveries.announcements(c1.id) == []  # no [rabbitmq] url: no outbox row
        q.announce = True  # type: ignore[attr-defined]
        c2 = self.claim(q, now=T0)
        q.leases.complete(c2, [], now=T0 + 2)
        c3 = self.claim(q, now=T0)
        q.leases.dead(c3, "broken", now=T0 + 3)
        c4 = self.claim(q, now=T0)
        with pytest.raises(LeaseLost):  # a stale write announces nothing
            q.leases.complete(Claim(**{**c4._asdict(), "attempt": 7}), [], now=T0 + 4)
        assert q.deliveries.announcement_backlog() == 2
        pending = q.deliveries.pending_announcements(10)
        assert [(j, s) for _, j, s in pending] == [(c2.id, "done"), (c3.id, "dead")]
        q.deliveries.mark_announced([pending[0][0]], now=T0 + 5)
        assert [(j, s) for _, j, s in q.deliveries.pending_announcements(10)] == [(c3.id, "dead")]
        assert q.deliveries.announcements(c2.id)[0]["sent_at"] == T0 + 5
        q.deliveries.mark_announced([pending[0][0], pending[1][0]], now=T0 + 6)
        assert q.deliveries.announcement_backlog() == 0
        assert q.deliveries.announcements(c4.id) == []

    def test_deliveries_are_held_while_sent_and_each_try_is_recorded(self, q: Queue) -> None:
        self.submit(q, *[make_job(i, callback_url=f"http://hooks.example/{i}") for i in range(3)])
        for i in range(3):
            q.leases.dead(self.claim(q, now=T0), "broken", now=T0 + i)
        assert q.deliveries.claim_deliveries(10, hold_seconds=30, now=T0 - 1) == []  # none due yet
        first = q.deliveries.claim_deliveries(2, hold_seconds=30, now=T0 + 5)
        assert [d.job_id for d in first] == [make_job(0).id, make_job(1).id]
        assert [d.next_at for d in first] == [T0 + 35, T0 + 35]
        held = q.deliveries.claim_deliveries(10, hold_seconds=30, now=T0 + 6)
        assert [d.job_id for d in held] == [make_job(2).id]  # the two held ones are not handed out again
        q.deliveries.delivery_result(first[0].id, delivered=False, status=500, error="HTTP 500", next_at=T0 + 10,
                                     now=T0 + 7)
        q.deliveries.delivery_result(first[1].id, delivered=True, status=204, error=None, next_at=None, now=T0 + 8)
        q.deliveries.delivery_result(held[0].id, delivered=False, status=None, error="refused", next_at=None,
                                     now=T0 + 9)
        got = {d.job_id: d for i in range(3) for d in q.deliveries.deliveries(make_job(i).id)}
        zero, one, two = (got[make_job(i).id] for i in range(3))
        assert (zero.state, zero.attempts, zero.last_status, zero.last_error, zero.next_at) == \
            ("pending", 1, 500, "HTTP 500", T0 + 10)
        assert (one.state, one.attempts, one.last_status, one.delivered_at, one.next_at) == \
            ("delivered", 1, 204, T0 + 8, None)
        assert (two.state, two.attempts, two.last_error) == ("failed", 1, "refused")  # given up
        assert q.deliveries.pending_deliveries() == 1
        assert [d.id for d in q.deliveries.claim_deliveries(10, hold_seconds=30, now=T0 + 10)] == [zero.id]
        q.intake.requeue_dead([make_job(0).id], now=T0 + 11)  # a delivery outlives a requeue: it is its own record
        assert len(q.deliveries.deliveries(make_job(0).id)) == 1

    def test_ended_since_hands_each_ended_attempt_once_in_order(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), now=T0 - 10)
        c1 = self.claim(q, now=T0)
        c2 = self.claim(q, now=T0)
        q.leases.retry_later(c1, run_after=T0, reason="oom", now=T0 + 1, kind="oom",
                      trace={"nodes": [{"id": "1", "class_type": "x" * 5000}], "cached": ["2", "3"], "phases": {}})
        c1 = self.claim(q, now=T0 + 3)
        q.leases.complete(c1, [], now=T0 + 5)
        assert q.reads.ended_since(T0 + 6) == []
        ended = q.reads.ended_since(T0)
        # The trace's node lists are counted by the database: the trace itself is never handed out.
        assert [(e.job_id, e.attempt, e.outcome, e.kind, e.started_at, e.ended_at, e.nodes_run, e.nodes_cached)
                for e in ended] == [(c1.id, 1, "retry", "oom", T0, T0 + 1, 1, 2),
                                    (c1.id, 2, "done", None, T0 + 3, T0 + 5, 0, 0)]
        assert not any(isinstance(v, (dict, list)) or (isinstance(v, str) and len(v) > 100)
                       for e in ended for v in e)
        assert [(e.workflow_name, e.submitted_at, e.first_started_at) for e in ended] == \
            [("test", T0 - 10, T0), ("test", T0 - 10, T0)]
        assert [e.attempt for e in q.reads.ended_since(T0 + 2)] == [2]
        assert len(q.reads.ended_since(T0, limit=1)) == 1
        assert q.reads.get(c2.id).state == "running"  # an attempt still running has not ended

    def test_ended_since_hands_each_attempts_wait_in_comfyui_and_its_run(self, q: Queue) -> None:
        """The two figures of a trace (comfysup.runner.trace.figures) are read by the database, and the
        attempt that ends a job carries its first attempt's wait: the job's queueing, not its duration."""
        self.submit(q, make_job(1), now=T0 - 10)
        first = self.claim(q, now=T0)
        q.leases.retry_later(first, run_after=T0, reason="oom", now=T0 + 4, kind="oom",
                      trace={"phases": [], "comfyui_wait_s": 2.5, "run_s": 1.5})
        again = self.claim(q, now=T0 + 5)
        q.leases.complete(again, [], now=T0 + 7, trace={"phases": [], "comfyui_wait_s": 0.25, "run_s": 1.75})
        ended = q.reads.ended_since(T0)
        assert [(e.comfyui_wait_s, e.run_s, e.first_comfyui_wait_s) for e in ended] == [(2.5, 1.5, None),
                                                                                       (0.25, 1.75, 2.5)]
        self.submit(q, make_job(2), now=T0 + 8)
        q.leases.dead(self.claim(q, now=T0 + 9), "gave up", now=T0 + 10)  # no trace: its runner died, nothing measured
        assert [(e.comfyui_wait_s, e.run_s, e.first_comfyui_wait_s) for e in q.reads.ended_since(T0 + 10)] == \
            [(None, None, None)]

    def test_ended_count_and_keys_see_the_window_inclusive(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2), make_job(3), now=T0 - 10)
        c1, c2, c3 = (self.claim(q, now=T0 + i) for i in range(3))
        q.leases.retry_later(c1, run_after=T0, reason="oom", now=T0 + 4, kind="oom",
                             trace={"nodes": [1, 2], "cached": []})
        q.leases.complete(c2, [], now=T0 + 5)
        windows = ((T0 + 4, T0 + 5), (T0 + 4.5, T0 + 5), (T0, T0 + 3.9))
        assert [q.reads.ended_count(a, b) for a, b in windows] == [2, 1, 0]
        q.leases.dead(c3, "gave up", now=T0 + 4.5, kind="timeout")  # stamped before the last one, committed after
        assert q.reads.ended_count(T0 + 4, T0 + 5) == 3
        assert q.reads.ended_keys(T0 + 4, T0 + 5) == [(c1.id, 1, T0, T0 + 4), (c3.id, 1, T0 + 2, T0 + 4.5),
                                                (c2.id, 1, T0 + 1, T0 + 5)]
        assert q.reads.ended_keys(T0 + 4.1, T0 + 4.9) == [(c3.id, 1, T0 + 2, T0 + 4.5)]
        assert (q.reads.ended_count(T0 + 6, T0 + 9), q.reads.ended_keys(T0 + 6, T0 + 9)) == (0, [])

    def test_states_finished_counts_and_recent_done(self, q: Queue) -> None:
        self.submit(q, *[make_job(i) for i in range(5)])
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 1)
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 3)
        q.leases.dead(self.claim(q, now=T0), "broken", now=T0 + 2)
        q.intake.cancel([make_job(4).id], now=T0 + 4)
        assert q.reads.states([make_job(i).id for i in range(5)] + ["unknown"]) == {
            make_job(0).id: "done", make_job(1).id: "done", make_job(2).id: "dead", make_job(3).id: "queued",
            make_job(4).id: "cancelled"}
        assert q.reads.finished_counts(T0 + 2) == {"done": 1, "dead": 1, "cancelled": 1}
        assert q.reads.finished_counts(T0) == {"done": 2, "dead": 1, "cancelled": 1}
        assert q.reads.status(now=T0 + 5, done_limit=5).recent_done == [(make_job(1).id, T0 + 3),
                                                                         (make_job(0).id, T0 + 1)]
        assert q.reads.status(now=T0 + 5).recent_done == []

    def test_pulses_read_what_changes_while_jobs_run_in_chunks(self, q: Queue) -> None:
        self.submit(q, *[make_job(i) for i in range(5)])
        running = self.claim(q, now=T0)
        q.leases.set_progress(running, {"node": 2, "nodes": 3, "step": 5, "steps": 20})
        canceling = self.claim(q, now=T0)
        q.intake.cancel([canceling.id], now=T0 + 1)
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 2)
        q.db.ID_CHUNK = 2  # type: ignore[attr-defined]  # three statements for five ids: chunks join up
        pulses = q.reads.pulses([make_job(i).id for i in range(5)] + ["unknown"])
        assert sorted(pulses) == sorted(make_job(i).id for i in range(5))
        assert pulses[running.id] == JobPulse(running.id, "running", 1, False,
                                              {"node": 2, "nodes": 3, "step": 5, "steps": 20})
        assert (pulses[canceling.id].state, pulses[canceling.id].cancel_requested) == ("running", True)
        assert [pulses[make_job(i).id].state for i in (2, 3, 4)] == ["done", "queued", "queued"]
        assert pulses[make_job(3).id] == JobPulse(make_job(3).id, "queued", 0, False, None)
        assert q.reads.pulses([]) == {}

    # -- Workflows stored once, model affinity, complete_and_claim, prune ----------------------

    def test_a_batch_stores_its_workflow_once_and_each_job_gets_its_own(self, q: Queue) -> None:
        jobs = [batch_job(n) for n in range(4)]
        self.submit(q, *jobs)
        assert self.count(q, "workflows") == 1
        for job in jobs:
            record = q.reads.get(job.id)
            assert record.workflow == job.workflow  # what ComfyUI receives is what submit applied
            assert json.dumps(record.workflow, sort_keys=True, separators=(",", ":")) == job.workflow_json
            assert record.params == job.params
        claims = [self.claim(q, owner=f"r{i}") for i in range(4)]
        assert [c.workflow for c in claims] == [j.workflow for j in jobs]
        other = dict(BIG_TEMPLATE, **{"2": {"class_type": "CLIPTextEncode",
                                            "inputs": {"text": "a harbour", "clip": ["1", 0]}}})
        q.intake.submit([batch_job(10, other), batch_job(11, other), make_job(12)], now=T0)
        assert self.count(q, "workflows") == 3
        assert q.reads.get(batch_job(11, other).id).workflow == batch_job(11, other).workflow
        assert q.intake.submit([batch_job(1)], now=T0).existing == 1  # still recognised by its spec_hash

    def test_the_model_key_is_derived_at_submit_and_comes_with_the_claim(self, q: Queue) -> None:
        self.submit(q, model_job(1, "sdxl.safetensors"), make_job(2))
        first, second = self.claim(q, owner="a"), self.claim(q, owner="b")
        assert first.model_key == model_key(model_job(1, "sdxl.safetensors").workflow) is not None
        assert second.model_key is None  # no loader node, no affinity
        assert q.reads.get(first.id).model_key == first.model_key

    def test_a_claim_prefers_the_model_its_server_ran_last(self, q: Queue) -> None:
        self.submit(q, model_job(1, "a"), model_job(2, "b"), model_job(3, "a"), model_job(4, "b"))
        b = model_key(model_job(2, "b").workflow)
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(2, "b").id and got.model_key == b
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0 + 1, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(4, "b").id
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0 + 2, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(1, "a").id  # none of b left: strict order
        unknown = q.leases.claim("r1", "gpu0", LEASE, now=T0 + 3, prefer_model="0" * 16, max_wait_seconds=WAIT)
        assert unknown is not None and unknown.id == model_job(3, "a").id

    def test_priority_always_wins_over_affinity(self, q: Queue) -> None:
        self.submit(q, model_job(1, "b", priority=0), model_job(2, "a", priority=5), model_job(3, "b", priority=5))
        b = model_key(model_job(1, "b").workflow)
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(3, "b").id  # b within the highest priority present
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(2, "a").id  # not the b job of a lower priority

    def test_no_affinity_without_a_wait_bound(self, q: Queue) -> None:
        self.submit(q, model_job(1, "a"), model_job(2, "b"))
        b = model_key(model_job(2, "b").workflow)
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0, prefer_model=b, max_wait_seconds=0)
        assert got is not None and got.id == model_job(1, "a").id

    def test_jobs_passed_over_for_max_wait_are_taken_in_strict_order(self, q: Queue) -> None:
        """Every ready job that a claim passes over starts its clock then, not when it reaches the head: once
        the head is overdue, the jobs passed over with it follow it in strict order, before any affinity."""
        self.submit(q, model_job(1, "a"), model_job(2, "c"), model_job(3, "b"), model_job(4, "b"),
                    model_job(5, "b"), model_job(6, "b"))
        b = model_key(model_job(3, "b").workflow)

        def take(at: float) -> str:
            got = q.leases.claim("r1", "gpu0", LEASE, now=at, prefer_model=b, max_wait_seconds=WAIT)
            assert got is not None
            return got.id

        assert take(T0) == model_job(3, "b").id  # jobs 1 and 2 passed over from T0
        assert take(T0 + WAIT - 1) == model_job(4, "b").id  # still within the bound
        assert take(T0 + WAIT) == model_job(1, "a").id  # the head is overdue
        assert take(T0 + WAIT) == model_job(2, "c").id  # and so is the job behind it, passed over with it
        assert take(T0 + WAIT) == model_job(5, "b").id  # the rest were never passed over

    def test_a_job_submitted_later_starts_its_own_clock(self, q: Queue) -> None:
        self.submit(q, model_job(1, "a"), model_job(2, "b"), model_job(3, "b"))
        b = model_key(model_job(2, "b").workflow)
        first = q.leases.claim("r1", "gpu0", LEASE, now=T0, prefer_model=b, max_wait_seconds=WAIT)
        assert first is not None and first.id == model_job(2, "b").id
        q.leases.complete(first, [], now=T0 + 1)
        q.leases.complete(q.leases.claim("r2", "gpu1", LEASE, now=T0 + 1), [], now=T0 + 2)  # strict: job 1, the head
        q.intake.submit([model_job(4, "c"), model_job(5, "b")], now=T0 + 40)
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0 + 40, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(3, "b").id  # job 3 is the head: no one is overdue
        got = q.leases.claim("r1", "gpu0", LEASE, now=T0 + 41, prefer_model=b, max_wait_seconds=WAIT)
        assert got is not None and got.id == model_job(5, "b").id  # job 4 passed over from now, not from T0

    def test_complete_and_claim_does_both_in_one_write(self, q: Queue) -> None:
        self.submit(q, make_job(1), model_job(2, "a"), model_job(3, "b"))
        first = self.claim(q, owner="host-a/1/gpu0/t")
        b = model_key(model_job(3, "b").workflow)
        out = [Output(name="x.png", size=3, sha256="ab" * 32)]
        nxt, _ = q.leases.complete_and_claim(first, out, "host-a/1/gpu0/t", "gpu0", LEASE, now=T0 + 5,
                                             trace={"t": 1}, prefer_model=b, max_wait_seconds=WAIT)
        assert nxt is not None and (nxt.id, nxt.attempt, nxt.owner, nxt.lease_until) == \
            (model_job(3, "b").id, 1, "host-a/1/gpu0/t", T0 + 5 + LEASE)
        done = q.reads.get(first.id)
        assert (done.state, done.finished_at, done.machine) == ("done", T0 + 5, "host-a")
        assert [o._replace(id="") for o in done.outputs] == out and q.reads.output_asset(done.outputs[0].id)
        assert (done.attempts[0].outcome, done.attempts[0].ended_at, done.attempts[0].trace) == ("done", T0 + 5,
                                                                                                {"t": 1})
        assert q.reads.get(nxt.id).state == "running"
        last, _ = q.leases.complete_and_claim(nxt, [], "host-a/1/gpu0/t", "gpu0", LEASE, now=T0 + 6)
        assert last is not None and last.id == model_job(2, "a").id
        assert q.leases.complete_and_claim(last, [], "host-a/1/gpu0/t", "gpu0", LEASE, now=T0 + 7) == (None, True)
        assert q.reads.get(last.id).state == "done"  # the done is kept when there is nothing more to claim

    def test_complete_and_claim_with_a_lost_lease_claims_nothing(self, q: Queue) -> None:
        self.submit(q, make_job(1), make_job(2))
        old = self.claim(q, owner="runner-a", lease=10)
        taken = self.claim(q, owner="runner-b", now=T0 + 11)  # the lease expired: job 1 again
        assert taken.id == old.id
        with pytest.raises(LeaseLost):
            q.leases.complete_and_claim(old, [], "runner-a", "gpu0", LEASE, now=T0 + 12)
        assert q.reads.get(make_job(2).id).state == "queued"  # nothing was claimed by the stale writer
        assert q.reads.get(old.id).state == "running" and q.reads.get(old.id).owner == "runner-b"

    def test_prune_removes_old_terminal_jobs_and_what_only_they_used(self, q: Queue) -> None:
        other = dict(BIG_TEMPLATE, **{"2": {"class_type": "CLIPTextEncode", "inputs": {"text": "x", "clip": ["1", 0]}}})
        self.submit(q, batch_job(0), batch_job(1), batch_job(2, other), make_job(3), make_job(4), make_job(5),
                    make_job(6))
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 1)  # batch 0
        q.leases.dead(self.claim(q, now=T0), "broken", now=T0 + 2)  # batch 1
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 3)  # job 2, the only one of `other`
        q.intake.cancel([make_job(3).id], now=T0 + 4)
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 100)  # job 4: too recent
        running = self.claim(q, now=T0)  # job 5
        assert self.count(q, "workflows") == 6  # the batch's, `other`, and one for each of jobs 3 to 6
        assert q.intake.prunable(T0 + 50) == 4 and q.intake.prunable(T0 + 3) == 2
        batch = q.intake.prune(T0 + 50, limit=2)
        assert len(batch.removed) == 2
        rest = q.intake.prune(T0 + 50, limit=10)
        assert sorted(i for i, _ in batch.removed + rest.removed) == sorted(
            [batch_job(0).id, batch_job(1).id, batch_job(2, other).id, make_job(3).id])
        # `other`, job 3's, and the batch's once both of its jobs have gone; those of jobs 4 to 6 stay
        assert batch.workflows_removed + rest.workflows_removed == 3
        assert self.count(q, "workflows") == 3
        assert q.intake.prune(T0 + 50).removed == []
        for gone in (batch_job(0).id, make_job(3).id):
            with pytest.raises(NotFound):
                q.reads.get(gone)
        assert q.reads.get(make_job(4).id).state == "done" and q.reads.get(running.id).state == "running"
        assert q.reads.get(make_job(6).id).workflow == make_job(6).workflow
        assert self.count(q, "attempts") == 2  # jobs 4 and 5
        assert dict(rest.removed + batch.removed)[batch_job(0).id] == "runner-a"  # the machine of its files

    def test_prune_keeps_a_job_whose_webhook_is_still_pending(self, q: Queue) -> None:
        self.submit(q, make_job(1, callback_url="http://hooks.example/1"), make_job(2))
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 1)
        q.leases.complete(self.claim(q, now=T0), [], now=T0 + 1)
        assert [i for i, _ in q.intake.prune(T0 + 50).removed] == [make_job(2).id]
        (delivery,) = q.deliveries.deliveries(make_job(1).id)
        q.deliveries.delivery_result(delivery.id, delivered=True, status=204, error=None, next_at=None, now=T0 + 2)
        assert [i for i, _ in q.intake.prune(T0 + 50).removed] == [make_job(1).id]


def check_attempt_history(rows: list[tuple], ids: set[str], completions: list[tuple[str, str]]) -> None:
    """The attempts table after a concurrent drain, as rows of (job_id, attempt, owner, started_at, ended_at,
    outcome) in start order: per job no overlapping attempts, increasing numbers, every attempt before the
    last ended by an expired lease, and one done, recorded for the owner that completed it."""
    by_job: dict[str, list[tuple]] = defaultdict(list)
    for row in rows:
        by_job[row[0]].append(row)
    assert set(by_job) == ids
    completed_by = dict((job_id, owner) for owner, job_id in completions)
    for job_id, attempts in by_job.items():
        assert all(a[4] is not None for a in attempts), f"{job_id}: an attempt was never ended"
        for earlier, later in itertools.pairwise(attempts):
            assert earlier[4] <= later[3], f"{job_id}: attempts {earlier} and {later} overlap"
            assert earlier[1] < later[1], f"{job_id}: attempt numbers not increasing"
            assert earlier[5] == "lease_expired", f"{job_id}: an attempt before the last one ended {earlier[5]}"
        done = [a for a in attempts if a[5] == "done"]
        assert len(done) == 1 and done[0] is attempts[-1]
        assert done[0][2] == completed_by[job_id], f"{job_id}: done recorded for another owner"
