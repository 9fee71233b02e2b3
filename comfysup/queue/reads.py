"""The read role: what people and metrics read of the queue's jobs, written once for both backends.

Every read asks for rows that name their columns, and comfysup.queue.records maps them by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from comfysup.errors import NotFound
from comfysup.queue import records
from comfysup.queue.base import POSTED, QUEUED, RUNNING, STATES, Status
from comfysup.queue.db import Role, in_transaction
from comfysup.queue.values import EndedAttempt, JobPulse, JobRecord, TenantCount

PAGE = 500
"""Jobs read per page by ``iter_jobs``: memory stays flat on a large table."""


def fetch(cur: Any, sql: str, args: Mapping[str, Any]) -> list[Any]:
    """The rows of one statement, its parameters by name."""
    return cur.execute(sql, args).fetchall()


class Reads(Role):
    """The reads of the Queue contract (see comfysup.queue.base)."""

    def active_count(self) -> int:
        return self._rows("active_count")[0]["n"]

    def running_owners(self) -> list[str]:
        return [r["owner"] for r in self._rows("running_owners")]

    def _rows(self, name: str, args: Mapping[str, Any] | None = None) -> list[Any]:
        """A read by query name; rows name their columns."""
        return self.db.transaction(fetch, self.db.sql[name], args or {}, write=False)

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` job ids that begin with ``prefix`` (hex digits and hyphens only: no LIKE wildcard)."""
        if not prefix or prefix.strip("0123456789abcdef-"):
            return []
        rows = self.db.transaction(fetch, self.db.sql["ids_starting"], {"prefix": prefix + "%", "limit": limit},
                                   write=False)
        return [r["id"] for r in rows]

    def get(self, job_id: str) -> JobRecord:
        rows = self.get_many([job_id])
        if not rows:
            raise NotFound(f"no job with id {job_id} in {self.db.where}")
        return rows[0]

    def output_asset(self, asset_id: str) -> tuple[JobRecord, int] | None:
        """The done job whose output has this asset id, and the output's place in its list; None when none has."""
        rows = self.db.transaction(fetch, self.db.sql["output_asset_job"], {"asset_id": asset_id}, write=False)
        records = self.get_many([rows[0]["job_id"]]) if rows else []
        if not records or records[0].state != "done":
            return None
        index = next((i for i, o in enumerate(records[0].outputs) if o.id == asset_id), None)
        return None if index is None else (records[0], index)

    def get_many(self, ids: Sequence[str]) -> list[JobRecord]:
        ids = list(ids)
        if not ids:
            return []
        order = {job_id: i for i, job_id in enumerate(ids)}
        return sorted(self.db.transaction(self._records, ids, write=False), key=lambda j: order[j.id])

    def _records(self, cur: Any, ids: list[str]) -> list[JobRecord]:
        rows: list[Any] = []
        chunk = self.db.ID_CHUNK
        for start in range(0, len(ids), chunk):
            in_chunk = {"ids": self.db.id_list(ids[start:start + chunk])}
            rows += cur.execute(self.db.sql["jobs_by_id"], in_chunk).fetchall()
        return self._with_attempts(cur, rows)

    def _with_attempts(self, cur: Any, rows: list[Any]) -> list[JobRecord]:
        """Records of job rows, each with its attempts (read in chunks of ids)."""
        ids = [r["id"] for r in rows]
        attempts: dict[str, list[Any]] = {i: [] for i in ids}
        for start in range(0, len(ids), self.db.ID_CHUNK):
            chunk = self.db.id_list(ids[start:start + self.db.ID_CHUNK])
            for r in cur.execute(self.db.sql["attempts_of"], {"ids": chunk}).fetchall():
                attempts[r["job_id"]].append(records.attempt(r))
        return [records.job_record(r, attempts[r["id"]]) for r in rows]

    def iter_jobs(self, states: Sequence[str] | None = None) -> Iterator[JobRecord]:
        """Every job in submission order, read in pages so memory stays flat on a large table."""
        last = 0
        while True:
            seq, page = self.db.transaction(self._page, last, states, write=False)
            if not page:
                return
            yield from page
            last = seq

    def _page(self, cur: Any, last: int, states: Sequence[str] | None) -> tuple[int, list[JobRecord]]:
        if states:
            in_states = self.db.id_list(list(states))
            rows = cur.execute(self.db.sql["jobs_page_in_states"],
                               {"after": last, "states": in_states, "limit": PAGE}).fetchall()
        else:
            rows = cur.execute(self.db.sql["jobs_page"], {"after": last, "limit": PAGE}).fetchall()
        return (rows[-1]["seq"] if rows else last), self._with_attempts(cur, rows)

    @in_transaction(write=False)
    def newest(self, cur: Any, before: int | None = None, limit: int = 50) -> tuple[int | None, list[JobRecord]]:
        """Up to ``limit`` jobs submitted before the one numbered ``before`` (None: the newest), newest first, and
        the number to pass as ``before`` for the next page (None: this was the last). What the API's list pages
        through: one indexed range read, whatever the queue holds."""
        start = before if before is not None else 2**62
        rows = cur.execute(self.db.sql["jobs_page_newest"], {"before": start, "limit": limit + 1}).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        return (rows[-1]["seq"] if more and rows else None), self._with_attempts(cur, rows)

    @in_transaction(write=False)
    def status(self, cur: Any, now: float | None = None, dead_limit: int = 5, done_limit: int = 0) -> Status:
        sql = self.db.sql
        counts = dict.fromkeys([s.value for s in STATES], 0)
        counts.update({r["state"]: r["n"] for r in cur.execute(sql["state_counts"]).fetchall()})
        waiting = cur.execute(sql["waiting"], {"now": self.db.time(now)}).fetchone()["n"]
        counts["waiting"] = waiting
        counts[QUEUED] -= waiting
        counts[RUNNING] -= counts[POSTED]  # counted among running by the query: shown apart
        oldest = cur.execute(sql["oldest_queued"]).fetchone()
        running = [records.running_job(r) for r in cur.execute(sql["running"]).fetchall()]
        dead = [(r["id"], r["finished_at"], r["reason"])
                for r in cur.execute(sql["recent_dead"], {"limit": dead_limit})]
        done = [(r["id"], r["finished_at"]) for r in cur.execute(sql["recent_done"], {"limit": done_limit})
                ] if done_limit else []
        return Status(counts=counts, oldest_queued_at=oldest["submitted_at"] if oldest else None, running=running,
                      recent_dead=dead, recent_done=done)

    @in_transaction(write=False)
    def queue_position(self, cur: Any, job_id: str) -> int | None:
        """Where a job that waits is in line, 1 first (None: it runs, has ended, or is unknown): a job posted to a
        server waits behind the ones posted there before it; a queued job behind every posted job and the ready
        queued jobs a claim takes first (priority, then submission), of those only the ones a server that can run
        it could run instead when some catalogue refused it. Counted in the index: O(its place), not O(queue)."""
        sql = self.db.sql
        job = cur.execute(sql["place_of"], {"id": job_id}).fetchone()
        if job is None or job["state"] not in (QUEUED, RUNNING):
            return None
        if job["state"] == RUNNING:
            since = job["waiting_since"]
            if since is None:
                return None  # it executes (or is being posted, downloaded): not waiting
            ahead = {"owner": job["owner"], "since": since, "seq": job["seq"]}
            return 1 + cur.execute(sql["posted_ahead"], ahead).fetchone()["n"]
        place = {"now": self.db.time(None), "priority": job["priority"], "seq": job["seq"]}
        posted = cur.execute(sql["posted_count"]).fetchone()["n"]
        queued_ahead = sql["queued_ahead_able"] if job["refused"] else sql["queued_ahead"]
        return 1 + posted + cur.execute(queued_ahead, place).fetchone()["n"]

    def states(self, ids: Sequence[str]) -> dict[str, str]:
        ids = list(ids)
        out: dict[str, str] = {}
        for start in range(0, len(ids), self.db.ID_CHUNK):
            chunk = self.db.id_list(ids[start:start + self.db.ID_CHUNK])
            out.update((r["id"], r["state"]) for r in self._rows("states", {"ids": chunk}))
        return out

    def pulses(self, ids: Sequence[str]) -> dict[str, JobPulse]:
        """id -> what changes while a job runs, in one read of all ``ids`` (chunks of ID_CHUNK); unknown ids are
        left out. What the API's one event watcher reads for every watched job on each of its ticks."""
        ids = list(ids)
        return dict(self.db.transaction(self._pulses, ids, write=False)) if ids else {}

    def _pulses(self, cur: Any, ids: list[str]) -> list[tuple[str, JobPulse]]:
        out: list[tuple[str, JobPulse]] = []
        for start in range(0, len(ids), self.db.ID_CHUNK):
            chunk = self.db.id_list(ids[start:start + self.db.ID_CHUNK])
            out += [(r["id"], records.pulse(r)) for r in cur.execute(self.db.sql["pulses"], {"ids": chunk}).fetchall()]
        return out

    def tenant_counts(self) -> list[TenantCount]:
        """Without a tenant other than default, no trigger counts default's jobs done: its count is every job's."""
        rows = self._rows("tenant_counts", {})
        alone = [r["tenant"] for r in rows] == ["default"]
        done = {r["state"]: r["n"] for r in self._rows("state_counts")}.get("done", 0) if alone else None
        return [TenantCount(tenant=r["tenant"], weight=r["weight"], max_running=r["max_running"], queued=r["queued"],
                            running=r["running"], done=r["done"] if done is None else done,
                            gpu_seconds=r["gpu_seconds"]) for r in rows]

    def finished_counts(self, since: float, now: float | None = None) -> dict[str, int]:
        return {r["state"]: r["n"] for r in self._rows("finished_counts", {"since": since})}

    def ended_since(self, since: float, limit: int = 10000) -> list[EndedAttempt]:
        """The trace stays in the database, which counts its node lists: metrics never hold its JSON."""
        return [records.ended_attempt(r) for r in self._rows("ended_since", {"since": since, "limit": limit})]

    def ended_count(self, since: float, until: float) -> int:
        return self._rows("ended_count", {"since": since, "until": until})[0]["n"]

    def ended_keys(self, since: float, until: float) -> list[tuple[str, int, float, float]]:
        return [(r["job_id"], r["attempt"], r["started_at"], r["ended_at"])
                for r in self._rows("ended_keys", {"since": since, "until": until})]
