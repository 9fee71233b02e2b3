"""Completion webhooks: signed, durable, retried with backoff, never in a job's way.

A receiving server in the test fails the first deliveries; ``comfysup work`` runs the jobs and its
deliverer keeps trying until each job's record has arrived once, signed as the README says. A receiver
that never answers costs a job nothing: it is done, and its delivery is given up after its tries, which
``comfysup show`` says.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from comfysup.config import WebhooksConfig
from comfysup.observability.webhooks import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Deliverer,
    sign,
    verify,
)
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.redact import display_url
from fake_comfy import FakeComfy
from tests.runner_helpers import comfysup, job_id, jobs_file, trivial_job, write_config
from tests.webhook_support import Receiver

SECRET = "whsec-test-3c7f1a"
CANARY = "sk-canary-hook-91be0c2d77"
URL_TOKEN = "T0KEN-in-the-path-5e1d"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=3).start()
    yield r
    r.stop()


def with_webhooks(config_path: Path, **webhooks: Any) -> None:
    import tomllib

    doc = tomllib.loads(config_path.read_text())
    doc["webhooks"] = {"allow_private": True, **webhooks}  # the receivers listen on 127.0.0.1
    config_path.write_bytes(tomli_w.dumps(doc).encode())


def test_the_signature_covers_timestamp_and_body() -> None:
    body = b'{"id":"x","status":"done"}'
    signature = sign(SECRET, "1700000000", body)
    assert signature.startswith("sha256=") and len(signature) == 7 + 64
    assert verify(SECRET, "1700000000", body, signature, now=1700000100)
    assert not verify(SECRET, "1700000001", body, signature, now=1700000100)  # another timestamp
    assert not verify(SECRET, "1700000000", body + b" ", signature, now=1700000100)  # another body
    assert not verify("other", "1700000000", body, signature, now=1700000100)
    assert not verify(SECRET, "1700000000", body, signature, now=1700000000 + 301)  # too old: a replay
    assert display_url(f"https://hooks.example:8443/services/{URL_TOKEN}?k=v") == "https://hooks.example:8443/…"


@pytest.mark.timeout(60)
def test_deliveries_survive_a_failing_receiver_and_arrive_signed_once_each(tmp_path: Path,
                                                                          receiver: Receiver) -> None:
    config_path = write_config(tmp_path, attempts=1)
    with_webhooks(config_path, url=f"{receiver.url}/all/{URL_TOKEN}", secret=SECRET, attempts=6,
                  base_delay_seconds=0.05, max_delay_seconds=0.2, timeout_seconds=2.0)
    jobs = [trivial_job(1, callback_url=f"{receiver.url}/own?token={URL_TOKEN}",
                        extra_data={"api_key_comfy_org": CANARY}, meta={"api_token": CANARY, "team": "a"}),
            trivial_job(2), trivial_job(3)]
    assert comfysup("submit", "--config", str(config_path), str(jobs_file(tmp_path, jobs))).returncode == 0
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        fake.script_by_id({job_id(3): ["invalid"]})
        out = comfysup("work", "--config", str(config_path), "--server", f"gpu0={fake.url}", "--until-empty")
    assert out.returncode == 0, out.stderr
    assert "summary: 2 done, 1 dead-lettered" in out.stderr  # the failing receiver changed no job

    accepted = [r for r in receiver.got if r.answered == 204]
    bodies = {json.loads(r.body)["id"]: (r, json.loads(r.body)) for r in accepted}
    assert sorted(bodies) == sorted(job_id(n) for n in (1, 2, 3))
    assert len(accepted) == 3 and len(receiver.got) == 6  # three 500s, each retried until accepted
    queue = SQLiteQueue(tmp_path / "queue.db", create=False)
    for n in (1, 2, 3):
        request, body = bodies[job_id(n)]
        stamp, signature = request.headers[TIMESTAMP_HEADER], request.headers[SIGNATURE_HEADER]
        assert verify(SECRET, stamp, request.body, signature), n
        assert abs(int(stamp) - time.time()) < 60
        job = queue.reads.get(job_id(n))
        [delivery] = queue.deliveries.deliveries(job_id(n))
        assert request.headers[DELIVERY_HEADER] == str(delivery.id)
        assert (delivery.state, delivery.last_status) == ("delivered", 204)
        assert body["status"] == job.state
        assert body["files"] == [{"name": o.name, "size": o.size, "sha256": o.sha256, "path": o.path,
                                  "node_id": o.node_id}
                                 for o in job.outputs]
        timings = body["timings"]
        assert timings["submitted_at"] == job.submitted_at and timings["finished_at"] == job.finished_at
        assert timings["queue_wait_seconds"] >= 0 and timings["run_seconds"] >= 0
    assert bodies[job_id(1)][0].path == f"/own?token={URL_TOKEN}"  # its own callback_url
    assert {bodies[job_id(n)][0].path for n in (2, 3)} == {f"/all/{URL_TOKEN}"}  # the config's url
    assert bodies[job_id(1)][1]["meta"] == {"api_token": "***", "team": "a"}
    assert bodies[job_id(3)][1]["reason"].startswith("POST /prompt 400")
    assert bodies[job_id(3)][1]["files"] == []
    assert all(CANARY not in r.body.decode() for r in receiver.got)
    retried = [n for n in (1, 2, 3) if queue.deliveries.deliveries(job_id(n))[0].attempts > 1]
    assert retried, "the first tries failed, so some delivery took several"
    shown = comfysup("show", "--config", str(config_path), job_id(retried[0]))
    assert shown.returncode == 0, shown.stderr
    webhook_lines = [line for line in shown.stdout.splitlines() if line.strip().startswith("webhook")]
    assert len(webhook_lines) == 1 and " delivered " in webhook_lines[0] and "HTTP 204" in webhook_lines[0]
    assert "tries" in webhook_lines[0] and URL_TOKEN not in shown.stdout and "/…" in webhook_lines[0]
    assert URL_TOKEN not in out.stderr and CANARY not in out.stderr
    queue.close()


@pytest.mark.timeout(30)
def test_a_receiver_that_never_answers_costs_the_job_nothing_and_is_given_up(tmp_path: Path) -> None:
    config_path = write_config(tmp_path)
    closed = Receiver(fail_first=0).start()
    url = f"{closed.url}/hook/{URL_TOKEN}"
    closed.stop()  # nothing listens there any more
    with_webhooks(config_path, url=url, attempts=2, base_delay_seconds=0.05, max_delay_seconds=0.05,
                  timeout_seconds=1.0)
    assert comfysup("submit", "--config", str(config_path), str(jobs_file(tmp_path, [trivial_job(1)]))).returncode == 0
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        out = comfysup("work", "--config", str(config_path), "--server", f"gpu0={fake.url}", "--until-empty")
    assert out.returncode == 0 and "summary: 1 done" in out.stderr, out.stderr
    queue = SQLiteQueue(tmp_path / "queue.db", create=False)
    assert queue.reads.get(job_id(1)).state == "done"
    deliverer = Deliverer(queue, WebhooksConfig(url=url, attempts=2, base_delay_seconds=0.05, allow_private=True,
                                                max_delay_seconds=0.05, timeout_seconds=1.0))
    deadline = time.monotonic() + 10
    while queue.deliveries.deliveries(job_id(1))[0].state == "pending":  # work's last pass may have left one try
        assert time.monotonic() < deadline, queue.deliveries.deliveries(job_id(1))
        deliverer.run_once()
        time.sleep(0.02)
    [delivery] = queue.deliveries.deliveries(job_id(1))
    assert (delivery.state, delivery.attempts, delivery.last_error) == ("failed", 2, "cannot connect")
    shown = comfysup("show", "--config", str(config_path), job_id(1))
    assert "webhook" in shown.stdout and "given up after 2 tries, last: cannot connect" in shown.stdout
    assert URL_TOKEN not in shown.stdout + out.stderr
    assert queue.deliveries.pending_deliveries() == 0
    queue.close()


# ---- resolve once, check, connect to the checked address ------------------------------

PUBLIC = "93.184.216.34"
"""A public-looking address the test's network routes to its own receiver (nothing leaves the machine)."""


