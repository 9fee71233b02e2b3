"""Broker messages with workflows as people save them (the real RabbitMQ at 127.0.0.1:5672): a UI-format workflow
inline, set keys by title, converted with the catalogue the servers recorded; one that does not convert lands in the
invalid queue with every problem as its reason."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.broker_support import Broker, Running, broker, broker_config, encode, wait_for  # noqa: F401

pytest.importorskip("pika")

from comfysup.broker.consumer import Consumer
from comfysup.queue import open_queue

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
OBJECT_INFO = json.loads((RECORDED / "object-info.json").read_text())
NESTED = json.loads((RECORDED / "built-nested-subgraphs.json").read_text())


def test_a_ui_workflow_message_is_converted_and_a_broken_one_refused(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker)
    good_id, bad_id = (str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfysup-broker-ui/{broker.tag}/{n}")) for n in (1, 2))
    broken = json.loads(json.dumps(NESTED["workflow"]).replace('"VAEDecode"', '"FancyDecode"'))
    broker.publish([encode({"id": good_id, "workflow": NESTED["workflow"], "set": {"KSampler.seed": 5}}),
                    encode({"id": bad_id, "workflow": broken})], ["m1", "m2"])
    queue = open_queue(config)
    queue.fleet.record_catalogue("cpu0", "host", OBJECT_INFO)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 2, what="2 acknowledged")
    [(_props, body)] = broker.drain(broker.names["invalid_queue"], expect=1)
    assert "the node catalogue of cpu0@host has no node type 'FancyDecode'" in json.loads(body)["reason"]
    job = queue.reads.get(good_id)
    assert job.params == {"57:212.seed": 5} and job.workflow["57:212"]["inputs"]["seed"] == 5
    assert job.extra_data["extra_pnginfo"]["workflow"] == NESTED["workflow"]
    queue.close()
