"""The console's search, mixed into ``QueueContract`` so that both backends run it: every filter, keyset pages
that never repeat or skip a job, and the counts a bulk action confirms."""

from __future__ import annotations

import pytest

from comfysup import records
from comfysup.queue.base import Queue
from comfysup.queue.search import JobPage, JobSearch, SearchError

T0 = 1_700_000_000.0
LEASE = 30.0


class SearchContract:
    @staticmethod
    def _fill(q: Queue) -> list[str]:
        """Twelve jobs a second apart: odd ones of workflow ``odd`` labelled team=b, three of them dead."""
        from tests.queue_contract import make_job

        jobs = [records.replace(make_job(n, meta={"team": "b" if n % 2 else "a", "n": n}),
                                    workflow_name="odd" if n % 2 else "even") for n in range(12)]
        for n, job in enumerate(jobs):
            assert q.intake.submit([job], now=T0 + n).inserted == 1
        for n in range(3):
            claim = q.leases.claim("runner-a", "gpu0", LEASE, now=T0 + 100 + n)
            assert claim is not None
            q.leases.dead(claim, f"failed {n}", now=T0 + 200 + n)
        return [j.id for j in jobs]

    @staticmethod
    def _all(q: Queue, search: JobSearch) -> list[str]:
        out: list[str] = []
        cursor = None
        while True:
            page = q.search.search(records.replace(search, after=cursor, limit=2))
            out += [r.id for r in page.rows]
            cursor = page.cursor
            if cursor is None:
                return out

    def test_search_filters_and_keyset_pages(self, q: Queue) -> None:
        ids = self._fill(q)
        assert self._all(q, JobSearch()) == ids[::-1]
        assert self._all(q, JobSearch(oldest_first=True)) == ids
        assert self._all(q, JobSearch(workflow="odd")) == ids[1::2][::-1]
        assert self._all(q, JobSearch(labels=(("team", "a"),))) == ids[0::2][::-1]
        assert self._all(q, JobSearch(state="dead")) == ids[2::-1]  # by end, newest first
        assert self._all(q, JobSearch(state="queued")) == ids[:2:-1]
        assert self._all(q, JobSearch(since=T0 + 3, until=T0 + 6)) == ids[5:2:-1]
        assert self._all(q, JobSearch(state="dead", workflow="odd")) == [ids[1]]
        assert [r.id for r in q.search.search(JobSearch(id_prefix=ids[4][:8])).rows] == [ids[4]]
        row = q.search.search(JobSearch(state="dead", limit=1)).rows[0]
        assert (row.state, row.reason, row.labels, row.workflow_name) == ("dead", "failed 2", {"team": "a"}, "even")

    def test_a_row_names_its_jobs_tenant(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        q.intake.submit([records.replace(make_job(1), tenant="acme"), make_job(2)], now=T0)
        assert {r.id: r.tenant for r in q.search.search(JobSearch()).rows} == {make_job(1).id: "acme",
                                                                                make_job(2).id: "default"}

    def test_a_tenants_search_pages_through_its_jobs_only(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        jobs = [records.replace(make_job(n), tenant="acme" if n % 3 else "default") for n in range(10)]
        for n, job in enumerate(jobs):
            q.intake.submit([job], now=T0 + n)
        acme = [j.id for j in jobs if j.tenant == "acme"]
        assert self._all(q, JobSearch(tenant="acme")) == acme[::-1]  # pages of 2, none repeated or skipped
        assert self._all(q, JobSearch(tenant="acme", oldest_first=True)) == acme
        assert self._all(q, JobSearch(tenant="default")) == [j.id for j in jobs if j.tenant == "default"][::-1]
        assert self._all(q, JobSearch(tenant="acme", state="queued", since=T0 + 4)) == acme[:1:-1]
        assert self._all(q, JobSearch(tenant="nobody")) == []
        assert q.search.count(JobSearch(tenant="acme")) == len(acme)
        assert q.search.ids(JobSearch(tenant="acme")) == acme

    def test_a_rare_label_pages_through_its_jobs_and_an_absent_one_finds_none(self, q: Queue) -> None:
        from tests.queue_contract import make_job

        rare = {1, 4, 5, 9, 12}
        jobs = [make_job(n, meta={"team": "a", "run": "r7" if n in rare else "r1", "n": n, "flag": n == 4})
                for n in range(14)]
        for n, job in enumerate(jobs):
            q.intake.submit([job], now=T0 + n)
        found = [jobs[n].id for n in sorted(rare)]
        assert self._all(q, JobSearch(labels=(("run", "r7"),))) == found[::-1]  # pages of 2, none repeated or skipped
        assert self._all(q, JobSearch(labels=(("run", "r7"),), oldest_first=True)) == found
        assert self._all(q, JobSearch(labels=(("team", "a"), ("run", "r7")), since=T0 + 5)) == found[:1:-1]
        assert self._all(q, JobSearch(labels=(("run", "r7"),), workflow=jobs[0].workflow_name)) == found[::-1]
        for absent in (("run", "r9"), ("nobody", "r7"), ("n", "4"), ("flag", "true")):  # non-strings are no labels
            assert q.search.search(JobSearch(labels=(absent,))) == JobPage([], None)
        assert self._all(q, JobSearch(labels=(("run", "r7"), ("team", "b")))) == []
        assert q.search.count(JobSearch(labels=(("run", "r7"),))) == len(rare)
        assert q.search.ids(JobSearch(labels=(("run", "r7"),), state="queued")) == found

    def test_count_and_ids_of_a_search(self, q: Queue) -> None:
        ids = self._fill(q)
        assert q.search.count(JobSearch(state="dead")) == 3
        assert q.search.count(JobSearch(), bound=5) == 6
        assert q.search.ids(JobSearch(state="dead", labels=(("team", "a"),))) == [ids[0], ids[2]]

    def test_a_search_that_cannot_be_asked_says_why(self, q: Queue) -> None:
        for bad in (JobSearch(id_prefix="xyz"), JobSearch(state="sleeping"), JobSearch(labels=(("a'b", "1"),))):
            with pytest.raises(SearchError):
                q.search.search(bad)

    def test_a_slot_held_put_back_and_a_restart_asked_once(self, q: Queue) -> None:
        q.orders.hold_slot("h1", "gpu0", "ann@1.2.3.4", now=T0)
        q.orders.ask_restart("h1", "gpu1", "bo", now=T0 + 1)
        q.orders.ask_restart("h2", "gpu0", "bo", now=T0 + 2)
        mine = {o.slot: o for o in q.orders.slot_orders("h1")}
        assert mine["gpu0"].held_by == "ann@1.2.3.4" and mine["gpu0"].restart_at is None
        assert mine["gpu1"].held_by is None and (mine["gpu1"].restart_at, mine["gpu1"].restart_by) == (T0 + 1, "bo")
        q.orders.restart_done("h1", "gpu1", T0 + 0.5)  # an older ask: the pending one stays
        assert len(q.orders.slot_orders("h1")) == 2
        q.orders.restart_done("h1", "gpu1", T0 + 1)
        q.orders.hold_slot("h1", "gpu0", None, now=T0 + 3)
        assert q.orders.slot_orders("h1") == []
        assert [o.host for o in q.orders.slot_orders()] == ["h2"]
