"""The search role: the operator's console finds jobs among millions, a page at a time, written once for both
backends.

A search (``JobSearch``) filters by id prefix, state, workflow name, tenant, metadata labels and submission
time, and pages by KEYSET: each page ends with a cursor (the last row's sort key), and the next page starts strictly
after it, so a page costs the same on the first page and the ten-thousandth, and a job submitted meanwhile
never shifts a page. Which index answers:

- an id prefix: the unique index on ``id`` (a range, ordered by id);
- a workflow name: ``jobs_workflow_name`` (workflow_name, seq), newest first;
- a tenant: ``jobs_tenant`` (tenant, seq), newest first;
- one or more labels: ``job_labels`` (key, value, seq) of the first label, newest first, the job rows joined to
  it (the other labels are probes of the same table);
- one state: ``jobs_state`` (state, finished_at, seq): terminal states by when they ended, the others (no
  end time) by submission;
- otherwise the primary key (seq), newest first.

The time range (and every filter but the one whose index answers) is a filter on the rows that index walks:
cheap when matches are common, a longer walk when they are rare (the page stops as soon as it is full).
``count`` counts what a search matches, up to a bound (what a bulk action asks to confirm); ``ids`` lists them.
"""

from __future__ import annotations

import json
from typing import Any

from comfysup.queue.base import STATES
from comfysup.queue.db import Role, in_transaction
from comfysup.queue.queries import ANY, PARAMETER
from comfysup.records import Record, new

TERMINAL = frozenset({"done", "dead", "cancelled"})
LABEL_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
MAX_PAGE = 200
MAX_COUNT = 100_000
"""``count`` stops here: a bulk action over more is refused rather than read whole."""
ROW_COLUMNS = ("jobs.seq AS seq, jobs.id AS id, state, priority, attempt, workflow_name, submitted_at, started_at, "
               "finished_at, reason, cancel_requested, waiting_since, server, machine, jobs.tenant AS tenant, "
               "{meta} AS meta")
META = {"sqlite": "job_specs.meta", "postgres": "jobs.meta"}
FROM = {"sqlite": "jobs JOIN job_specs ON job_specs.seq = jobs.seq", "postgres": "jobs"}
LABELLED = {"sqlite": "job_labels AS l0 CROSS JOIN jobs CROSS JOIN job_specs", "postgres": "job_labels AS l0 JOIN jobs"
            " ON jobs.seq = l0.seq"}
"""A labelled search's rows: the first label's index drives (SQLite's CROSS JOIN keeps it the outer loop)."""
LABELLED_JOIN = {"sqlite": "jobs.seq = l0.seq AND job_specs.seq = l0.seq", "postgres": ""}
LABEL = "EXISTS (SELECT 1 FROM job_labels AS l WHERE l.key = :{k} AND l.value = :{v} AND l.seq = l0.seq)"


class SearchError(ValueError):
    """A search that cannot be asked: what is wrong with it, for the person who typed it."""


class JobSearch(Record):
    """What to find. Every filter narrows (AND); empty ones do not filter."""

    id_prefix: str = ""
    """Lower-case hex digits and hyphens: the ids that begin with it."""
    state: str = ""
    """One stored state (queued, running, done, dead, cancelled)."""
    workflow: str = ""
    """The workflow name, exactly."""
    tenant: str = ""
    """The tenant the jobs belong to, exactly (comfysup.queue.tenants)."""
    labels: tuple[tuple[str, str], ...] = ()
    """(key, value) pairs the job's metadata must hold, as strings."""
    since: float | None = None
    """Submitted at or after (epoch seconds)."""
    until: float | None = None
    """Submitted before."""
    oldest_first: bool = False
    after: tuple[Any, ...] | None = None
    """The cursor a previous page ended with (``JobPage.cursor``)."""
    limit: int = 50

    def check(self) -> None:
        """Raise SearchError for a search no index can answer as asked."""
        if self.id_prefix and self.id_prefix.strip("0123456789abcdef-"):
            raise SearchError(f"id prefix {self.id_prefix!r}: only hex digits and hyphens make a job id")
        if self.state and self.state not in {s.value for s in STATES}:
            raise SearchError(f"state {self.state!r} is none of {', '.join(s.value for s in STATES)}")
        for key, _ in self.labels:
            if not key or set(key) - LABEL_KEY_CHARS:
                raise SearchError(f"label {key!r}: a label's name is letters, digits, '_', '-' and '.'")
        if not 1 <= self.limit <= MAX_PAGE:
            raise SearchError(f"limit {self.limit}: between 1 and {MAX_PAGE}")


