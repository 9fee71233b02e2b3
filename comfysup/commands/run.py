"""``comfysup run``: the supervisor — one ComfyUI server per GPU, one runner per server, until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import threading

from comfysup.commands._common import config_from
from comfysup.config import Config, parse_gpus
from comfysup.logs import FORMATS, setup_logging
from comfysup.supervisor.children import runner_limits
from comfysup.supervisor.notify import send
from comfysup.supervisor.sidecar import Sidecar
from comfysup.supervisor.sidecars import uploader_sidecar
from comfysup.supervisor.supervisor import Supervisor

log = logging.getLogger("comfysup.run")
EXTEND_SECONDS = 90
"""While models are pulled, systemd is asked every third of this to wait this much longer for READY."""


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run", parents=[common], help="supervise ComfyUI servers and runners (what the service runs)",
        description="Start one ComfyUI server per slot of [comfyui] gpus (and use the [[servers]] as they are), "
                    "one runner per server, and keep them alive: restart what dies with growing delays, mark a "
                    "slot failed after repeated quick failures, recycle servers after N jobs or above a memory "
                    "bound. SIGTERM or Ctrl-C stops gracefully (running jobs get [runner] grace_seconds); a "
                    "second one stops at once. Speaks systemd's notify protocol when NOTIFY_SOCKET is set. "
                    "Serves /metrics and a status page at [metrics] listen, and sends [webhooks]. With [rabbitmq] url, "
                    "a consumer child takes jobs from the broker and publishes results to it. With a model "
                    "manifest ([[models]]), first pulls the files the cache lacks (as `comfysup models pull`).")
    p.add_argument("--log-format", choices=FORMATS, help="plain lines (default) or one JSON object per event "
                   "with job, slot and attempt ($COMFYSUP_LOG_FORMAT)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    setup_logging(fmt=args.log_format)
    config = config_from(args)
    pull_models(config)
    sidecars = [uploader_sidecar(config)]  # the upload outbox ([store] url; not started without one)
    if config.rabbitmq.url:  # the RabbitMQ front door: a child restarted like the monitor
        # pika is an optional dependency (comfysup[rabbitmq]): imported only where [rabbitmq] url is set.
        from comfysup.broker.consumer import consumer_main

        sidecars.append(Sidecar.forked("consumer", lambda: consumer_main(config, create=False),
                                       runner_limits(config)))
    return Supervisor(config, sidecars=sidecars).run()


def pull_models(config: Config) -> None:
    """Before any server starts: every file of the model manifest in the cache, verified, and linked where the
    servers look (what ``comfysup models pull`` does), with how long it took. A file that cannot be pulled stops
    the start: a server without it would fail every job that names it. No manifest, or no server launched
    (``gpus = "none"``): nothing to do."""
    if not config.models or parse_gpus(config.comfyui.gpus, config.source).mode == "none":
        return
    # models.pull brings urllib3 (the downloads): only a supervisor with a manifest loads it, so the runners it
    # forks otherwise hold no HTTP library (as comfysup.commands.work's).
    from comfysup.models.pull import pull

    log.info("models: checking %d file(s) of the manifest", len(config.models))
    done = threading.Event()
    keeper = threading.Thread(target=_keep_systemd_waiting, args=(done,), name="models-pull-notify", daemon=True)
    keeper.start()
    try:
        report = pull(config, say=log.info, bar=False)
    finally:
        done.set()
        keeper.join()
    log.info("%s", report.summary())


def _keep_systemd_waiting(done: threading.Event) -> None:
    """A pull of gigabytes takes longer than the unit's TimeoutStartSec (made for servers that start): under
    systemd, ask it to wait longer (EXTEND_TIMEOUT_USEC), keep its watchdog fed and say why in STATUS until the pull
    ends. Outside systemd each send does nothing."""
    while True:
        send(f"EXTEND_TIMEOUT_USEC={EXTEND_SECONDS * 1_000_000}\nWATCHDOG=1\n"
             "STATUS=pulling model files (comfysup models list shows each)")
        if done.wait(EXTEND_SECONDS / 3):
            return