class Network:
    """socket.getaddrinfo and socket.connect of this process, watched: ``answers`` are what each look-up of
    a test name gives in turn (the last one again after), ``connects`` every address a socket was asked to
    reach. A connect to PUBLIC reaches ``receiver``; one to another test address is refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[list[str]]],
                 receiver: Receiver | None = None) -> None:
        import socket

        self.answers, self.receiver = answers, receiver
        self.lookups: list[str] = []
        self.connects: list[str] = []
        real_lookup, real_connect = socket.getaddrinfo, socket.socket.connect
        network = self

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host not in network.answers:
                return real_lookup(host, port, *args, **kwargs)
            network.lookups.append(host)
            turns = network.answers[host]
            addresses = turns[min(len(network.lookups) - 1, len(turns) - 1)]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

        def connect(sock: Any, address: Any) -> Any:
            network.connects.append(address[0])
            if address[0] == PUBLIC and network.receiver is not None:
                return real_connect(sock, ("127.0.0.1", int(network.receiver.url.rsplit(":", 1)[1])))
            if address[0] != "127.0.0.1":
                raise ConnectionRefusedError(f"the test network does not reach {address[0]}")
            return real_connect(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", connect)


def deliver_once(tmp_path: Path, url: str) -> Any:
    from tests.queue_contract import make_job

    queue = SQLiteQueue(tmp_path / "q.db", create=True)
    try:
        job = make_job(1, callback_url=url)
        queue.intake.submit([job])
        queue.intake.cancel([job.id])  # terminal: its delivery is due
        Deliverer(queue, WebhooksConfig(attempts=1, timeout_seconds=5.0)).run_once()
        [delivery] = queue.deliveries.deliveries(job.id)
        return delivery
    finally:
        queue.close()


@pytest.mark.timeout(30)
def test_a_rebinding_name_is_looked_up_once_and_the_checked_address_is_the_one_connected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver(fail_first=0).start()
    try:
        port = int(receiver.url.rsplit(":", 1)[1])
        network = Network(monkeypatch, {"hooks.example": [[PUBLIC], ["127.0.0.1"]]}, receiver)
        delivery = deliver_once(tmp_path, f"http://hooks.example:{port}/hook")
        assert (delivery.state, delivery.last_error) == ("delivered", None)
        assert network.lookups == ["hooks.example"]  # once: the HTTP library does not look it up again
        assert network.connects == [PUBLIC]  # never 127.0.0.1, whatever the name says by now
        assert [r.headers["Host"] for r in receiver.got] == [f"hooks.example:{port}"]  # the name, not the address
    finally:
        receiver.stop()


@pytest.mark.timeout(30)
def test_https_connects_to_the_checked_address_and_verifies_the_name(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    receiver = Receiver(fail_first=0).start()  # plain HTTP: the test stops at the TLS handshake's start
    try:
        port = int(receiver.url.rsplit(":", 1)[1])
        network = Network(monkeypatch, {"hooks.example": [[PUBLIC], ["127.0.0.1"]]}, receiver)
        names: list[Any] = []

        def wrap_socket(self: Any, sock: Any, *args: Any, server_hostname: Any = None, **kwargs: Any) -> Any:
            names.append((server_hostname, self.check_hostname, self.verify_mode))
            raise ssl.SSLError("the test ends the handshake here")

        monkeypatch.setattr(ssl.SSLContext, "wrap_socket", wrap_socket)
        delivery = deliver_once(tmp_path, f"https://hooks.example:{port}/hook")
        assert delivery.state == "failed" and receiver.got == []
        assert network.connects == [PUBLIC]
        assert names == [("hooks.example", True, ssl.CERT_REQUIRED)]  # SNI and certificate: the name's
    finally:
        receiver.stop()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("addresses", [["127.0.0.1"], ["10.0.0.5"], [PUBLIC, "169.254.169.254"]])
def test_a_name_that_resolves_to_a_private_address_is_refused_without_a_connect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, addresses: list[str]) -> None:
    network = Network(monkeypatch, {"inside.example": [addresses]})
    delivery = deliver_once(tmp_path, "http://inside.example:8080/hook")
    assert delivery.state == "failed"
    assert f"refused to connect to inside.example: {addresses[-1]} is a" in (delivery.last_error or "")
    assert network.connects == []  # not even a SYN: nothing to time
