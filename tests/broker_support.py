"""RabbitMQ for tests: the real broker at 127.0.0.1:5672 (guest/guest), names unique per test, deleted after.

``.ci/run`` checks that the broker answers before the suite, so these tests run rather than skip; a
developer without one gets a skip that says how to start it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import supervisor_support

pika = pytest.importorskip("pika")

from comfysup.config import Config, RabbitMQConfig, build_config  # noqa: E402

URL = os.environ.get("COMFYSUP_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/%2F")
EXAMPLES = Path(__file__).resolve().parents[1] / "comfysup" / "data" / "examples"


def broker_answers() -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(URL + "?connection_attempts=1&socket_timeout=3")).close()
        return True
    except pika.exceptions.AMQPError:
        return False


@dataclass
class Broker:
    """Unique queue and exchange names for one test, and helpers to publish and read, on the broker at ``url``
    (the machine's by default; chaos rows R2 and R3 pass their own node's, tests/rabbitmq_node.py)."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    url: str = URL

    @property
    def names(self) -> dict[str, str]:
        return {"queue": f"t-{self.tag}-jobs", "invalid_queue": f"t-{self.tag}-invalid",
                "done_exchange": f"t-{self.tag}-done", "dead_exchange": f"t-{self.tag}-dead"}

    def connection(self) -> Any:
        return pika.BlockingConnection(pika.URLParameters(self.url))

    def listen(self) -> str:
        """A queue bound to both result exchanges (declared here first): what a downstream service reads."""
        name = f"t-{self.tag}-results"
        conn = self.connection()
        ch = conn.channel()
        for exchange in (self.names["done_exchange"], self.names["dead_exchange"]):
            ch.exchange_declare(exchange, exchange_type="fanout", durable=True)
        ch.queue_declare(name, durable=True)
        for exchange in (self.names["done_exchange"], self.names["dead_exchange"]):
            ch.queue_bind(name, exchange)
        conn.close()
        return name

    def publish(self, bodies: list[bytes], message_ids: list[str | None] | None = None,
                headers: list[dict[str, Any] | None] | None = None) -> None:
        conn = self.connection()
        ch = conn.channel()
        ch.confirm_delivery()
        self.declare()
        for i, body in enumerate(bodies):
            mid = message_ids[i] if message_ids else None
            ch.basic_publish("", self.names["queue"], body, pika.BasicProperties(
                message_id=mid, delivery_mode=2, headers=headers[i] if headers else None))
        conn.close()

    def declare(self, settings: RabbitMQConfig | None = None) -> None:
        """The jobs queue and the rest as comfysup declares them (a queue that exists is left as it is)."""
        from comfysup.broker.connection import declare_all

        conn = self.connection()
        declare_all(conn, settings or RabbitMQConfig(url=self.url, **self.names))
        conn.close()

    def drain(self, queue: str, expect: int = 0, timeout: float = 20.0) -> list[tuple[Any, bytes]]:
        """Every message of ``queue`` (acked), waiting until at least ``expect`` arrived."""
        conn = self.connection()
        ch = conn.channel()
        got: list[tuple[Any, bytes]] = []
        deadline = time.monotonic() + timeout
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                got.append((props, body))
                continue
            if len(got) >= expect or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        conn.close()
        return got

    def depth(self, queue: str) -> int:
        conn = self.connection()
        n = conn.channel().queue_declare(queue, passive=True).method.message_count
        conn.close()
        return n

    def delete(self) -> None:
        conn = self.connection()
        for name in (self.names["queue"], self.names["invalid_queue"], f"t-{self.tag}-results"):
            ch = conn.channel()
            try:
                ch.queue_delete(name)
            except pika.exceptions.AMQPError:
                pass
        for name in (self.names["done_exchange"], self.names["dead_exchange"]):
            ch = conn.channel()
            try:
                ch.exchange_delete(name)
            except pika.exceptions.AMQPError:
                pass
        conn.close()


@contextlib.contextmanager
def connection_kept(url: str = URL) -> Iterator[None]:
    """Fail when a connection to the broker at ``url`` (the machine's by default), opened before the block, is
    not still open and working after it: what a test that must leave that broker alone wraps itself in. A
    broker that does not answer at the start has nothing to keep (no check)."""
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url + "?heartbeat=0&connection_attempts=1"))
    except pika.exceptions.AMQPError:
        yield
        return
    try:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        yield
        try:
            ch.basic_publish("", queue, b"still here")
            kept = ch.basic_get(queue, auto_ack=True)[2] == b"still here"
        except pika.exceptions.AMQPError as exc:
            kept, why = False, f"{type(exc).__name__} {exc}"
        else:
            why = "the message sent on it did not come back"
        assert kept, f"a connection to {url} opened before the test was closed during it ({why}): the test " \
                     "stopped or cut a broker it must leave alone"
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture
def broker() -> Iterator[Broker]:
    if not broker_answers():
        pytest.skip(f"RabbitMQ does not answer at {URL}: start it (rabbitmq-server) or run .ci/run")
    b = Broker()
    yield b
    b.delete()


def broker_config(tmp_path: Path, broker: Broker, tenants: dict[str, Any] | None = None, **rabbitmq: Any) -> Config:
    workflows = tmp_path / "workflows"
    if not workflows.exists():
        shutil.copytree(EXAMPLES / "workflows", workflows)
    raw = {"queue": {"path": str(tmp_path / "queue.db")}, "comfyui": {"gpus": "cpu:1"},
           "rabbitmq": {"url": URL, "workflows_dir": "workflows", "prefetch": 50,
                        "reconnect_max_delay_seconds": 1.0, **broker.names, **rabbitmq},
           **({"tenants": tenants} if tenants else {})}
    return build_config(raw, source=str(tmp_path / "config.toml"), root=str(tmp_path), env={})


def job_line(n: int, *, tag: str = "", color: int | None = None) -> dict[str, Any]:
    job_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-broker-test/{tag}/{n}"))
    return {"id": job_id, "workflow": "trivial.json",
            "set": {"1.color": n if color is None else color, "3.filename_prefix": f"b{n}"}, "meta": {"n": n}}


def encode(line: dict[str, Any]) -> bytes:
    return json.dumps(line).encode()


def wait_for(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """supervisor_support.wait_for, with the broker tests' defaults."""
    supervisor_support.wait_for(check, timeout, what)


class Running:
    """A Consumer in a thread of the test's own process; stopped and joined on exit."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.thread = threading.Thread(target=consumer.run, daemon=True)

    def __enter__(self) -> Any:
        self.thread.start()
        return self.consumer

    def __exit__(self, *exc: object) -> None:
        self.consumer.stop.set()
        self.thread.join(10)


class Proxy:
    """A TCP relay on a loopback port the OS assigns, in front of the broker. ``freeze()`` stops passing the
    broker's bytes on (a broker that never answers, never confirms); ``spoke`` is set when the client sends
    something after the freeze (it is then waiting for an answer that will not come)."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5672)) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.spoke = threading.Event()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def freeze(self) -> None:
        self.frozen.set()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_broker: bool) -> None:
        while not self.closed.is_set():
            if from_broker and self.frozen.is_set():
                self.closed.wait(0.05)  # leave the broker's bytes unread
                continue
            try:
                data = source.recv(65536)
                if not data:
                    return
                if self.frozen.is_set():
                    if from_broker:  # arrived just as it froze: never passed on
                        self.closed.wait()
                        return
                    self.spoke.set()
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        for sock in [self.listener, *self.sockets]:
            try:
                sock.close()
            except OSError:
                pass