class JobRow(Record):
    """A job as a list shows it: no workflow, no parameters (see ``Reads.get`` for the whole)."""

    id: str
    state: str
    """As people see it: ``posted`` for a running job that waits in its server's queue."""
    priority: int
    attempt: int
    workflow_name: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    reason: str | None
    cancel_requested: bool
    server: str | None
    machine: str | None
    labels: dict[str, str] = new(dict)
    tenant: str = "default"
    """Whose job it is (comfysup.queue.tenants)."""


class JobPage(Record):
    rows: list[JobRow]
    cursor: tuple[Any, ...] | None
    """Pass as ``JobSearch.after`` for the next page; None: this was the last."""


def _key(search: JobSearch) -> str:
    """Which ordering (and so which index) answers the search."""
    if search.id_prefix:
        return "id"
    if search.workflow or search.tenant or search.labels:
        return "seq"
    if search.state:
        return "ended" if search.state in TERMINAL else "seq"
    return "seq"


ORDER = {"id": "jobs.id {d}", "seq": "{seq} {d}", "ended": "jobs.finished_at {d}, jobs.seq {d}"}


def _seq(search: JobSearch) -> str:
    """The column a search's seq order reads: the label index's own, so its walk needs no sort."""
    return "l0.seq" if search.labels else "jobs.seq"


def _from(dialect: str, search: JobSearch) -> str:
    return LABELLED[dialect] if search.labels else FROM[dialect]


def _after(key: str, older: bool, cursor: tuple[Any, ...], seq: str) -> tuple[str, dict[str, Any]]:
    """The keyset predicate: rows strictly past ``cursor`` in the search's order."""
    op = "<" if older else ">"
    if key == "id":
        return f"jobs.id {op} :after_id", {"after_id": str(cursor[0])}
    if key == "ended":
        return (f"(jobs.finished_at, jobs.seq) {op} (:after_f, :after_s)",
                {"after_f": float(cursor[0]), "after_s": int(cursor[1])})
    return f"{seq} {op} :after_s", {"after_s": int(cursor[0])}


def _label_filters(dialect: str, labels: tuple[tuple[str, str], ...], where: list[str], args: dict[str, Any]) -> None:
    """The first label is the driving index's range (``l0``); each other one a probe of the same index."""
    where.extend(w for w in ("l0.key = :lk0 AND l0.value = :lv0", LABELLED_JOIN[dialect]) if w)
    for n, (key, value) in enumerate(labels):
        if n:
            where.append(LABEL.format(k=f"lk{n}", v=f"lv{n}"))
        args.update({f"lk{n}": key, f"lv{n}": value})


def _filters(dialect: str, search: JobSearch) -> tuple[list[str], dict[str, Any]]:
    where: list[str] = []
    args: dict[str, Any] = {}
    if search.id_prefix:
        where.append("jobs.id >= :lo AND jobs.id < :hi")
        args.update(lo=search.id_prefix, hi=search.id_prefix + "~")
    if search.state:
        where.append("jobs.state = :state")
        args["state"] = search.state
        if search.state not in TERMINAL and not (search.workflow or search.tenant or search.labels or search.id_prefix):
            where.append("jobs.finished_at IS NULL")  # the index's order within the state is then seq's
    if search.workflow:
        where.append("jobs.workflow_name = :workflow")
        args["workflow"] = search.workflow
    if search.tenant:
        where.append("jobs.tenant = :tenant")
        args["tenant"] = search.tenant
    if search.labels:
        _label_filters(dialect, search.labels, where, args)
    if search.since is not None:
        where.append("jobs.submitted_at >= :since")
        args["since"] = float(search.since)
    if search.until is not None:
        where.append("jobs.submitted_at < :until")
        args["until"] = float(search.until)
    return where, args


