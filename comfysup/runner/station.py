"""What a runner keeps from one attempt to the next: its attempt settings, and the :class:`Station`.

A Station holds one server's client (its kept WebSocket included), clients of peer servers (opened when
first needed, for catch-up), the queue, the result store, and the runner's hooks and clocks. Attempts
come and go (comfysup.runner.attempt); the station is made once per runner and closed with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from comfysup.backoff import RetryPolicy
from comfysup.comfy import ComfyClient
from comfysup.config import AssetsConfig, Config, RunnerConfig
from comfysup.queue.base import Queue
from comfysup.runner.inputs import InputDelivery
from comfysup.runner.memory import MemoryHooks
from comfysup.runner.store import ResultStore

if TYPE_CHECKING:
    from comfysup.runner.objectstore import ObjectStore
from comfysup.runner.stuck import StuckChannel

ELSEWHERE_TIMEOUT_SECONDS = 2.0
"""How long catch-up waits for a server of another machine (an earlier attempt's) before it goes on."""
SERVER_LOST_MIN_SECONDS = 10.0
"""A server unreachable this long (or [runner] http_timeout_seconds, if longer) is taken as dead."""


def queue_wait_seconds(config: Config) -> float:
    """The longest one call of a runner waits for its queue's database (a lock another process holds, an answer):
    [queue] busy_timeout_seconds, but never longer than a heartbeat, so that a backup holding SQLite's lock, or a
    PostgreSQL that went away, leaves the attempt its lease to wait in (comfysup.runner.hold)."""
    return min(config.queue.busy_timeout_seconds, config.runner.heartbeat_seconds)


@dataclass(frozen=True)
class AttemptSettings:
    """A runner's settings for its attempts; no defaults here: they are [runner]'s, in comfysup.config."""

    server: str
    url: str
    policy: RetryPolicy
    timeout_seconds: float
    poll_seconds: float
    lease_seconds: float
    heartbeat_seconds: float
    http_timeout_seconds: float
    server_lost_seconds: float
    """A server unreachable this long while it holds our prompt is taken as dead (transient)."""
    leave_queue_seconds: float
    """How long to wait for an interrupted prompt to leave the server's queue."""
    peers: dict[str, str]
    """Other servers by name, where an earlier attempt of a job may have run (for catch-up)."""
    max_files_per_job: int
    max_job_bytes: int
    output_dirs: dict[str, Path]
    """The output folders comfysup can see, by server name (servers ``comfysup run`` launched): each job's
    files go to its own folder there, adopted from disk when the history died with the server
    (comfysup.runner.outputs). A server not named here is used as it always was."""
    queue_wait_seconds: float = RunnerConfig.heartbeat_seconds
    """The longest one call of the runner waits for its queue's database (``queue_wait_seconds``): how close to its
    lease's end an attempt whose queue does not answer may follow its prompt (comfysup.runner.hold)."""
    server_cache_bytes: int = AssetsConfig.server_cache_mb * 2**20
    preview_seconds: float = RunnerConfig.preview_seconds
    """[runner] preview_seconds: how often the latest preview of the running job is written (0: never read)."""
    """[assets] server_cache_mb: input files kept in a launched server's input folder (comfysup.runner.inputs)."""

    @classmethod
    def from_config(cls, config: Config, server: str, url: str, peers: dict[str, str],
                    output_dirs: dict[str, Path] | None = None) -> AttemptSettings:
        r = config.runner
        return cls(
            server=server, url=url,
            policy=RetryPolicy(attempts=r.attempts, base_delay_seconds=r.base_delay_seconds,
                               max_delay_seconds=r.max_delay_seconds, jitter=r.jitter),
            timeout_seconds=r.timeout_seconds, poll_seconds=r.poll_seconds, lease_seconds=r.lease_seconds,
            heartbeat_seconds=r.heartbeat_seconds, http_timeout_seconds=r.http_timeout_seconds,
            server_lost_seconds=max(r.http_timeout_seconds, SERVER_LOST_MIN_SECONDS),
            leave_queue_seconds=r.leave_queue_seconds,
            peers={k: v for k, v in peers.items() if k != server}, output_dirs=dict(output_dirs or {}),
            max_files_per_job=config.store.max_files_per_job, max_job_bytes=config.store.max_job_mb * 2**20,
            server_cache_bytes=config.assets.server_cache_mb * 2**20, preview_seconds=r.preview_seconds,
            queue_wait_seconds=queue_wait_seconds(config))


class Station:
    """What one runner's attempts share, kept from one attempt to the next: one server, one queue, one
    result store, the server's client (its kept WebSocket included), and clients of peer servers."""

    def __init__(self, settings: AttemptSettings, queue: Queue, store: ResultStore | ObjectStore,
                 stop_deadline: Callable[[], float | None] = lambda: None,
                 on_alive: Callable[[], None] = lambda: None,
                 stuck: StuckChannel | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 peer_waiting: Callable[[], bool] = lambda: False, memory: MemoryHooks | None = None) -> None:
        self.settings = settings
        self.queue = queue
        self.store = store
        self.client = ComfyClient(settings.url, timeout_seconds=settings.http_timeout_seconds)
        self.client.previews = settings.preview_seconds > 0
        output_dir = settings.output_dirs.get(settings.server)
        self.inputs = InputDelivery(queue, self.client, settings.server,
                                    output_dir.parent / "input" if output_dir is not None else None,
                                    settings.server_cache_bytes, wall)
        """The server's copy of the jobs' input files (uploaded before each POST)."""
        self._peers: dict[str, ComfyClient] = {}
        self._elsewhere: dict[str, ComfyClient] = {}
        """Clients of servers earlier attempts ran on, on other machines, by URL (comfysup.runner.catchup)."""
        self.stop_deadline = stop_deadline
        """When a graceful stop's grace ends (monotonic), or None: running attempts are released then."""
        self.on_alive = on_alive
        self.peer_waiting = peer_waiting
        """Whether another runner of this machine waits for work (a job queued ahead here goes back to it)."""
        self.stuck = stuck or StuckChannel()
        """Where an attempt reports a prompt stuck in this runner's server (comfysup.runner.stuck)."""
        self.memory = memory or MemoryHooks()
        """Who restarts the server after a lost device, and where memory recoveries are counted (runner.memory)."""
        self.clock = clock
        self.wall = wall
        """Epoch time for the trace (stored); ``clock`` (monotonic) for deadlines and throttles."""

    def close(self) -> None:
        self.client.close()
        for peer in (*self._peers.values(), *self._elsewhere.values()):
            peer.close()

    def client_elsewhere(self, url: str | None) -> ComfyClient | None:
        """A client of the server at ``url``, where an earlier attempt ran, when that server is none of this
        runner's; None otherwise.

        Asking it is safe whatever answers there: a job id is a UUID, so an entry of it on any server is a run
        of this job (and a recorded prompt number must match too). Its calls have a short timeout: a machine
        that died may have taken the server with it, and a refused connection costs nothing."""
        if url is None:
            return None
        url = url.rstrip("/")
        if url in {self.settings.url.rstrip("/"), *(u.rstrip("/") for u in self.settings.peers.values())}:
            return None
        if url not in self._elsewhere:
            self._elsewhere[url] = ComfyClient(url, timeout_seconds=min(self.settings.http_timeout_seconds,
                                                                        ELSEWHERE_TIMEOUT_SECONDS))
        return self._elsewhere[url]

    def output_dir(self, server: str, client: ComfyClient) -> Path | None:
        """The output folder of ``server`` when it is this machine's server of that name (``client`` is its
        client): a run recorded on another machine is named by that machine's name ("gpu0" on both), and its
        files are in that machine's folder, never in this one's. None when comfysup cannot see it."""
        return self.settings.output_dirs.get(server) if client is self.client_for(server) else None

    def client_for(self, server: str | None) -> ComfyClient | None:
        if server is None:
            return None
        if server == self.settings.server:
            return self.client
        if server not in self.settings.peers:
            return None
        if server not in self._peers:
            self._peers[server] = ComfyClient(self.settings.peers[server],
                                              timeout_seconds=self.settings.http_timeout_seconds)
        return self._peers[server]
