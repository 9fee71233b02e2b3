"""``comfysup run``: the supervisor — one ComfyUI server per GPU, one runner per server, until SIGTERM."""

from __future__ import annotations

import argparse

from comfysup.commands._common import config_from
from comfysup.logs import setup_logging


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run", parents=[common], help="supervise ComfyUI servers and runners (what the service runs)",
        description="Start one ComfyUI server per slot of [comfyui] gpus (and use the [[servers]] as they are), "
                    "one runner per server, and keep them alive: restart what dies with growing delays, mark a "
                    "slot failed after repeated quick failures, recycle servers after N jobs or above a memory "
                    "bound. SIGTERM or Ctrl-C stops gracefully (running jobs get [runner] grace_seconds); a "
                    "second one stops at once. Speaks systemd's notify protocol when NOTIFY_SOCKET is set.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from comfysup.supervisor.supervisor import Supervisor

    setup_logging()
    return Supervisor(config_from(args)).run()
