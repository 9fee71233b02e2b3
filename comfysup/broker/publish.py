"""``comfysup submit --to rabbitmq jobs.jsonl``: validate the whole file, then publish every line, confirmed.

The lesson's ``enqueue``: the same validation as ``submit`` (every bad line reported as ``file:line:
reason``, nothing published unless all are good), with workflow paths resolved below ``[rabbitmq]
workflows_dir`` as the consumer will resolve them. Each line is published as it is to ``[rabbitmq] queue``,
persistent, ``message_id`` = the job id, and the command returns only after the broker confirmed every one,
so a file it reports published cannot be lost by the broker; publishing it again creates nothing twice
(the consumer recognises the ids).
"""

from __future__ import annotations

from pathlib import Path

from comfysup.broker.connection import BrokerError, connect, declare_all, persistent, where
from comfysup.broker.consumer import BrokerJobs, inputs_of, jobs_reader
from comfysup.config import Config
from comfysup.jobs import Validation
from comfysup.queue.base import Queue

__all__ = ["BrokerError", "file_lines", "publish_lines", "validate", "where"]


def validate(config: Config, queue: Queue | None, path: Path, label: str) -> tuple[BrokerJobs, Validation]:
    reader = jobs_reader(config, queue)
    jobs = BrokerJobs(path, label=label, base_dir=reader.base_dir, catalogues=list(reader.catalogues.values()),
                      allow_private_callbacks=config.webhooks.allow_private, **inputs_of(config))
    return jobs, jobs.validate()


def publish_lines(config: Config, lines: list[tuple[str, bytes]]) -> int:
    """``(job id, line)`` pairs to the jobs queue, each confirmed; returns how many were published."""
    connection = connect(config.rabbitmq.url)
    try:
        declare_all(connection, config.rabbitmq)
        channel = connection.channel()
        channel.confirm_delivery()
        for job_id, line in lines:
            channel.basic_publish("", config.rabbitmq.queue, line, properties=persistent(job_id))
        return len(lines)
    finally:
        connection.close()


def file_lines(path: Path, validation: Validation) -> list[tuple[str, bytes]]:
    """The file's lines with their ids, in order (blank lines skipped), from a clean validation."""
    ids = {line: job_id for job_id, line in validation.lines_by_id.items()}
    out = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number in ids:
                out.append((ids[number], raw.strip()))
    return out
