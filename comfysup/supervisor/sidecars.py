"""The sidecars ``comfysup run`` keeps beside its servers and runners, each made by one of ``Sidecar``'s two ways
(comfysup.supervisor.sidecar): the monitor (/metrics, the status page, webhook deliveries; forked), the uploader
(the upload outbox, with [store] url; forked) and the Comfy API v2 (``comfysup api``; spawned as its own
command). The RabbitMQ consumer comes from the command, forked the same way. The supervisor starts, watches,
restarts and stops every one of them alike; what differs is here: how each starts, and what happens when its
address cannot be bound.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.sharedctypes
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comfysup.config import Config
from comfysup.observability.monitor import monitor_main as serve_monitor
from comfysup.runner.uploader import uploader_main
from comfysup.supervisor.children import runner_limits
from comfysup.supervisor.sidecar import Sidecar

log = logging.getLogger("comfysup.supervisor")

API_LOG = "api.log"


def api_argv(config: Config) -> list[str]:
    """``comfysup api`` with the supervisor's config file. The API is exec'd, not forked: it is an aiohttp
    process with threads of its own, it sits above the supervisor in the layers (a front door, like the
    commands), and a fresh interpreter shares no lock or socket with the supervisor's forks. COMFYSUP_*
    variables reach it through the environment, as they reached the supervisor."""
    argv = [sys.executable, "-m", "comfysup", "api", "--existing-queue"]  # the supervisor made the queue
    if Path(config.source).is_file():
        argv += ["--config", str(Path(config.source).resolve())]
    return argv


def api_sidecar(config: Config, env: Mapping[str, str], state_dir: Path) -> Sidecar:
    """The Comfy API v2 when [api] listen is set: ``comfysup api`` in its own process group, logging to
    ``<state dir>/api.log``. An address that cannot be bound is said once and not retried; jobs still run."""

    def bind_failed() -> bool:
        log.error("no API: [api] listen = %r cannot be bound (see %s); jobs are still run",
                  config.api.listen, state_dir / API_LOG)
        return False

    return Sidecar.spawned("API", lambda: api_argv(config), env=env, log_path=state_dir / API_LOG,
                           cwd=str(Path(config.root)), limits=runner_limits(config), bind_failed=bind_failed,
                           wanted=bool(config.api.listen),
                           about=f"on {config.api.listen} (log {state_dir / API_LOG})")


def uploader_sidecar(config: Config) -> Sidecar:
    """The upload outbox's sender when [store] url is set (comfysup.runner.uploader): forked, restarted like the
    monitor, stopped last, so the files of jobs that end during the grace are still sent."""
    return Sidecar.forked("uploader", lambda: uploader_main(config), runner_limits(config),
                          wanted=bool(config.store.url))


def monitor_main(config: Config, port_out: Any, serve_endpoint: bool) -> int:
    """In the forked monitor child: /metrics, the status page and webhook deliveries."""
    return serve_monitor(config, port_out, serve_endpoint=serve_endpoint)


class Monitor:
    """The monitor sidecar and what the supervisor reads of it: the port it bound (shared memory, written by
    the child) and whether it still serves an endpoint."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.port: Any = multiprocessing.sharedctypes.RawValue(ctypes.c_int, 0)
        self.endpoint = bool(config.metrics.listen)
        self.sidecar = Sidecar.forked("monitor", self.main, runner_limits(config), bind_failed=self.bind_failed)
        """/metrics, the status page and webhooks; restarted like a runner, up as soon as it is forked."""

    def main(self) -> int:
        """In the forked monitor: /metrics and the status page (unless its address could not be bound), webhooks."""
        self.port.value = 0
        return monitor_main(self.config, self.port, self.endpoint)

    def bind_failed(self) -> bool:
        """[metrics] listen cannot be bound: the monitor starts again at once, without its endpoint."""
        self.port.value = 0
        if not self.endpoint:
            return False
        self.endpoint = False
        log.error("no /metrics and no status page: [metrics] listen = %r cannot be bound (see above); webhooks "
                  "are still delivered", self.config.metrics.listen)
        return True
