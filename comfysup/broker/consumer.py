"""The consumer: one message is one jobs.jsonl line, acknowledged only after its insert committed.

Each batch of messages (up to ``[rabbitmq] prefetch``) is validated exactly as ``comfysup submit``
validates a file (comfysup.jobs, with the node catalogues the servers have now) and inserted in one
transaction, idempotently by job id (``Queue.submit``). Only then is it acknowledged, with one
``basic_ack(multiple=True)``: a crash between the commit and the ack makes the broker redeliver, and the
redelivery is recognised as already submitted (same id, same content: nothing inserted). A message that
fails validation (or reuses a queued id with other content) is published to ``[rabbitmq] invalid_queue``
with its reason in the ``x-comfysup-reason`` header and in the body, confirmed, and then acknowledged: never
dropped silently, never redelivered forever.

A message the broker delivers again (its ``x-delivery-count``) may be the one that stopped or crashed the
consumer last time: each such message is handled alone, after the batch of new ones, the one that was in
hand when the last consumer died (``handling`` in the state file) last of all, so it takes no other message
with it. The queue's delivery limit (comfysup.broker.connection) moves it to the invalid queue in the end.

A stop (SIGTERM, SIGINT) is seen by the loop within ``POLL_SECONDS``; one that comes while the consumer is
stuck (a file that never answers, a broker that never confirms) interrupts it after ``STOP_GRACE_SECONDS``:
what it held unacknowledged goes back to the queue when the process ends.

The same process publishes the broker outbox (comfysup.broker.outbox) on a second, confirming channel, and
writes its state for ``status``, the status page and the metrics (comfysup.slotstate ``broker.json``). A
lost connection (broker restart, closed by an operator, network) is reopened after a full-jitter backoff;
the unacknowledged messages of the lost connection go back to the queue by themselves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import FrameType
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from comfysup import stopsignals
from comfysup.broker.connection import BrokerError, Reconnect, connect, declare_all, persistent, where
from comfysup.broker.insert import insert, with_tenant
from comfysup.broker.outbox import Announcer
from comfysup.config import Config
from comfysup.errors import QueueError
from comfysup.jobs import JobLineError, JobsFile, NewJob
from comfysup.jobs.catalogue import Catalogue
from comfysup.queue import open_queue
from comfysup.queue.base import Queue
from comfysup.queue.watch import DEEP_CHECK_SECONDS, EXIT_DATABASE_REPLACED, QueueWatch, lost_line
from comfysup.redact import bound
from comfysup.slotstate import read_broker_state, write_broker_state
from comfysup.storage.links import Links

log = logging.getLogger("comfysup.broker.consumer")

POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 0.5
"""A stop that the loop has not honoured after this long interrupts whatever it waits for (Stopped)."""
STATE_SECONDS = 1.0
REFRESH_SECONDS = 30.0
"""The node catalogues and workflow files are read again this often (a server may have new nodes)."""
KEEPALIVE_SECONDS = 2.0
"""How often a download of a message's input lets the connection answer the broker's heartbeats."""
REASON_HEADER = "x-comfysup-reason"
MAX_REASON_CHARS = 1000


class BrokerJobs(JobsFile):
    """A jobs file whose lines come from messages: a workflow path must stay below ``workflows_dir``."""

    def _template(self, value: str) -> Any:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or "\\" in value:
            raise JobLineError(f"workflow {bound(value, 200)!r}: a message names a file below [rabbitmq] "
                               "workflows_dir, with no .. and no absolute path (or gives the workflow inline)")
        return super()._template(value)


def jobs_reader(config: Config, queue: Queue | None) -> BrokerJobs:
    """What validates one message, with the node catalogues the servers have now."""
    base = config.resolve(config.rabbitmq.workflows_dir)
    found = [Catalogue(r.id, r.info, tuple(r.servers)) for r in queue.fleet.catalogues()] if queue is not None else []
    return BrokerJobs(base / "<rabbitmq>", label=config.rabbitmq.queue, base_dir=base, catalogues=found,
                      allow_private_callbacks=config.webhooks.allow_private, **inputs_of(config))


def inputs_of(config: Config) -> dict[str, Any]:
    """Where a message's {"file": ...} inputs may come from: [rabbitmq] inputs_dir, or nowhere when it is unset;
    its {"url": ...} and {"s3": ...} inputs as [inputs] says, s3 only from [inputs] s3_buckets (none when empty:
    a publisher would read with this machine's credentials)."""
    remote = {"remote": config.inputs, "s3_buckets": config.inputs.s3_buckets,
              "max_input_bytes": config.assets.max_file_mb * 2**20,
              "max_job_input_bytes": config.assets.max_job_mb * 2**20}
    inputs_dir = config.rabbitmq.inputs_dir
    if not inputs_dir:
        return {"input_roots": (), "inputs_where": "[rabbitmq] inputs_dir, which is not set: a message names no "
                                                   "file of this machine", **remote}
    return {"input_roots": (config.resolve(inputs_dir),), "inputs_where": "[rabbitmq] inputs_dir", **remote}


class KeepAlive:
    """The Progress of a message's input downloads (comfysup.jobs.fetch): the connection's heartbeats go on
    while one lasts (BlockingConnection answers them only in process_data_events), so a long download does not
    lose the connection and have its batch redelivered. A message that arrives meanwhile waits in ``held``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.connection: pika.BlockingConnection | None = None
        self.clock = clock
        self._at = float("-inf")

    def start(self, name: str, total: int | None) -> None:
        self.advance(0)

    def advance(self, size: int) -> None:
        now = self.clock()
        if self.connection is not None and now - self._at >= KEEPALIVE_SECONDS:
            self._at = now
            self.connection.process_data_events(time_limit=0)

    def end(self) -> None:
        self.advance(0)


class Stopped(BaseException):
    """Raised by the stop's timer into a consumer stuck past the grace: a BaseException, so that no
    ``except Exception`` on the way swallows it."""


@dataclass(frozen=True)
class Message:
    tag: int
    body: bytes
    message_id: str | None
    deliveries: int = 0
    """Deliveries before this one that were not acknowledged (the quorum queue's x-delivery-count)."""
    tenant: Any = None
    """The message's ``tenant`` header: the tenant of its job when its line names none."""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.body).hexdigest()[:32]

    def name(self) -> str:
        return f"message {self.message_id}" if self.message_id else f"message sha256:{self.digest[:12]}"


class Consumer:
    """Runs until ``stop`` is set; ``after_commit`` is the chaos suite's seam between commit and ack."""

    def __init__(self, config: Config, queue: Queue, *, after_commit: Callable[[], None] | None = None) -> None:
        self.config = config
        self.settings = config.rabbitmq
        self.queue = queue
        self.after_commit = after_commit
        self.stop = threading.Event()
        self.reconnect = Reconnect(self.settings.reconnect_max_delay_seconds)
        self.announcer = Announcer(queue, self.settings, links=Links(config.store))
        self.counts: Counter[str] = Counter()
        self.state = "starting"
        self.last_error: str | None = None
        self.held: list[Message] = []
        self.unacked = 0
        self.ready: int | None = None
        self.connected_at: float | None = None
        self._reader: BrokerJobs | None = None
        self.keepalive = KeepAlive()
        self._reader_at = 0.0
        self._state_at = 0.0
        self.forced = False
        self.done = False
        self.warnings: list[str] = []
        self.handling: str | None = None
        previous = read_broker_state(config) or {}
        self.suspect: str | None = previous.get("handling") if previous.get("queue") == self.settings.queue else None
        """The digest of the message the last consumer had in hand, alone, when it ended: handled last."""
        self.watch = QueueWatch(queue, on_lost=lambda why: log.error(
            "%s; the consumer stops, its unacknowledged messages go back to the broker (exit code %d)",
            lost_line(why), EXIT_DATABASE_REPLACED))
        """The queue's file (comfysup.queue.watch): lost, no message is inserted or acknowledged any more."""

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self) -> int:
        log.info("rabbitmq: consuming %r at %s", self.settings.queue, where(self.settings.url))
        try:
            while not self.stop.is_set():
                try:
                    self._session()
                except (BrokerError, OSError) as exc:
                    self._wait("reconnecting", f"the broker connection was lost: {type(exc).__name__} {exc}"[:300])
                except QueueError as exc:
                    self._wait("queue unavailable", f"the queue does not answer: {exc}"[:300])
        except Stopped:
            log.warning("rabbitmq: stopped while %s; what it held unacknowledged goes back to the queue",
                        f"handling {self.handling}" if self.handling else "waiting (broker, queue or a file)")
        self.done = True
        self.state = "stopped"
        self.write_state(force=True)
        return EXIT_DATABASE_REPLACED if self.watch.lost is not None else 0

    def force_stop(self) -> None:
        """The stop's timer ran out: leave whatever the consumer waits for (in the main thread only)."""
        if not self.done:
            self.forced = True
            raise Stopped()

    def _wait(self, state: str, error: str) -> None:
        self.state, self.last_error, self.unacked = state, error, 0
        self.held.clear()  # the broker requeues what the closed connection had not acknowledged
        delay = self.reconnect.failed()
        log.warning("rabbitmq: %s; trying again in %.1f s", error, delay)
        self.write_state(force=True)
        self.stop.wait(delay)

    def _session(self) -> None:
        self.state = "connecting"
        self.write_state(force=True)
        connection = connect(self.settings.url)
        self.keepalive.connection = connection
        try:
            warnings = declare_all(connection, self.settings)
            for warning in warnings:
                if warning not in self.warnings:
                    log.warning("rabbitmq: %s", warning)
            self.warnings = warnings
            channel = connection.channel()
            channel.confirm_delivery()  # an invalid message is acked only after the broker confirmed its copy
            channel.basic_qos(prefetch_count=self.settings.prefetch)
            outbox = connection.channel()
            outbox.confirm_delivery()
            probe = connection.channel()
            channel.basic_consume(self.settings.queue, self._on_message, auto_ack=False)
            self.reconnect.worked()
            self.state, self.last_error, self.connected_at = "consuming", None, time.time()
            self.write_state(force=True, probe=probe)
            log.info("rabbitmq: connected; consuming %r (prefetch %d)", self.settings.queue, self.settings.prefetch)
            while not self.stop.is_set():
                connection.process_data_events(time_limit=POLL_SECONDS)
                while self.held and len(self.held) < self.settings.prefetch:  # fill the batch from what arrived
                    before = len(self.held)
                    connection.process_data_events(time_limit=0)
                    if len(self.held) == before:
                        break
                self.unacked = len(self.held)
                self.write_state(probe=probe)
                if self.watch.check(force=bool(self.held)) is not None:
                    self.stop.set()  # what it holds stays unacknowledged: the broker hands it out again later
                    break
                if self.held:
                    self._handle(channel)
                self.announcer.flush(outbox)
        finally:
            self.held.clear()
            self.unacked = 0
            self.keepalive.connection = None
            if not self.forced:  # a forced stop does not wait for the broker's answer: the exit closes the socket
                try:
                    connection.close()
                except Exception:  # already closed by the broker or the network
                    pass

    def _on_message(self, channel: BlockingChannel, method: Any, properties: pika.BasicProperties,
                    body: bytes) -> None:
        count = (properties.headers or {}).get("x-delivery-count")
        deliveries = count if isinstance(count, int) and count > 0 else int(bool(method.redelivered))
        self.held.append(Message(method.delivery_tag, body, properties.message_id, deliveries,
                                 (properties.headers or {}).get("tenant")))
        self.counts["received"] += 1

    # -- one batch -----------------------------------------------------------------------------------------

    def reader(self) -> BrokerJobs:
        now = time.monotonic()
        if self._reader is None or now - self._reader_at > REFRESH_SECONDS:
            self._reader, self._reader_at = jobs_reader(self.config, self.queue), now
            self._reader.inputs.progress = self.keepalive
            self._reader.inputs.stored = self.queue.assets.asset_size
        return self._reader

    def _handle(self, channel: BlockingChannel) -> None:
        batch, self.held = self.held, []
        again = [m for m in batch if m.deliveries]
        if not again:
            self._commit(channel, batch, multiple=True)
            return
        fresh = [m for m in batch if not m.deliveries]
        if fresh:
            self._commit(channel, fresh, multiple=False)
        for message in sorted(again, key=lambda m: (m.digest == self.suspect, m.deliveries)):
            log.warning("rabbitmq: %s comes again (%d deliveries without an ack before); handled alone, and after "
                        "%d more the broker moves it to %r", message.name(), message.deliveries,
                        max(0, self.settings.delivery_limit - message.deliveries), self.settings.invalid_queue)
            self.handling = message.digest
            self.write_state(force=True)  # a consumer that dies with it in hand tells the next one
            self._commit(channel, [message], multiple=False)
        self.handling = self.suspect = None
        self.write_state(force=True)

    def _commit(self, channel: BlockingChannel, batch: list[Message], *, multiple: bool) -> None:
        """Validate and insert ``batch``, then acknowledge it: with one ack when it is all that is held."""
        try:
            valid, invalid = self.judge(batch)
            invalid += insert(self.queue, valid, self.counts)
        finally:
            if self._reader is not None:
                self._reader.close()  # the batch's inputs fetched by URL: in the asset store now, or refused
        if self.after_commit is not None:
            self.after_commit()
        for message, reason in invalid:
            self._refuse(channel, message, reason)
        if multiple:
            channel.basic_ack(delivery_tag=max(m.tag for m in batch), multiple=True)
        else:
            for message in batch:
                channel.basic_ack(delivery_tag=message.tag)
        self.counts["acked"] += len(batch)
        self.unacked = max(0, self.unacked - len(batch))

    def judge(self, batch: list[Message]) -> tuple[dict[str, tuple[NewJob, Message]], list[tuple[Message, str]]]:
        """Each message validated as a jobs.jsonl line; a repeated id with the same content counts once."""
        reader = self.reader()
        valid: dict[str, tuple[NewJob, Message]] = {}
        invalid: list[tuple[Message, str]] = []
        for message in batch:
            if not message.body.strip():
                invalid.append((message, "the message is empty; expected one jobs.jsonl line (a JSON object)"))
                continue
            try:
                job, _warnings = reader.parse(message.body, check=True)
                job = with_tenant(job, message.tenant)
            except JobLineError as exc:
                invalid.append((message, str(exc)))
                continue
            first = valid.get(job.id)
            if first is None:
                valid[job.id] = (job, message)
            elif first[0].spec_hash != job.spec_hash:
                invalid.append((message, f"id {job.id} appears twice in a batch with different content"))
            else:
                self.counts["duplicates"] += 1
        return valid, invalid

    def _refuse(self, channel: BlockingChannel, message: Message, reason: str) -> None:
        """To the invalid-jobs queue with its reason, confirmed (basic_publish waits for it)."""
        reason = bound(reason, MAX_REASON_CHARS)
        body = json.dumps({"reason": reason, "message": bound(message.body.decode("utf-8", "replace"), 65536)})
        props = persistent(message.message_id or "", {REASON_HEADER: reason})
        # mandatory: a missing invalid queue returns it (UnroutableError), the message is not acked, and the
        # next connection declares the queue again.
        channel.basic_publish("", self.settings.invalid_queue, body.encode(), properties=props, mandatory=True)
        self.counts["invalid"] += 1
        log.warning("rabbitmq: invalid message%s sent to %r: %s",
                    f" {message.message_id}" if message.message_id else "", self.settings.invalid_queue, reason)

    # -- state for people ------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "updated_at": time.time(), "state": self.state, "queue": self.settings.queue,
                "url": where(self.settings.url), "unacked": self.unacked, "ready": self.ready,
                "connected_at": self.connected_at,
                "last_error": self.last_error, "published": self.announcer.published,
                "returned": self.announcer.returned, "unroutable": self.announcer.held, "warnings": self.warnings,
                "handling": self.handling, **self.counts}

    def write_state(self, *, force: bool = False, probe: BlockingChannel | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._state_at < STATE_SECONDS:
            return
        self._state_at = now
        if probe is not None:
            self.ready = probe.queue_declare(self.settings.queue, passive=True).method.message_count
        write_broker_state(self.config, self.snapshot())


def consumer_main(config: Config, *, create: bool = True, after_commit: Callable[[], None] | None = None) -> int:
    """A process that consumes until SIGTERM or SIGINT (a supervisor's child, or ``comfysup consume``).
    ``create``: make the queue if it does not exist (False for a supervisor's child: the supervisor made it,
    and one deleted since must not be made again empty)."""
    queue = open_queue(config, create=create)
    consumer = Consumer(config, queue, after_commit=after_commit)
    consumer.watch.deep_every(DEEP_CHECK_SECONDS if create else None)  # under comfysup run, the monitor reads the file

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not consumer.stop.is_set():
            consumer.stop.set()
            signal.setitimer(signal.ITIMER_REAL, STOP_GRACE_SECONDS)

    def on_timer(signum: int, frame: FrameType | None) -> None:
        consumer.force_stop()

    signal.signal(signal.SIGALRM, on_timer)
    stopsignals.install(on_signal)  # and a stop that came while it was being set up (a supervisor's child)
    try:
        return consumer.run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        queue.close()


__all__ = ["Consumer", "consumer_main", "jobs_reader"]
