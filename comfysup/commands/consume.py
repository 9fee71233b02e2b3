"""``comfysup consume``: the RabbitMQ consumer alone (``comfysup run`` starts it as a child when configured)."""

from __future__ import annotations

import argparse

from comfysup.commands._common import config_from
from comfysup.errors import UsageError
from comfysup.logs import FORMATS, setup_logging


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "consume", parents=[common], help="take jobs from RabbitMQ ([rabbitmq] queue) and publish results to it",
        description="Consume [rabbitmq] queue: each message is one jobs.jsonl line, validated as submit validates "
                    "it and inserted idempotently by job id, acknowledged only after the insert committed; an "
                    "invalid one goes to [rabbitmq] invalid_queue with its reason. Also publishes every ended "
                    "job's record to [rabbitmq] done_exchange or dead_exchange (message_id = job id). Reconnects "
                    "with backoff; stops on SIGTERM or Ctrl-C. Use it on a machine without `comfysup run`.")
    p.add_argument("--log-format", choices=FORMATS, help="plain lines (default) or one JSON object per event")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    if not config.rabbitmq.url:
        raise UsageError(f"{config.source}: [rabbitmq] url is empty; set it (or $COMFYSUP_RABBITMQ_URL) to "
                         "amqp://user:password@host:5672/")
    try:
        from comfysup.broker.consumer import consumer_main
    except ImportError as exc:
        raise UsageError(f"the RabbitMQ consumer needs pika: pip install 'comfysup[rabbitmq]' ({exc})") from exc
    setup_logging(fmt=args.log_format)
    return consumer_main(config)
