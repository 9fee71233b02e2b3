"""The API process: bind ``[api] listen``, serve until SIGTERM or SIGINT, then stop accepting and finish.

``comfysup api`` runs it in the foreground (a machine that only takes jobs); ``comfysup run`` starts the same
command as a supervised child, so the API is its own process: a crash or a stuck client never touches the
supervisor's loop, and the supervisor restarts it like a runner. Its port is written nowhere but the log line;
the token never is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable

from aiohttp import web

from comfysup.api import remote
from comfysup.api.app import make_app
from comfysup.api.connections import Gate, OneLineLog
from comfysup.api.events import fit_open_files
from comfysup.api.replies import STATE_KEY
from comfysup.config import Config
from comfysup.errors import ConfigError, QueueUnavailable
from comfysup.queue import open_queue
from comfysup.queue.base import Queue
from comfysup.queue.watch import CHECK_SECONDS, DEEP_CHECK_SECONDS, EXIT_DATABASE_REPLACED, QueueWatch
from comfysup.supervisor.sidecar import BIND_FAILED  # [api] listen cannot be bound: restarting cannot help

log = logging.getLogger("comfysup.api")
QUEUE_RETRY_SECONDS = 1.0
"""How often an API starting while the queue's database does not answer tries it again."""
LOST_LINGER_SECONDS = 2.0
"""How long the API answers 503 (with why) once its queue's file is lost, before it exits: clients and load
balancers see the reason rather than a refused connection."""

def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


async def _open_when_it_answers(config: Config, create: bool, stop: asyncio.Event | None) -> Queue:
    """The queue, waited for (said once, tried every QUEUE_RETRY_SECONDS) while its database does not answer: an
    API that exited instead would be restarted in a loop by its supervisor, and answer nothing meanwhile."""
    said = False
    while True:
        try:
            return open_queue(config, create=create)
        except QueueUnavailable as exc:
            if stop is not None and stop.is_set():
                raise
            if not said:
                log.warning("the queue does not answer (%s); the API starts once it does", exc)
                said = True
        await asyncio.sleep(QUEUE_RETRY_SECONDS)


async def serve(config: Config, on_bound: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None, on_app: Callable[[web.Application], None] | None = None,
                create: bool = True) -> int:
    """Serve until ``stop`` is set (SIGTERM and SIGINT set it when none is given); ``on_app`` is handed the
    application before it serves (the tests read its event watcher). ``create``: make the queue if it does
    not exist (False under ``comfysup run``, which made it: one deleted since is not made again empty)."""
    if not config.api.listen:
        raise ConfigError(f"{config.source}: [api] listen is empty: there is no address to serve the API on")
    queue = await _open_when_it_answers(config, create, stop)
    app = make_app(config, queue)
    if on_app is not None:
        on_app(app)
    fit_open_files(config.api.max_connections)
    # handler_cancellation: a handler whose client has gone is cancelled at once, so an event stream's slot and
    # subscription are released when its client leaves, not at its next keep-alive. keepalive_timeout: aiohttp's
    # own idle timeout, the same as the gate's (comfysup.api.connections).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                           keepalive_timeout=config.api.header_timeout_seconds, logger=OneLineLog())
    await runner.setup()
    assert runner.server is not None
    gate = Gate(runner.server, config.api.max_connections, config.api.header_timeout_seconds)
    host, port = split_listen(config.api.listen)
    site = GatedSite(runner, gate, host, port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot serve the API on %s: %s; set [api] listen to a free address (port 0: any free port)",
                  config.api.listen, exc.strerror or exc)
        await runner.cleanup()
        queue.close()
        return BIND_FAILED
    bound = site.port
    sweeper = asyncio.create_task(gate.sweep(), name="comfysup-api-sweep")
    log.info("Comfy API v2 on http://%s:%d/api/v2 (%s)", host if ":" not in host else f"[{host}]", bound,
             "bearer token required" if config.api.token else "no token: loopback only")
    advertiser = await _advertise(config, app, bound)
    if on_bound is not None:
        on_bound(bound)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    watch = app[STATE_KEY].watch
    watch.deep_every(DEEP_CHECK_SECONDS if create else None)  # under comfysup run, its monitor reads the file
    watcher = asyncio.create_task(_watch(watch, stop))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        sweeper.cancel()
        if advertiser is not None:
            await advertiser.stop()
        await runner.cleanup()
        queue.close()
    return EXIT_DATABASE_REPLACED if watch.lost is not None else 0


async def _watch(watch: QueueWatch, stop: asyncio.Event) -> None:
    """Look at the queue's file every CHECK_SECONDS (requests that write look at once); once it is lost, every
    answer is 503 for LOST_LINGER_SECONDS, then the API stops and exits with EXIT_DATABASE_REPLACED."""
    while watch.lost is None and not stop.is_set():
        await asyncio.to_thread(watch.check)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CHECK_SECONDS)
    if watch.lost is not None:
        await asyncio.sleep(LOST_LINGER_SECONDS)
        stop.set()


class GatedSite(web.BaseSite):
    """aiohttp's TCPSite with the gate's protocol factory in place of its own (comfysup.api.connections)."""

    def __init__(self, runner: web.AppRunner, gate: Gate, host: str, port: int) -> None:
        super().__init__(runner, backlog=512)
        self.gate = gate
        self.host = host
        self.port = port

    @property
    def name(self) -> str:
        return f"http://{self.host if ':' not in self.host else f'[{self.host}]'}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = await asyncio.get_running_loop().create_server(self.gate.factory, self.host, self.port,
                                                                backlog=self._backlog, reuse_address=True)
        self._server = server
        if server.sockets:
            self.port = server.sockets[0].getsockname()[1]


async def _advertise(config: Config, app: web.Application, bound: int) -> remote.Advertiser | None:
    """Tell the other machines sharing the queue where this API is, so they can stream the outputs this
    machine's result store holds (comfysup.api.remote); None when they cannot reach it."""
    url = remote.advertised_url(config.api.public_url, config.api.listen, bound, socket.getfqdn)
    if not url:
        log.info("this API listens on loopback only: other machines sharing the queue cannot stream this "
                 "machine's outputs through it (set [api] public_url, or share [store] dir)")
        return None
    advertiser = remote.Advertiser(app[STATE_KEY], url)
    await advertiser.start()
    log.info("advertised in the queue as machine %s's API: %s/api/v2", advertiser.host, url)
    return advertiser


def main(config: Config, create: bool = True) -> int:
    return asyncio.run(serve(config, create=create))
