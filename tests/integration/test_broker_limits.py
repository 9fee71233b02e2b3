"""The broker door never loops and never drops, against the real broker at 127.0.0.1:5672:
a message that kills the consumer ends in the invalid queue after [rabbitmq] delivery_limit, without its
batch-mates; a result nobody listens to stays in the outbox until a queue is bound; an existing jobs queue
without a delivery limit is reported; SIGTERM is honoured within a second while the broker never answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.broker_support import (  # noqa: F401
    URL,
    Broker,
    Proxy,
    Running,
    broker,
    broker_config,
    encode,
    job_line,
    wait_for,
)

pika = pytest.importorskip("pika")

from comfysup.broker import outbox  # noqa: E402
from comfysup.broker.consumer import Consumer  # noqa: E402
from comfysup.observability.brokermetrics import broker_metrics  # noqa: E402
from comfysup.observability.brokerview import broker_text  # noqa: E402
from comfysup.queue import open_queue  # noqa: E402
from comfysup.slotstate import read_broker_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

KILLED_BY_POISON = """
import os, signal, sys
from comfysup.broker import consumer
from comfysup.config import load_config

judge = consumer.Consumer.judge

def judge_or_die(self, batch):  # a bug that kills the process on one message, whatever it is
    if any(b"poison" in m.body for m in batch):
        os.kill(os.getpid(), signal.SIGKILL)
    return judge(self, batch)

