"""Rows R1-R3: the RabbitMQ front door under faults, judged by the checker.

Every row publishes its jobs to a real RabbitMQ broker with confirms, lets ``comfysup run`` (its
consumer child, or R1's killed consumers) take them into the queue, the runners run them on fake_comfy, and
the outbox announces each end to the done and dead exchanges, where a listener queue bound to both hears
them. The published jobs are the run's accepted submissions, so one the consumer never inserted is lost;
the ids heard are the checker's ``announced``, so a terminal job never announced is a violation. Done
exactly once is the checker's own: no double terminal, no re-execution without a fault.

- R1: the consumer killed between the commit of a batch and its acknowledgement, hundreds of times (forked
  consumers whose ``after_commit`` exits); the redelivered batches must create nothing twice.
- R2: the broker restarted mid-stream (``rabbitmqctl stop_app`` / ``start_app``) while jobs are published
  and run, and results announced.
- R3: every connection closed by the broker (``rabbitmqctl close_all_connections``), repeatedly.

R1 uses the machine's broker (it stops nothing there). R2 and R3 stop or cut the broker, so they run on a
private node of their own (tests/rabbitmq_node.py: own ports, data folder and cookie): the test passes the
session's node, bench/chaos.py none, and the row then starts one under its folder for itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pika
import tomli_w
from broker_support import URL, Broker
from rabbitmq_node import OwnBroker
from supervisor_support import wait_for

from chaos.checker import Report, Submission
from chaos.harness import ChaosRun
from comfysup import records
from comfysup.broker.consumer import Consumer
from comfysup.config import load_config
from comfysup.queue import open_queue
from comfysup.slotstate import read_broker_state


class BrokerRun:
    """A ChaosRun whose jobs go through RabbitMQ, with a listener on both result exchanges."""

    def __init__(self, h: ChaosRun, *, url: str, prefetch: int = 20, supervisor_consumes: bool = True) -> None:
        self.h = h
        self.url = url
        self.broker = Broker(url=url)
        names = dict(self.broker.names)
        self.jobs_queue = names["queue"]
        if not supervisor_consumes:  # R1: the supervisor's consumer child takes an idle queue; ours the jobs
            names["queue"] = f"{self.jobs_queue}-idle"
        doc = tomllib.loads(h.config_path.read_text())
        doc["rabbitmq"] = {"url": url, "prefetch": prefetch, "reconnect_max_delay_seconds": 1.0, **names}
        h.config_path.write_bytes(tomli_w.dumps(doc).encode())
        h.config = load_config(str(h.config_path), env={})
        self.results = self.broker.listen()
        conn = self.broker.connection()  # declared before the first publish, as comfysup would declare it
        conn.channel().queue_declare(self.jobs_queue, durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()
        self.heard: set[str] = set()
        self.heard_messages = 0
        self.republished = 0

    # -- publishing and hearing, both surviving a broker that goes away -------------------------------------

    def publish(self, jobs: list[dict[str, Any]], *, chunk: int = 0, pause: float = 0.0) -> None:
        """Every line confirmed (a publish cut by a fault is sent again: the consumer recognises the id)."""
        path = self.h.write_jobs(jobs)
        self.h.submissions.append(Submission(path, tuple(j["id"] for j in jobs), "accepted"))
        pending = [(j["id"], json.dumps(j).encode()) for j in jobs]
        sent = 0
        while pending:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.url))
                try:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    while pending:
                        job_id, body = pending[0]
                        ch.basic_publish("", self.jobs_queue, body,  # mandatory: an unroutable one raises
                                         pika.BasicProperties(message_id=job_id, delivery_mode=2), mandatory=True)
                        pending.pop(0)
                        sent += 1
                        if chunk and sent % chunk == 0:
                            time.sleep(pause)
                finally:
                    with contextlib.suppress(Exception):
                        conn.close()
            except pika.exceptions.AMQPError:
                self.republished += 1
                time.sleep(0.3)

    def hear(self) -> None:
        """Take what the listener queue holds (a broker that is away is tried again later)."""
        with contextlib.suppress(pika.exceptions.AMQPError):
            for props, _body in self.broker.drain(self.results, timeout=0.5):
                self.heard.add(props.message_id)
                self.heard_messages += 1

    # -- the end ---------------------------------------------------------------------------------------------

    def ids(self) -> set[str]:
        return {i for s in self.h.submissions for i in s.ids}

    def settled(self) -> bool:
        """Every published job in the queue and terminal, the outbox empty, and every end heard."""
        h = self.h
        inserted = {r[0] for r in h.sql("SELECT id FROM jobs")}
        if not self.ids() <= inserted or h.active() or h.sql(
                "SELECT count(*) FROM announcements WHERE sent_at IS NULL")[0][0]:
            return False
        self.hear()
        return self.ids() <= self.heard

    def finish(self, proc: subprocess.Popen[bytes], seconds: float) -> Report:
        failure = None
        try:
            wait_for(self.settled, seconds, "every published job terminal and announced", self.h.describe)
        except AssertionError as exc:
            failure = str(exc).splitlines()[0]
        original = self.h.evidence
        self.h.evidence = lambda: dataclasses.replace(original(), announced=set(self.heard))  # type: ignore[method-assign]
        report = self.h.finish(proc)
        if failure:
            report.row_failures.append(failure)
        report.figures.update(announcements_heard=self.heard_messages, publishes_cut=self.republished,
                              broker_depth_after=self.broker.depth(self.jobs_queue))
        if report.figures["broker_depth_after"]:
            report.row_failures.append(f"{report.figures['broker_depth_after']} messages left in the jobs queue")
        return report

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.delete()
            self.broker.connection().channel().queue_delete(f"{self.jobs_queue}-idle")


# -- R1 ------------------------------------------------------------------------------------------------------

def _killed_consumer(config_path: Path, queue_name: str, rate: float, seed: int) -> int:
    """Fork a consumer of ``queue_name`` that exits right after a batch committed, with probability ``rate``."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    parent = os.getppid()

    def orphaned() -> None:  # a test that died must not leave its consumer behind
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    try:
        config = load_config(str(config_path), env={})
        config = records.replace(config, rabbitmq=records.replace(config.rabbitmq, queue=queue_name))
        rng = random.Random(seed)

        def after_commit() -> None:
            if rng.random() < rate:
                os._exit(137)  # the commit is durable, the ack never sent: the broker redelivers the batch

        queue = open_queue(config)
        consumer = Consumer(config, queue, after_commit=after_commit)
        signal.signal(signal.SIGTERM, lambda signum, frame: consumer.stop.set())
        consumer.run()
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def r1_consumer_killed_before_ack(tmp: Path, seed: int, *, jobs: int, prefetch: int = 2, rate: float = 0.7,
                                  node_ms: float = 5.0) -> Report:
    h = ChaosRun(tmp, "R1", seed, node_ms=node_ms)
    b = BrokerRun(h, url=URL, prefetch=prefetch, supervisor_consumes=False)  # the machine's broker: never stopped
    try:
        proc = h.start()
        h.wait_ready(proc)
        b.publish(h.jobs_for(jobs))
        kills, started = 0, time.monotonic()
        while True:
            pid = _killed_consumer(h.config_path, b.jobs_queue, rate, h.rng.randrange(2**32))
            ended = None
            while ended is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    ended = status
                elif h.sql("SELECT count(*) FROM jobs")[0][0] >= jobs and b.broker.depth(b.jobs_queue) == 0:
                    time.sleep(1.0)  # its last ack
                    os.kill(pid, signal.SIGTERM)  # a consumer that was not killed stops when everything is in
                    ended = os.waitpid(pid, 0)[1]
                    if ended == 0 and b.broker.depth(b.jobs_queue) == 0:
                        break
                else:
                    time.sleep(0.02)
            if os.WIFEXITED(ended) and os.WEXITSTATUS(ended) == 137:
                kills += 1
                h.faults.record("consumer_kill", pids=(pid,))
            elif ended:
                raise AssertionError(f"consumer {pid} failed: status {ended}")
            elif b.broker.depth(b.jobs_queue) == 0 and h.sql("SELECT count(*) FROM jobs")[0][0] >= jobs:
                break
        h.figures.update(consumer_kills=kills, ingest_seconds=round(time.monotonic() - started, 1))
        report = b.finish(proc, 120 + jobs * 0.2)
        if report.states["done"] != report.jobs:
            report.row_failures.append(f"only {report.states['done']} of {report.jobs} jobs done")
        return report
    finally:
        b.cleanup()
        h.cleanup()


