"""The durable queue: one interface (base.Queue), a SQLite backend, PostgreSQL for several machines."""

from __future__ import annotations

from comfysup.config import Config
from comfysup.errors import ConfigError
from comfysup.queue.base import Queue


def open_queue(config: Config, *, create: bool = True) -> Queue:
    """The backend the config names: ``[queue] url`` (PostgreSQL) or ``[queue] path`` (SQLite)."""
    if config.queue.url:
        raise ConfigError(f"{config.source}: [queue] url: the PostgreSQL backend is not available in this "
                          "version; use [queue] path (SQLite)")
    from comfysup.queue.sqlite import SQLiteQueue

    return SQLiteQueue(config.resolve(config.queue.path), create=create,
                       busy_timeout_seconds=config.queue.busy_timeout_seconds,
                       checkpoint_seconds=config.queue.checkpoint_seconds)
