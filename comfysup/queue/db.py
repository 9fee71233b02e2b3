"""One database under the queue's roles: the connection, its transactions and the dialect's own statements.

Each backend is one ``SQLDb`` (comfysup.queue.sqlite's ``SQLiteDb``, comfysup.queue.postgres's ``PostgresDb``);
every role of the queue (leases, intake, reads, deliveries, fleet, endpoints, assets, previews) holds the same
one and runs its named statements through it:

- ``transaction(fn, *args, write=, durable=, busy_seconds=)``: ``fn(cur, *args)`` in one transaction, begun,
  committed and failed as the backend does (SQLite: BEGIN IMMEDIATE, synchronous=FULL; PostgreSQL: a retried
  stale connection), its rows read by column name. ``in_transaction`` makes a role's method one such
  transaction.
- ``time(now)``: where time comes from when ``now`` is None (SQLite: this machine's clock, read once the write
  lock is held; PostgreSQL: None, so the SQL's ``{now}`` takes the database server's clock).
- ``take``, ``insert_batch``, ``fenced``, ``claim_deliveries``, ``prune``: the statements whose shape differs
  (PostgreSQL's single statements with SKIP LOCKED against SQLite's several), and ``notify`` (PostgreSQL's
  NOTIFY), migrations, maintenance and ``wait_for_work``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from comfysup.errors import QueueError
from comfysup.queue import forks
from comfysup.queue.queries import load, read
from comfysup.queue.tenants import TenantBook

if TYPE_CHECKING:
    from comfysup.queue.run_values import Delivery, PruneBatch
    from comfysup.queue.specs import SpecCache
    from comfysup.queue.values import NewJob

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R", bound="Role")


class SQLDb:
    """A queue database: what every role runs its statements through (see the module docstring)."""

    DIALECT = ""
    SCHEMA = ""
    """The named-SQL file of the schema's steps (``-- name: vN``)."""
    WHOLE_SCHEMA = ""
    """A named-SQL file holding the schema the steps make, in one block named for its version: a new database is
    made from it in one step (a dozen ALTER TABLEs each re-read the whole schema); empty: every new database runs
    the steps."""
    SCHEMA_VERSION = 0
    DURABLE_RENEWALS = False
    """Whether a heartbeat's commit waits for the disk: not SQLite's (only a power cut loses one, and it stops the
    runners too); PostgreSQL's, whose crash loses one while runners live on (see PostgresDb)."""
    ID_CHUNK = 500
    """Ids per statement when reading jobs by id."""
    where = ""
    default_callback_url = ""
    """The webhook of a job that names none (``[webhooks] url``)."""
    announce = False
    """[rabbitmq] url is set: a job's end also writes a broker announcement (the outbox) in its transaction."""

    ADVISORY_LOCKS = False
    """Whether a count that bounds a tenant takes the backend's advisory lock first (PostgreSQL: other machines
    write at once; SQLite's write lock already serialises every write)."""

    def _setup(self) -> None:
        self.sql = load(self.DIALECT)
        self.tenants = TenantBook()
        self._lock = threading.RLock()
        forks.register(self)

    def transaction(self, fn: Callable[..., T], *args: Any, write: bool = True, durable: bool = True,
                    busy_seconds: float | None = None) -> T:
        """``fn(cur, *args)`` in one transaction, committed as a whole (see the module docstring)."""
        raise NotImplementedError

    def time(self, now: float | None) -> float | None:
        """The operation's time: ``now``, else the backend's clock (see the module docstring)."""
        raise NotImplementedError

    def notify(self, cur: Any) -> None:
        """Wake idle runners when this transaction commits; a backend that cannot does nothing."""

    def _drop_for_fork(self) -> None:
        """Just before fork, with this database's lock held."""

    def _abandon(self) -> None:
        """In a forked child: forget the parent's connections without closing them."""

    def id_list(self, ids: Sequence[str]) -> Any:
        """A list of ids (or states) as the parameter of ``= ANY(?)``."""
        return list(ids)

    def schema_steps(self, version: int) -> list[tuple[int, str]]:
        """The schema steps a database at ``version`` still needs, in order; a newer one is refused. A new database
        (version 0) takes the whole schema in one step where ``WHOLE_SCHEMA`` holds this version's."""
        if version > self.SCHEMA_VERSION:
            raise QueueError(f"{self.where}: schema version {version} is newer than this comfysup "
                             f"({self.SCHEMA_VERSION}); upgrade comfysup")
        if version == 0 and self.WHOLE_SCHEMA:
            whole = read(self.WHOLE_SCHEMA).get(f"v{self.SCHEMA_VERSION}")
            if whole is not None:  # another version's: the steps, until it is made again from them
                return [(self.SCHEMA_VERSION, whole)]
        sql = read(self.SCHEMA)
        return [(step, sql[f"v{step}"]) for step in range(version + 1, self.SCHEMA_VERSION + 1)]

    def bulk(self, cur: Any) -> contextlib.AbstractContextManager[Any]:
        """Settings for a large insert (SQLite: a larger page cache)."""
        return contextlib.nullcontext()

    # -- the dialect's statements ----------------------------------------------------------------------------

    def take(self, cur: Any, ask: ClaimAsk, at: float | None, cached: Mapping[int, Any]) -> dict[str, Any] | None:
        """Expire leases and take the next job that ``ask.catalogue`` (the claiming server's) has not refused, its
        attempt row naming ``ask.url``, the server it is taken for (a crash between the POST and ``record_prompt``
        still leaves where the prompt may run). The claim's row by column name (what
        comfysup.queue.leases builds its Claim from), its ``workflow`` text None when ``cached`` holds its workflow id;
        None when no job is ready."""
        raise NotImplementedError

    def insert_batch(self, cur: Any, batch: list[NewJob], at: float | None, conflicts: list[str],
                     specs: SpecCache) -> tuple[int, int]:
        """Insert a submit's chunk: (inserted, already there with the same spec_hash); conflicts are appended."""
        raise NotImplementedError

    def fenced(self, cur: Any, job_sql: str, job_args: Mapping[str, Any], attempt_sql: str | None = None,
               attempt_args: Mapping[str, Any] | None = None) -> Any:
        """Run a fenced job UPDATE (its parameters name the fence) and, only when it held, the attempt row's
        UPDATE; returns the job row's RETURNING row, or None when the fence did not hold."""
        raise NotImplementedError

    def claim_deliveries(self, limit: int, hold_seconds: float, now: float | None = None) -> list[Delivery]:
        """Due deliveries, each held for ``hold_seconds`` (comfysup.queue.deliveries)."""
        raise NotImplementedError

    def prune(self, finished_before: float, limit: int = 500) -> PruneBatch:
        """Up to ``limit`` old terminal jobs removed in one short transaction (comfysup.queue.intake)."""
        raise NotImplementedError

    # -- upkeep ----------------------------------------------------------------------------------------------

    def maintenance(self) -> None:
        """Periodic upkeep (a WAL checkpoint for SQLite); cheap to call often."""

    def checkpoint_in_background(self) -> None:
        """Upkeep that a commit would otherwise do in line moves to a thread of its own (SQLite)."""

    def wait_for_work(self, timeout_seconds: float) -> None:
        """Block until a job may be claimable, or ``timeout_seconds`` passed; never raises for a lost link."""
        raise NotImplementedError

    def replaced(self) -> str | None:
        """None while the database this process has open is still the one its path names."""
        return None

    def integrity(self, deep: bool = False) -> str | None:
        """None while the database's file looks sound; else what is wrong with it."""
        return None

    def close(self) -> None:
        """Close this process's connections (a connection inherited across fork is left alone)."""
        raise NotImplementedError


