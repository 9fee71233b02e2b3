"""``comfysup run``: the supervisor — one ComfyUI server per GPU, one runner per server, until SIGTERM."""

from __future__ import annotations

import argparse
import logging

from comfysup.commands._common import config_from
from comfysup.config import Config, parse_gpus
from comfysup.logs import FORMATS, setup_logging

log = logging.getLogger("comfysup.run")


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
    from comfysup.supervisor.children import runner_limits
    from comfysup.supervisor.sidecar import Sidecar
    from comfysup.supervisor.supervisor import Supervisor

    setup_logging(fmt=args.log_format)
    config = config_from(args)
    pull_models(config)
    sidecars = []
    if config.rabbitmq.url:  # the RabbitMQ front door: a child restarted like the monitor
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
    from comfysup.models.pull import pull

    log.info("models: checking %d file(s) of the manifest", len(config.models))
    report = pull(config, say=log.info, bar=False)
    log.info("%s", report.summary())
