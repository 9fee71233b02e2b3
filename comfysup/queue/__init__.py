"""The durable queue: its roles over one database (base.Queue), a SQLite backend, PostgreSQL for several machines."""

from __future__ import annotations

from comfysup.config import Config
from comfysup.errors import ConfigError
from comfysup.queue.asset_bucket import AssetBucket
from comfysup.queue.base import Queue
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.queue.tenants import TenantLimits
from comfysup.storage import s3


def open_queue(config: Config, *, create: bool = True, wait_seconds: float | None = None) -> Queue:
    """The backend the config names: ``[queue] url`` (PostgreSQL) or ``[queue] path`` (SQLite). ``wait_seconds``:
    the longest one call waits for the database (a lock, a connect, an answer) before it raises QueueUnavailable,
    when shorter than [queue] busy_timeout_seconds (a runner's, which must not wait out its lease).

    PostgreSQL creates its schema on open whatever ``create`` says: the database itself is made by
    whoever runs the server, and an empty one is a queue with no jobs yet.
    """
    busy = config.queue.busy_timeout_seconds
    if config.queue.url:
        try:  # psycopg is optional: installed with comfysup[postgres]
            from comfysup.queue.postgres import NETWORK_TIMEOUT_SECONDS, PostgresQueue
        except ImportError as exc:
            raise ConfigError(f"{config.source}: [queue] url needs psycopg 3: pip install 'comfysup[postgres]' "
                              f"({exc})") from exc
        queue: Queue = PostgresQueue(
            config.queue.url, busy_timeout_seconds=min(busy, wait_seconds or busy),
            network_timeout_seconds=wait_seconds or NETWORK_TIMEOUT_SECONDS,
            default_callback_url=config.webhooks.url,
            assets_dir=str(config.resolve(config.assets.dir)) if config.assets.dir else None)
        queue.announce = bool(config.rabbitmq.url)
        queue.tenants = tenant_limits(config)
        _asset_bucket(queue, config)
        return queue
    queue = SQLiteQueue(config.resolve(config.queue.path), create=create,
                        busy_timeout_seconds=min(busy, wait_seconds or busy),
                        checkpoint_seconds=config.queue.checkpoint_seconds,
                        default_callback_url=config.webhooks.url,
                        assets_dir=config.resolve(config.assets.dir) if config.assets.dir else None)
    queue.announce = bool(config.rabbitmq.url)  # the broker outbox: results go to the broker too
    queue.tenants = tenant_limits(config)
    _asset_bucket(queue, config)
    return queue


def tenant_limits(config: Config) -> dict[str, TenantLimits]:
    """The config's [tenants.NAME] tables as the queue keeps them."""
    return {t.name: TenantLimits(float(t.weight), t.max_running, t.max_queued) for t in config.tenants}


def _asset_bucket(queue: Queue, config: Config) -> None:
    """[assets] url: input files in a bucket, with [store]'s service and credentials."""
    if config.assets.url:
        queue.assets.asset_bucket = AssetBucket(s3.parse(config.assets.url), config.store)
