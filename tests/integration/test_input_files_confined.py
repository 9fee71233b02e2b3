"""Input files come from a place the operator chose: `comfysup submit` reads {"file": ...}
below the jobs file's folder (and [assets] input_roots), a broker message below [rabbitmq] inputs_dir (nothing
when unset). Never an absolute path, never .., never through a symlink, only a regular file (a FIFO refused at
once, never waited on); a stored input is hashed again before it is sent to a server."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from cli_support import run_cli

from tests.broker_support import Broker, Running, broker, broker_config, wait_for  # noqa: F401

WORKFLOW = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inv"}},
}


def submit_one(tmp_path: Path, file_value: str, extra_config: str = "") -> tuple[int, str]:
    """``comfysup submit`` of one line whose input is ``file_value``: (exit code, stderr)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir(exist_ok=True)
    (jobs / "wf.json").write_text(json.dumps(WORKFLOW))
    line = {"id": str(uuid.uuid4()), "workflow": "wf.json", "set": {"1.image": {"file": file_value}}}
    (jobs / "jobs.jsonl").write_text(json.dumps(line) + "\n")
    (tmp_path / "config.toml").write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n{extra_config}')
    started = time.monotonic()
    done = run_cli("submit", str(jobs / "jobs.jsonl"), "--config", str(tmp_path / "config.toml"), cwd=tmp_path,
                   timeout=20)
    assert time.monotonic() - started < 15
    assert "Traceback" not in done.stderr
    return done.returncode, done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["/etc/passwd", "../config.toml", "sub/../../config.toml", "/proc/self/environ"])
def test_submit_refuses_a_file_outside_the_jobs_folder(tmp_path: Path, value: str) -> None:
    code, err = submit_one(tmp_path, value)
    assert code != 0
    assert "jobs.jsonl:1" in err and "relative to the jobs file's folder" in err and "no .." in err, err


@pytest.mark.timeout(60)
def test_submit_refuses_a_symlink_that_leaves_the_jobs_folder(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "secret.png").write_bytes(b"not for the queue")
    os.symlink(tmp_path / "secret.png", tmp_path / "jobs" / "cat.png")
    code, err = submit_one(tmp_path, "cat.png")
    assert code != 0 and "jobs.jsonl:1" in err and "symlink" in err, err


@pytest.mark.timeout(60)
def test_submit_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    os.mkfifo(tmp_path / "jobs" / "cat.png")  # opened blocking, this would wait for a writer forever
    code, err = submit_one(tmp_path, "cat.png")
    assert code != 0 and "jobs.jsonl:1" in err and "not a regular file" in err, err


@pytest.mark.timeout(60)
def test_submit_reads_a_file_below_an_input_root(tmp_path: Path) -> None:
    (tmp_path / "library" / "cats").mkdir(parents=True)
    (tmp_path / "library" / "cats" / "tom.png").write_bytes(b"\x89PNG tom")
    code, err = submit_one(tmp_path, "cats/tom.png", '[assets]\ninput_roots = ["library"]\n')
    assert code == 0, err
    code, err = submit_one(tmp_path, "cats/tom.png")  # the same without the root: not found below the jobs folder
    assert code != 0 and "no such file cats/tom.png" in err, err


pika = pytest.importorskip("pika")

from comfysup.broker.consumer import REASON_HEADER, Consumer  # noqa: E402
from comfysup.queue import open_queue  # noqa: E402


def message(tag: str, file_value: str) -> bytes:
    job = str(uuid.uuid5(uuid.NAMESPACE_URL, f"confined/{tag}/{file_value}"))
    return json.dumps({"id": job, "workflow": "trivial.json", "set": {"1.color": {"file": file_value}}}).encode()


@pytest.mark.timeout(90)
def test_a_message_names_no_file_when_inputs_dir_is_unset(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    config = broker_config(tmp_path, broker)
    (tmp_path / "config.toml").write_text('[rabbitmq]\nurl = "amqp://guest:secret@localhost/"\n')
    broker.publish([message(broker.tag, "/proc/self/environ"), message(broker.tag, "../config.toml"),
                    message(broker.tag, "config.toml")], ["environ", "config", "plain"])
    queue = open_queue(config)
    with Running(Consumer(config, queue)) as consumer:
        wait_for(lambda: consumer.counts["acked"] == 3, what="3 acknowledged")
    got = {props.message_id: props.headers[REASON_HEADER] for props, _ in
           broker.drain(broker.names["invalid_queue"], expect=3)}
    assert set(got) == {"environ", "config", "plain"}
    assert all("[rabbitmq] inputs_dir, which is not set" in reason for reason in got.values()), got
    assert queue.assets.asset_totals()["assets"] == 0 and list(queue.reads.iter_jobs()) == []
    queue.close()


@pytest.mark.timeout(90)
def test_a_message_reads_only_regular_files_below_inputs_dir(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "ok.png").write_bytes(b"\x89PNG fine")
    os.mkfifo(inputs / "pipe.png")
    os.symlink("/etc/passwd", inputs / "passwd.png")
    config = broker_config(tmp_path, broker, inputs_dir="inputs")
    broker.publish([message(broker.tag, "ok.png"), message(broker.tag, "pipe.png"),
                    message(broker.tag, "passwd.png"), message(broker.tag, "/etc/passwd")],
                   ["ok", "pipe", "link", "abs"])
    queue = open_queue(config)
    consumer = Consumer(config, queue)
    with Running(consumer):
        wait_for(lambda: consumer.counts["acked"] == 4, what="4 acknowledged")
    got = {props.message_id: props.headers[REASON_HEADER] for props, _ in
           broker.drain(broker.names["invalid_queue"], expect=3)}
    assert "not a regular file" in got["pipe"] and "symlink" in got["link"] and "no .." in got["abs"], got
    assert queue.assets.asset_totals()["assets"] == 1 and len(list(queue.reads.iter_jobs())) == 1
    queue.close()