# -- R2 and R3 -------------------------------------------------------------------------------------------------

def _broker_faults(tmp: Path, seed: int, name: str, *, jobs: int, faults: int, fault: Any, node_ms: float,
                   node: OwnBroker | None) -> Report:
    if node is None:  # bench/chaos.py: a node of the row's own, stopped at its end
        with OwnBroker(tmp / "rabbitmq") as own:
            return _broker_faults(tmp, seed, name, jobs=jobs, faults=faults, fault=fault, node_ms=node_ms, node=own)
    h = ChaosRun(tmp, name, seed, node_ms=node_ms)
    b = BrokerRun(h, url=node.url, prefetch=20)
    try:
        proc = h.start()
        h.wait_ready(proc)
        publisher = threading.Thread(target=b.publish, args=(h.jobs_for(jobs),),
                                     kwargs={"chunk": 5, "pause": 0.3}, daemon=True)
        publisher.start()
        for _ in range(faults):
            time.sleep(h.rng.uniform(0.5, 1.5))
            at = time.time()
            fault(h, node)
            # The consumer noticed and is back before the next fault: each fault is survived on its own.
            wait_for(lambda at=at: _consuming_since(h, at), 60, "the consumer to consume again", h.describe)
            b.hear()  # results heard between faults too, so the listener's queue is read mid-stream
        publisher.join(120)
        report = b.finish(proc, 120 + jobs * 0.2)
        if report.states["done"] != report.jobs:
            report.row_failures.append(f"only {report.states['done']} of {report.jobs} jobs done")
        log = h.log_path.read_text(errors="replace")
        report.figures["consumer_reconnections"] = log.count("rabbitmq: connected;") - 1
        return report
    finally:
        b.cleanup()
        h.cleanup()


