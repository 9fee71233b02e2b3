"""max_queued refused at the doors that are not the API (tests/integration/test_api_tenants.py has its 429):
``comfysup submit`` exits 4 and says the count, queuing nothing; the broker's messages of that tenant go to the
invalid queue with the reason while the others' are queued; a message's ``tenant`` header names its tenant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import cli

from tests.broker_support import Broker, Running, broker, broker_config, encode, job_line, wait_for  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def test_submit_past_max_queued_exits_4_with_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "trivial.json").write_text((ROOT / "examples" / "workflows" / "trivial.json").read_text())
    (tmp_path / "config.toml").write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n[tenants.a]\nmax_queued = 2\n')
    lines = [{"workflow": "trivial.json", "meta": {"n": n}} for n in range(3)]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = ["--config", str(tmp_path / "config.toml")]
    code, _out, err = cli(capsys, "submit", *config, "--tenant", "a", str(tmp_path / "jobs.jsonl"))
    assert code == 4 and "3 queued job(s) with this submit, more than its max_queued of 2" in err, err
    code, out, _err = cli(capsys, "submit", *config, "--tenant", "b", str(tmp_path / "jobs.jsonl"))
    assert code == 0 and "submitted 3 job(s)" in out
    code, out, _err = cli(capsys, "status", *config, "--by", "tenant")
    assert code == 0 and "b" in out


def test_the_broker_refuses_a_full_tenants_messages_with_the_reason(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    from comfysup.broker.consumer import Consumer
    from comfysup.queue import open_queue

    config = broker_config(tmp_path, broker, tenants={"a": {"max_queued": 1}})
    lines = [job_line(n, tag=broker.tag) for n in range(3)]
    broker.publish([encode(line) for line in lines], ["m0", "m1", "m2"],
                   headers=[{"tenant": "a"}, {"tenant": "a"}, {"tenant": "b"}])
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 3, what="3 acknowledged")
    got = broker.drain(broker.names["invalid_queue"], expect=2)
    assert sorted(props.message_id for props, _body in got) == ["m0", "m1"]
    assert all("max_queued of 1" in json.loads(body)["reason"] for _props, body in got)
    assert [(j.id, j.tenant) for j in queue.reads.iter_jobs()] == [(lines[2]["id"], "b")]
    queue.close()
