"""The monitor: a child of the supervisor that serves ``/metrics`` and the status page, and sends webhooks.

Why a process of its own rather than threads in the supervisor: the supervisor forks runners for as long
as it lives (a runner that dies is forked again), and a fork copies only the thread that calls it; a lock
held at that moment by another thread (an HTTP handler inside logging, the SQLite queue's lock, a
``requests`` connection pool) would stay locked forever in the new runner. So the supervisor keeps a
single thread, and everything that needs threads lives here, in a process that never forks. It reads
what the supervisor knows from ``supervisor.json`` (rewritten as it changes) and the rest from the queue, so
it needs nothing else from its parent; a monitor that dies is started again and the supervisor's work
never waits for it.

It exits with BIND_FAILED when ``[metrics] listen`` cannot be bound (a port already taken): restarting it
could not help, so the supervisor says why once and carries on without an endpoint (webhooks are then
delivered by a monitor started without one).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from comfysup import stopsignals
from comfysup.config import Config
from comfysup.errors import DatabaseCorrupt
from comfysup.gpus import GpuSampler
from comfysup.observability.brokerview import state_with_broker
from comfysup.observability.metrics import Metrics
from comfysup.observability.web import App, serve
from comfysup.observability.webhooks import Deliverer
from comfysup.queue import open_queue
from comfysup.queue.watch import DEEP_CHECK_SECONDS, EXIT_DATABASE_REPLACED, QueueWatch, lost_line
from comfysup.storage.links import Links, origin

log = logging.getLogger("comfysup.monitor")

BIND_FAILED = 3
"""Exit code: the endpoint's address cannot be bound; do not restart (gunicorn's named boot failure)."""
PASS_SECONDS = 1.0


def monitor_main(config: Config, port_out: Any, serve_endpoint: bool = True) -> int:
    """Serve and deliver until SIGTERM. ``port_out.value`` gets the bound port (0 while there is none)."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    stopsignals.install(on_term, (signal.SIGTERM,))
    stopsignals.install(signal.SIG_IGN, (signal.SIGINT,))  # Ctrl-C reaches the supervisor, which stops us in order
    server = None
    gpus = GpuSampler()
    # A child of run or work, which made the queue before it: one deleted since is not made again empty here.
    web_queue = open_queue(config, create=False)
    deliver_queue = open_queue(config, create=False)
    deliverer = Deliverer(deliver_queue, config.webhooks, links=Links(config.store))
    # Each connection is watched: a corrupt page met by the deliverer's queries is known to its connection only. The
    # deep look is the monitor's (the supervisor, which forks, reads no whole file), once.
    watches = (QueueWatch(web_queue, deep_seconds=DEEP_CHECK_SECONDS), QueueWatch(deliver_queue))
    metrics = Metrics(web_queue, lambda: state_with_broker(config), gpus.sample, lambda: dict(deliverer.counts),
                      max_workflow_labels=config.metrics.max_workflow_labels)
    if serve_endpoint and config.metrics.listen:
        app = App(web_queue, metrics, lambda: state_with_broker(config), config.resolve(config.store.dir),
                  refresh_seconds=config.metrics.refresh_seconds,
                  ready_max_queue_per_slot=config.api.ready_max_queue_per_slot, links=Links(config.store),
                  image_origin=origin(config.store, config.store.url))
        try:
            server = serve(config.metrics.listen, app, max_connections=config.metrics.max_connections,
                           header_seconds=config.metrics.header_timeout_seconds,
                           body_seconds=config.metrics.body_timeout_seconds)
        except OSError as exc:
            log.error("cannot serve /metrics and the status page on %s: %s; set [metrics] listen to a free "
                      "address (port 0 takes any free port), or \"\" for none", config.metrics.listen,
                      exc.strerror or exc)
            return BIND_FAILED
        host, port = server.server_address[:2]
        port_out.value = port
        threading.Thread(target=server.serve_forever, name="comfysup-http", daemon=True).start()
        address = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        log.info("metrics on http://%s/metrics, status page on http://%s/", address, address)
    try:
        corrupt = False  # a query met a corrupt page: the next look is made at once, and says it
        while not stop.is_set():
            why = _lost(watches, force=corrupt)
            if why is not None:  # the supervisor sees the exit status and stops everyone
                log.error("%s; the monitor stops (exit code %d)", lost_line(why), EXIT_DATABASE_REPLACED)
                return EXIT_DATABASE_REPLACED
            try:
                deliverer.run_once()
                metrics.catch_up()  # keeps the look-back window small even when nobody scrapes
                corrupt = False
            except DatabaseCorrupt as exc:  # said once, by the look above, in SQLite's words
                if corrupt:  # no watch saw it: said as any other failure
                    log.warning("monitor: %s", exc)
                corrupt = True
            except Exception as exc:  # a queue that does not answer: try again at the next pass
                log.warning("monitor: %s", exc)
            stop.wait(PASS_SECONDS)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        gpus.close()
        web_queue.close()
        deliver_queue.close()
    return 0


def _lost(watches: tuple[QueueWatch, ...], force: bool) -> str | None:
    """Why the queue's file is lost, from the first of the monitor's connections that knows; None while it is
    sound. ``force``: look now, whenever the last look was."""
    for watch in watches:
        why = watch.check(force=force)
        if why is not None:
            return why
    return None
