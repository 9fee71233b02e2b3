"""The API process: bind ``[api] listen``, serve until SIGTERM or SIGINT, then stop accepting and finish.

``comfysup api`` runs it in the foreground (a machine that only takes jobs); ``comfysup run`` starts the same
command as a supervised child, so the API is its own process: a crash or a stuck client never touches the
supervisor's loop, and the supervisor restarts it like a runner. Its port is written nowhere but the log line;
the token never is.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from comfysup.api.app import make_app
from comfysup.config import Config
from comfysup.errors import ConfigError
from comfysup.queue import open_queue

log = logging.getLogger("comfysup.api")

BIND_FAILED = 3
"""Exit code: ``[api] listen`` cannot be bound; restarting cannot help (the monitor's convention)."""


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


async def serve(config: Config, on_bound: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None) -> int:
    """Serve until ``stop`` is set (SIGTERM and SIGINT set it when none is given)."""
    if not config.api.listen:
        raise ConfigError(f"{config.source}: [api] listen is empty: there is no address to serve the API on")
    queue = open_queue(config, create=True)
    app = make_app(config, queue)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, port = split_listen(config.api.listen)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot serve the API on %s: %s; set [api] listen to a free address (port 0: any free port)",
                  config.api.listen, exc.strerror or exc)
        await runner.cleanup()
        queue.close()
        return BIND_FAILED
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr]
    log.info("Comfy API v2 on http://%s:%d/api/v2 (%s)", host if ":" not in host else f"[{host}]", bound,
             "bearer token required" if config.api.token else "no token: loopback only")
    if on_bound is not None:
        on_bound(bound)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        queue.close()
    return 0


def main(config: Config) -> int:
    return asyncio.run(serve(config))
