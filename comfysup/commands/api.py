"""``comfysup api``: serve the Comfy API v2 alone, for a machine that takes jobs but runs none.

``comfysup run`` serves the same API beside its servers when ``[api] listen`` is set; this command is for the
machine in front (a web service's host) that shares the queue (PostgreSQL) with the GPU machines.
"""

from __future__ import annotations

import argparse

from comfysup.api.serve import main
from comfysup.commands._common import config_from
from comfysup.logs import setup_logging


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "api", parents=[common], help="serve the Comfy API v2 (/api/v2/jobs) in front of the queue",
        description="Serve the Comfy API v2 at [api] listen (default 127.0.0.1:9189) until SIGTERM: code written "
                    "for Comfy Cloud with comfy-sdk submits its workflows into this queue. A non-loopback "
                    "address needs [api] token (GET /api/v2/health and /ready ask none). Browser pages need [api] "
                    "allowed_origins; files of this machine are reachable only below [api] path_roots "
                    "(from-path) and [api] models_dir (model uploads). docs/api.md lists where the API "
                    "differs from Comfy's spec.")
    p.add_argument("--listen", metavar="HOST:PORT", help="overrides [api] listen")
    p.add_argument("--existing-queue", action="store_true",
                   help="fail if the SQLite queue does not exist instead of making it (how comfysup run starts its "
                        "API: a queue deleted under it is not made again empty)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from(args, {"api.listen": args.listen})
    setup_logging()
    return main(config, create=not args.existing_queue)