def spell(dialect: str, sql: str) -> str:
    """``:name`` parameters as the dialect writes them (comfysup.queue.queries does the same for named SQL)."""
    if dialect == "postgres":
        return PARAMETER.sub(r"%(\1)s", sql)
    return ANY.sub(r" IN (SELECT value FROM json_each(\1))", sql)


def _cursor(key: str, row: Any) -> tuple[Any, ...]:
    if key == "id":
        return (row["id"],)
    if key == "ended":
        return (row["finished_at"], row["seq"])
    return (row["seq"],)


def _row(r: Any) -> JobRow:
    state = "posted" if r["state"] == "running" and r["waiting_since"] is not None else r["state"]
    try:
        meta = json.loads(r["meta"] or "{}")
    except ValueError:
        meta = {}
    labels = {k: v for k, v in meta.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(meta, dict) else {}
    return JobRow(id=r["id"], state=state, priority=r["priority"], attempt=r["attempt"],
                  workflow_name=r["workflow_name"], submitted_at=r["submitted_at"], started_at=r["started_at"],
                  finished_at=r["finished_at"], reason=r["reason"], cancel_requested=bool(r["cancel_requested"]),
                  server=r["server"], machine=r["machine"], labels=labels, tenant=r["tenant"])


class Search(Role):
    """The console's searches (see the module docstring)."""

    @in_transaction(write=False)
    def search(self, cur: Any, search: JobSearch) -> JobPage:
        """One page of the jobs ``search`` matches, in its order, and the cursor of the next."""
        search.check()
        dialect = self.db.DIALECT
        key = _key(search)
        where, args = _filters(dialect, search)
        older = not search.oldest_first
        if search.after:
            clause, more = _after(key, older, search.after, _seq(search))
            where.append(clause)
            args.update(more)
        args["limit"] = search.limit + 1
        sql = (f"SELECT {ROW_COLUMNS.format(meta=META[dialect])} FROM {_from(dialect, search)}"
               f"{' WHERE ' + ' AND '.join(where) if where else ''}"
               f" ORDER BY {ORDER[key].format(d='DESC' if older else 'ASC', seq=_seq(search))} LIMIT :limit")
        rows = cur.execute(spell(dialect, sql), args).fetchall()
        page = rows[:search.limit]
        cursor = _cursor(key, page[-1]) if len(rows) > search.limit and page else None
        return JobPage([_row(r) for r in page], cursor)

    @in_transaction(write=False)
    def count(self, cur: Any, search: JobSearch, bound: int = MAX_COUNT) -> int:
        """How many jobs ``search`` matches, counted up to ``bound`` (``bound`` + 1 means more)."""
        search.check()
        dialect = self.db.DIALECT
        where, args = _filters(dialect, search)
        args["bound"] = bound + 1
        sql = (f"SELECT count(*) AS n FROM (SELECT 1 FROM {_from(dialect, search)}"
               f"{' WHERE ' + ' AND '.join(where) if where else ''} LIMIT :bound) AS matched")
        return int(cur.execute(spell(dialect, sql), args).fetchone()["n"])

    @in_transaction(write=False)
    def ids(self, cur: Any, search: JobSearch, bound: int = MAX_COUNT) -> list[str]:
        """The ids of up to ``bound`` jobs ``search`` matches, oldest first."""
        search.check()
        dialect = self.db.DIALECT
        where, args = _filters(dialect, search)
        args["bound"] = bound
        sql = (f"SELECT jobs.id AS id FROM {_from(dialect, search)}{' WHERE ' + ' AND '.join(where) if where else ''}"
               f" ORDER BY {_seq(search)} LIMIT :bound")
        return [r["id"] for r in cur.execute(spell(dialect, sql), args).fetchall()]