def _consuming_since(h: ChaosRun, at: float) -> bool:
    state = read_broker_state(h.config) or {}
    return state.get("state") == "consuming" and float(state.get("connected_at") or 0) > at


def _restart(h: ChaosRun, node: OwnBroker) -> None:
    node.ctl("stop_app")
    try:
        h.faults.record("broker_stop")
        time.sleep(h.rng.uniform(0.5, 2.0))
    finally:
        node.ctl("start_app")  # always: R3 may share this node next
    wait_for(node.answers, 60, f"RabbitMQ ({node.node}) to answer again")
    h.faults.record("broker_start")


def _close_all(h: ChaosRun, node: OwnBroker) -> None:
    node.ctl("close_all_connections", "comfysup chaos R3")
    h.faults.record("broker_closed_connections")


def r2_broker_restarted(tmp: Path, seed: int, *, jobs: int, restarts: int, node_ms: float = 5.0,
                        node: OwnBroker | None = None) -> Report:
    """``node``: the private broker to restart (the test's shared one); None starts one for this row."""
    return _broker_faults(tmp, seed, "R2", jobs=jobs, faults=restarts, fault=_restart, node_ms=node_ms, node=node)


def r3_connections_closed(tmp: Path, seed: int, *, jobs: int, closes: int, node_ms: float = 5.0,
                          node: OwnBroker | None = None) -> Report:
    """``node``: the private broker whose connections are closed; None starts one for this row."""
    return _broker_faults(tmp, seed, "R3", jobs=jobs, faults=closes, fault=_close_all, node_ms=node_ms, node=node)