class ClaimAsk:
    """What one claim asks for: who takes the job, for which server (at ``url``), for how long, and its model
    affinity (``prefer_model``, ``max_wait_seconds``) and node catalogue (see comfysup.queue.base)."""

    __slots__ = ("catalogue", "lease_seconds", "max_wait_seconds", "owner", "prefer_model", "server", "url")

    def __init__(self, owner: str, server: str, lease_seconds: float, prefer_model: str | None,
                 max_wait_seconds: float, catalogue: int | None, url: str | None) -> None:
        self.owner, self.server, self.lease_seconds = owner, server, lease_seconds
        self.prefer_model, self.max_wait_seconds = prefer_model, max_wait_seconds
        self.catalogue, self.url = catalogue, url

    @property
    def affinity(self) -> bool:
        return bool(self.prefer_model) and self.max_wait_seconds > 0


class Role:
    """A part of the queue over its one database (``db``)."""

    def __init__(self, db: SQLDb) -> None:
        self.db = db


Method = Callable[Concatenate[R, Any, P], T]
"""A role's method as written: the cursor of its transaction after ``self``."""


def in_transaction(*, write: bool = True, durable: bool | Callable[..., bool] = True
                   ) -> Callable[[Method[R, P, T]], Callable[Concatenate[R, P], T]]:
    """A role's method as one transaction of its database: the method is written with the cursor after ``self``
    and called without it. ``durable``: whether the commit waits for the disk, or a function of the call's
    arguments (``self`` first) that says."""

    def wrap(fn: Method[R, P, T]) -> Callable[Concatenate[R, P], T]:
        # The transaction is given the method bound (named as it is: what a reader of the calls sees), and the
        # durability a function decides is asked only where it is one.
        if isinstance(durable, bool):
            @functools.wraps(fn)
            def run(self: R, *args: P.args, **kwargs: P.kwargs) -> T:
                method = types.MethodType(fn, self)
                step = functools.partial(method, **kwargs) if kwargs else method
                return self.db.transaction(step, *args, write=write, durable=durable)
        else:
            @functools.wraps(fn)
            def run(self: R, *args: P.args, **kwargs: P.kwargs) -> T:
                method = types.MethodType(fn, self)
                step = functools.partial(method, **kwargs) if kwargs else method
                return self.db.transaction(step, *args, write=write, durable=durable(self, *args, **kwargs))

        return run

    return wrap


def note_passed_over(sql: Mapping[str, str], cur: Any, head: Mapping[str, Any], taken: int, at: float | None) -> None:
    """After an affinity claim, keep the staircase of affinity_skips of the tenant served (``head``: its head's
    ``head`` seq, ``priority`` and ``tenant``): taking a job behind the head passes over every ready job of that
    tenant and priority before it; taking the head drops the rows that cover only jobs before it."""
    where = {"tenant": head["tenant"], "priority": head["priority"]}
    if taken != head["head"]:
        cur.execute(sql["passed_over"], {**where, "taken": taken, "now": at})
    else:
        cur.execute(sql["head_taken"], {**where, "head": head["head"]})
