"""The RabbitMQ front door against the real broker (127.0.0.1:5672): ingest, idempotency, invalid
messages, results on both exchanges, submit --to rabbitmq."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.broker_support import Broker, Running, broker, broker_config, encode, job_line, wait_for  # noqa: F401

pika = pytest.importorskip("pika")

from comfysup.broker.consumer import REASON_HEADER, Consumer  # noqa: E402
from comfysup.queue import open_queue  # noqa: E402
from comfysup.slotstate import read_broker_state  # noqa: E402


def test_a_published_file_becomes_exactly_its_jobs(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker)
    lines = [job_line(n, tag=broker.tag) for n in range(40)]
    broker.publish([encode(line) for line in lines], [line["id"] for line in lines])
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: queue.reads.status().counts["queued"] == 40, what="40 queued jobs")
        wait_for(lambda: consumer.counts["acked"] == 40, what="every message acknowledged")
        state = read_broker_state(config)
        assert state is not None and state["state"] == "consuming" and "stale" not in state
    assert sorted(j.id for j in queue.reads.iter_jobs()) == sorted(line["id"] for line in lines)
    job = queue.reads.get(lines[3]["id"])
    assert job.params == lines[3]["set"] and job.meta == {"n": 3}
    assert broker.depth(broker.names["queue"]) == 0
    queue.close()


def test_duplicates_and_redeliveries_create_nothing_twice(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker, prefetch=5)
    lines = [job_line(n, tag=broker.tag) for n in range(20)]
    bodies = [encode(line) for line in lines]
    broker.publish(bodies + bodies[:7])  # a publisher that retried part of its batch
    queue = open_queue(config)
    crashes = []

    def crash_once() -> None:  # the consumer loses its connection between the commit and the ack
        if not crashes:
            crashes.append(1)
            raise pika.exceptions.StreamLostError("cut between commit and ack (test)")

    with Running(Consumer(config, queue, after_commit=crash_once)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 27, what="27 acknowledged")
        assert consumer.counts["received"] > 27  # the cut batch came again
        assert consumer.counts["inserted"] == 20
    assert queue.reads.status().counts["queued"] == 20
    assert broker.depth(broker.names["queue"]) == 0
    assert broker.depth(broker.names["invalid_queue"]) == 0
    queue.close()


def test_an_invalid_message_lands_in_the_invalid_queue_with_its_reason(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker)
    good = job_line(1, tag=broker.tag)
    changed = {**good, "meta": {"n": "changed"}}
    bodies = [b"{not json", encode({**job_line(2, tag=broker.tag), "workflow": "../../etc/passwd"}),
              encode({"id": "not-a-uuid", "workflow": "trivial.json"}), b"", encode(good), encode(changed)]
    broker.publish(bodies, ["m0", "m1", "m2", "m3", "m4", "m5"])
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 6, what="6 acknowledged")
    got = broker.drain(broker.names["invalid_queue"], expect=5)
    assert len(got) == 5
    by_id = {props.message_id: (props, json.loads(body)) for props, body in got}
    assert set(by_id) == {"m0", "m1", "m2", "m3", "m5"}
    for props, body in by_id.values():
        assert props.headers[REASON_HEADER] == body["reason"] and body["reason"]
        assert props.delivery_mode == 2
    assert "not valid JSON" in by_id["m0"][1]["reason"]
    assert by_id["m0"][1]["message"] == "{not json"
    assert "workflows_dir" in by_id["m1"][1]["reason"]
    assert "different content" in by_id["m5"][1]["reason"]
    assert [j.id for j in queue.reads.iter_jobs()] == [good["id"]]
    assert broker.depth(broker.names["queue"]) == 0
    queue.close()


def test_results_arrive_on_both_exchanges_from_the_outbox(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker)
    results = broker.listen()
    lines = [job_line(n, tag=broker.tag) for n in range(3)]
    broker.publish([encode(line) for line in lines])
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 3, what="3 acknowledged")
        first = queue.leases.claim("r", "gpu0", 30)
        assert first is not None
        queue.leases.complete(first, [])
        second = queue.leases.claim("r", "gpu0", 30)
        assert second is not None
        queue.leases.dead(second, "broken on purpose")
        got = broker.drain(results, expect=2)
        wait_for(lambda: queue.deliveries.announcement_backlog() == 0, what="the outbox emptied")
    assert sorted((p.message_id, p.headers["x-comfysup-state"]) for p, _ in got) == sorted(
        [(first.id, "done"), (second.id, "dead")])
    for props, body in got:
        record = json.loads(body)
        assert record["id"] == props.message_id and props.delivery_mode == 2
        assert record["status"] == props.headers["x-comfysup-state"]
    assert [a["sent_at"] is not None for a in queue.deliveries.announcements(first.id)] == [True]
    queue.close()


def test_submit_to_rabbitmq_publishes_every_line_after_the_same_validation(tmp_path: Path, broker: Broker,  # noqa: F811
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from comfysup.cli import main

    config = broker_config(tmp_path, broker)
    toml = "\n".join([f'[queue]\npath = "{tmp_path / "queue.db"}"', "[rabbitmq]", f'url = "{config.rabbitmq.url}"',
                      'workflows_dir = "workflows"'] + [f'{k} = "{v}"' for k, v in broker.names.items()])
    (tmp_path / "config.toml").write_text(toml + "\n")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(job_line(n, tag=broker.tag)) for n in range(10)) + "\n")
    assert main(["submit", "--config", str(tmp_path / "config.toml"), "--to", "rabbitmq", str(jobs)]) == 0
    assert "published 10 job(s)" in capsys.readouterr().out
    assert broker.depth(broker.names["queue"]) == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(job_line(1, tag=broker.tag)) + "\n" + '{"id": "x"}\n')
    assert main(["submit", "--config", str(tmp_path / "config.toml"), "--to", "rabbitmq", str(bad)]) == 2
    assert "bad.jsonl:2:" in capsys.readouterr().err
    assert broker.depth(broker.names["queue"]) == 10  # nothing of a bad file
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 10, what="10 acknowledged")
    assert queue.reads.status().counts["queued"] == 10
    queue.close()