consumer.Consumer.judge = judge_or_die
sys.exit(consumer.consumer_main(load_config(sys.argv[1])))
"""


def write_config(tmp_path: Path, names: Broker, url: str = URL, **rabbitmq: Any) -> Path:
    broker_config(tmp_path, names)  # copies the example workflows
    values = {"url": url, "workflows_dir": "workflows", "reconnect_max_delay_seconds": 1.0, **names.names,
              **rabbitmq}
    lines = ["[queue]", f"path = {json.dumps(str(tmp_path / 'queue.db'))}", "[comfyui]", 'gpus = "cpu:1"',
             "[rabbitmq]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.timeout(120)
def test_a_message_that_kills_the_consumer_ends_in_the_invalid_queue_alone(tmp_path: Path,
                                                                          broker: Broker) -> None:  # noqa: F811
    config_path = write_config(tmp_path, broker, delivery_limit=2, prefetch=10)
    script = tmp_path / "poisoned.py"
    script.write_text(KILLED_BY_POISON)
    good = [job_line(n, tag=broker.tag) for n in range(4)]
    poison = {**job_line(99, tag=broker.tag), "meta": {"note": "poison"}}
    broker.declare(open_config(config_path).rabbitmq)
    broker.publish([encode(good[0]), encode(poison)] + [encode(line) for line in good[1:]],
                   [good[0]["id"], "poison"] + [line["id"] for line in good[1:]])
    # delivery_limit = 2: delivered 3 times, then dead-lettered by the broker. Its dead-lettering follows the
    # third death a moment later, so the loop counts deaths rather than watching the invalid queue: one more
    # consumer started before the broker moved the message would wait for it forever.
    for deaths in range(3):
        assert broker.depth(broker.names["invalid_queue"]) == 0, f"dead-lettered after {deaths} deliveries"
        proc = subprocess.run([sys.executable, str(script), str(config_path)], env=env(), timeout=60,
                              capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr  # it took the poison each time
    wait_for(lambda: broker.depth(broker.names["invalid_queue"]) == 1, 30, "the poison in the invalid queue")
    got = broker.drain(broker.names["invalid_queue"], expect=1)
    assert [(p.message_id, json.loads(b)["id"]) for p, b in got] == [("poison", poison["id"])]
    headers = got[0][0].headers
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert headers["x-death"][0]["queue"] == broker.names["queue"]
    queue = open_queue(open_config(config_path))
    assert sorted(j.id for j in queue.reads.iter_jobs()) == sorted(line["id"] for line in good)  # none taken with it
    queue.close()
    assert broker.depth(broker.names["queue"]) == 0


def open_config(path: Path) -> Any:
    from comfysup.config import load_config

    return load_config(str(path))


@pytest.mark.timeout(60)
def test_sigterm_is_honoured_within_a_second_while_the_broker_never_answers(tmp_path: Path,
                                                                           broker: Broker) -> None:  # noqa: F811
    proxy = Proxy()
    config_path = write_config(tmp_path, broker, url=proxy.url())
    config = open_config(config_path)
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "consume", "--config", str(config_path)], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (read_broker_state(config) or {}).get("state") == "consuming", 30, "the consumer")
        proxy.freeze()  # the consumer asks the broker the queue's depth every second: that answer never comes
        wait_for(proxy.spoke.is_set, 10, "the consumer asking the frozen broker something")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail("the consumer ignored SIGTERM for 5 s while it waited for the broker")
        took = time.monotonic() - started
        assert took < 1.5, f"SIGTERM took {took:.2f} s"
        assert proc.returncode == 0, proc.stdout.read() if proc.stdout else ""
        assert read_broker_state(config)["state"] == "stopped"  # type: ignore[index]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proxy.close()


@pytest.mark.timeout(60)
def test_a_result_nobody_listens_to_stays_in_the_outbox_until_a_queue_is_bound(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(outbox, "UNROUTABLE_RETRY_SECONDS", 0.2)
    config = broker_config(tmp_path, broker)
    line = job_line(1, tag=broker.tag)
    broker.publish([encode(line)], [line["id"]])
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 1, what="the job taken")
        claim = queue.leases.claim("r", "gpu0", 30)
        assert claim is not None
        queue.leases.complete(claim, [])
        done = broker.names["done_exchange"]
        wait_for(lambda: ((read_broker_state(config) or {}).get("unroutable") or {}).get(done) == 1,
                 what="the result held in the outbox, as the state file says")
        assert queue.deliveries.announcement_backlog() == 1
        wait_for(lambda: (read_broker_state(config) or {}).get("returned", 0) >= 2,
                 what="the result returned by the broker, twice (tried again)")
        state = read_broker_state(config)
        assert state is not None and state["published"] == 0
        assert f"1 result(s) held in the outbox: exchange {done!r} has no queue bound" in broker_text(state, 1)
        metrics = {m.name: m for m in broker_metrics(state, 1)}
        assert [(s.labels, s.value) for s in metrics["comfysup_broker_outbox_unroutable"].samples] == [
            ({"exchange": done}, 1.0)]
        results = broker.listen()  # a downstream service binds its queue: the held result goes out
        got = broker.drain(results, expect=1)
        assert [p.message_id for p, _ in got] == [claim.id]
        wait_for(lambda: queue.deliveries.announcement_backlog() == 0, what="the outbox emptied")
        wait_for(lambda: consumer.announcer.unroutable == 0, what="nothing held any more")
    queue.close()


@pytest.mark.timeout(60)
def test_an_existing_jobs_queue_without_a_delivery_limit_is_reported(tmp_path: Path,
                                                                     broker: Broker) -> None:  # noqa: F811
    conn = broker.connection()
    conn.channel().queue_declare(broker.names["queue"], durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    config = broker_config(tmp_path, broker)
    line = job_line(1, tag=broker.tag)
    broker.publish([encode(line)], [line["id"]])  # used as it is
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 1, what="the job taken from the operator's queue")
        wait_for(lambda: bool((read_broker_state(config) or {}).get("warnings")), what="the warning in the state")
    state = read_broker_state(config)
    text = broker_text(state, 0)
    assert f"warning: queue {broker.names['queue']!r} already exists with other arguments" in text
    assert "x-dead-letter-exchange" in text and "rabbitmqctl set_policy" in text
    metrics = {m.name: m for m in broker_metrics(state, 0)}
    assert metrics["comfysup_broker_setup_warnings"].samples[0].value == 1
    queue.close()
