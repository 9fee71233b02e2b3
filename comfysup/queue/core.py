"""The queue: its roles composed over one database (comfysup.queue.db), written once for both backends.

huey's BaseSqlStorage is the model for the statements: each role knows what its operations mean (which named
statements of comfysup/queue/sql, in which order, in one transaction); the database it holds supplies only the
dialect. Callers hold the role they need (``queue.leases`` for a runner, ``queue.reads`` for status pages,
``queue.intake`` for submit, ...), each typed by its Protocol in comfysup.queue.roles.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from comfysup.queue.assets import Assets
from comfysup.queue.db import SQLDb
from comfysup.queue.deliveries import Deliveries
from comfysup.queue.endpoints import Endpoints
from comfysup.queue.fleet import Fleet
from comfysup.queue.intake import Intake
from comfysup.queue.leases import Leases
from comfysup.queue.orders import Orders
from comfysup.queue.previews import Previews
from comfysup.queue.reads import Reads
from comfysup.queue.search import Search
from comfysup.queue.tenants import TenantBook, TenantLimits
from comfysup.queue.uploads import Uploads


class SQLQueue:
    """The Queue contract (comfysup.queue.base) as roles over one database ``db``; the database's own upkeep
    (``close``, ``maintenance``, ``wait_for_work``, ...) is the queue's."""

    def __init__(self, db: SQLDb, *, assets_dir: Path | None = None) -> None:
        self.db = db
        self.where = db.where
        self.leases = Leases(db)
        self.assets = Assets(db, assets_dir)
        self.intake = Intake(db, self.assets)
        self.reads = Reads(db)
        self.deliveries = Deliveries(db)
        self.fleet = Fleet(db)
        self.endpoints = Endpoints(db)
        self.previews = Previews(db)
        self.uploads = Uploads(db)
        self.search = Search(db)
        self.orders = Orders(db)

    @property
    def announce(self) -> bool:
        """[rabbitmq] url is set: a job's end also writes a broker announcement (the outbox) in its transaction."""
        return self.db.announce

    @announce.setter
    def announce(self, on: bool) -> None:
        self.db.announce = on

    @property
    def default_callback_url(self) -> str:
        """The webhook of a job that names none (``[webhooks] url``)."""
        return self.db.default_callback_url

    @default_callback_url.setter
    def default_callback_url(self, url: str) -> None:
        self.db.default_callback_url = url

    @property
    def tenants(self) -> Mapping[str, TenantLimits]:
        """The declared tenants' weights and limits (the config's [tenants.NAME]; comfysup.queue.tenants)."""
        return self.db.tenants.limits

    @tenants.setter
    def tenants(self, limits: Mapping[str, TenantLimits]) -> None:
        self.db.tenants = TenantBook(limits)

    def maintenance(self) -> None:
        """Periodic upkeep (a WAL checkpoint for SQLite); cheap to call often."""
        self.db.maintenance()

    def checkpoint_in_background(self) -> None:
        """A process whose commits must not wait (a runner): upkeep that a commit would otherwise do in line
        (SQLite's WAL checkpoint) moves to a thread of its own until ``close``. Nothing for PostgreSQL."""
        self.db.checkpoint_in_background()

    def wait_for_work(self, timeout_seconds: float) -> None:
        """Block until a job may be claimable, or ``timeout_seconds`` passed; never raises for a lost link."""
        self.db.wait_for_work(timeout_seconds)

    def replaced(self) -> str | None:
        """None while the database this process has open is still the one its path names (see comfysup.queue.base)."""
        return self.db.replaced()

    def integrity(self, deep: bool = False) -> str | None:
        """None while the database's file looks sound; else what is wrong with it (comfysup.queue.watch)."""
        return self.db.integrity(deep)

    def close(self) -> None:
        self.db.close()
