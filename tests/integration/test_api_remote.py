"""Outputs are streamed from the machine that holds them. Two machines share one PostgreSQL queue and not
their result stores: machine A's API runs in the test's process, machine B's as ``comfysup api`` in a subprocess
(``COMFYSUP_HOSTNAME=machine-b``), and a stand-in runner completes jobs as machine B into B's store. A serves B's
files by streaming them from B's API (comfysup.api.remote)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w
from comfy_sdk import Comfy
from pg_support import pg_url  # noqa: F401  (a fixture)

from comfysup.api import remote
from comfysup.config import Config, load_config
from comfysup.queue import open_queue
from comfysup.queue.base import host_name
from tests.api_support import StandInRunner, api_config, running_api, running_api_app
from tests.port_support import server_port
from tests.supervisor_support import wait_for

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]
GRAPH = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
TOKEN = "fleet-token-5b1d0c"
DATA = os.urandom(2 * (1 << 20) + 12345)  # more than two of the API's chunks: streamed in several writes


def _free_port() -> int:
    """A port for a server started (or restarted) on it later, which no connection can take (port_support)."""
    return server_port()


@dataclass
class Fleet:
    a_config: Config
    a_url: str
    b_config: Config
    b: subprocess.Popen[bytes]
    b_log: Path
    job_id: str

    def content_url(self, base: str | None = None) -> str:
        return f"{base or self.a_url}/api/v2/assets/{self.job_id}.0/content"

    def stop_b(self) -> None:
        self.b.send_signal(signal.SIGTERM)
        assert self.b.wait(20) == 0, self.b_log.read_text()


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _machine_b(tmp_path: Path, pg_url: str) -> tuple[Config, subprocess.Popen[bytes], Path]:  # noqa: F811
    """Machine B's API as ``comfysup api``: its own store, the fleet's token, its public_url advertised."""
    port = _free_port()
    folder = tmp_path / "b"
    folder.mkdir()
    doc = {"queue": {"url": pg_url}, "store": {"dir": str(folder / "store")}, "comfyui": {"gpus": "cpu:1"},
           "api": {"listen": f"127.0.0.1:{port}", "token": TOKEN, "public_url": f"http://127.0.0.1:{port}"}}
    path = folder / "b.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    log = folder / "api.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    env.update({"COMFYSUP_HOSTNAME": "machine-b", "PYTHONPATH": str(ROOT)})
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "comfysup", "api", "--config", str(path)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    return load_config(str(path), env={}), proc, log


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Fleet]:  # noqa: F811
    """A (in-process, token) and B (subprocess, advertised), and one job B ran, its file only in B's store."""
    (tmp_path / "a").mkdir()
    a_config = api_config(tmp_path / "a", queue_url=pg_url, token=TOKEN)
    b_config, b, b_log = _machine_b(tmp_path, pg_url)
    queue = open_queue(a_config)
    runner = StandInRunner(b_config, machine="machine-b")
    try:
        wait_for(lambda: remote.fresh(queue.endpoints.api_endpoint("machine-b")), 30, "machine B's API in the queue",
                 lambda: b_log.read_text())
        with running_api(a_config) as a_url:
            posted = httpx.post(f"{a_url}/api/v2/jobs", json={"workflow": GRAPH}, headers=_auth())
            assert posted.status_code == 201, posted.text
            claim = runner.claim()
            assert claim is not None and claim.id == posted.json()["id"]
            runner.complete(claim, DATA)
            assert not (a_config.resolve(a_config.store.dir) / claim.id).exists()  # not in A's store
            yield Fleet(a_config, a_url, b_config, b, b_log, claim.id)
    finally:
        runner.close()
        queue.close()
        if b.poll() is None:
            b.kill()
            b.wait(10)


def test_an_output_in_another_machines_store_is_streamed_from_its_api(fleet: Fleet) -> None:
    whole = httpx.get(fleet.content_url(), headers=_auth(), timeout=30)
    assert whole.status_code == 200, whole.text
    assert whole.content == DATA
    assert whole.headers["Content-Length"] == str(len(DATA)) and whole.headers["Content-Type"] == "image/png"
    part = httpx.get(fleet.content_url(), headers={**_auth(), "Range": "bytes=1000-1049575"}, timeout=30)
    assert part.status_code == 206 and part.content == DATA[1000:1049576]
    assert part.headers["Content-Range"] == f"bytes 1000-1049575/{len(DATA)}"
    tail = httpx.get(fleet.content_url(), headers={**_auth(), "Range": "bytes=-10"}, timeout=30)
    assert tail.status_code == 206 and tail.content == DATA[-10:]
    head = httpx.head(fleet.content_url(), headers=_auth(), timeout=30)
    assert head.status_code == 200 and head.headers["Content-Length"] == str(len(DATA)) and head.content == b""
    beyond = httpx.get(fleet.content_url(), headers={**_auth(), "Range": f"bytes={len(DATA)}-"}, timeout=30)
    assert beyond.status_code == 416 and beyond.headers["Content-Range"] == f"bytes */{len(DATA)}"


def test_the_sdk_reads_another_machines_output_through_this_api(fleet: Fleet,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMFY_BASE_URL", fleet.a_url)
    monkeypatch.setenv("COMFY_API_KEY", TOKEN)
    with Comfy() as client:
        job = client.jobs.get(fleet.job_id)
        assert job.status == "succeeded"
        [output] = job.get_outputs("3")
        assert output.to_bytes() == DATA
        assert output.to_bytes(range=(0, 3)) == DATA[:4]


def test_a_request_passed_on_once_is_not_passed_on_again(fleet: Fleet) -> None:
    answer = httpx.get(fleet.content_url(), headers={**_auth(), remote.PROXIED: "1"}, timeout=30)
    assert answer.status_code == 404
    assert "not passed on again" in answer.json()["error"]["message"]


def test_the_fleets_token_is_forwarded_and_another_token_is_refused_by_the_other_machine(
        fleet: Fleet, tmp_path: Path) -> None:
    assert httpx.get(fleet.content_url(), timeout=30).status_code == 401  # A asks for its token first
    (tmp_path / "a2").mkdir()
    wrong = api_config(tmp_path / "a2", queue_url=fleet.a_config.queue.url, token="not-the-fleets-token")
    with running_api(wrong) as other:
        answer = httpx.get(fleet.content_url(other), headers=_auth("not-the-fleets-token"), timeout=30)
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert "machine-b" in message and "refused this API's token" in message and "one [api] token" in message
    assert "not-the-fleets-token" not in answer.text and TOKEN not in answer.text
    assert httpx.get(fleet.content_url(), headers=_auth(), timeout=30).content == DATA  # the fleet's token: B serves


def test_with_the_other_machines_api_stopped_the_answer_names_it_and_says_what_to_do(fleet: Fleet) -> None:
    fleet.stop_b()
    answer = httpx.get(fleet.content_url(), headers=_auth(), timeout=30)
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "machine 'machine-b'" in message and "[api] public_url" in message and "[store] dir" in message


@pytest.fixture
def lone_a(tmp_path: Path, pg_url: str) -> Iterator[tuple[Config, str, Any]]:  # noqa: F811
    """Machine A's API alone on the PostgreSQL queue, and a queue to write other machines' rows with."""
    config = api_config(tmp_path, queue_url=pg_url)
    queue = open_queue(config)
    try:
        with running_api(config) as url:
            yield config, url, queue
    finally:
        queue.close()


def _completed_elsewhere(config: Config, url: str, machine: str) -> str:
    """A job submitted through ``url`` and completed as ``machine``, its file then gone from every store here."""
    posted = httpx.post(f"{url}/api/v2/jobs", json={"workflow": GRAPH})
    assert posted.status_code == 201, posted.text
    runner = StandInRunner(config, machine=machine)
    try:
        claim = runner.claim()
        assert claim is not None
        runner.complete(claim, b"\x89PNG elsewhere")
    finally:
        runner.close()
    folder = config.resolve(config.store.dir) / claim.id
    for file in folder.iterdir():
        file.unlink()
    return f"{url}/api/v2/assets/{claim.id}.0/content"


def test_a_machine_whose_api_does_not_answer_is_a_502_naming_it(lone_a: Any) -> None:
    config, url, queue = lone_a
    content = _completed_elsewhere(config, url, "machine-c")
    with socket.socket() as held:  # bound, held, never listening: nobody listens there, nobody can start to
        held.bind(("127.0.0.1", 0))
        queue.endpoints.advertise_api("machine-c", f"http://127.0.0.1:{held.getsockname()[1]}", 4242)
        answer = httpx.get(content, timeout=30)
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert "machine 'machine-c'" in message and "does not answer" in message


def test_a_machine_that_never_advertised_is_a_404_saying_what_to_do(lone_a: Any) -> None:
    config, url, _ = lone_a
    answer = httpx.get(_completed_elsewhere(config, url, "machine-d"), timeout=30)
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "machine 'machine-d'" in message and "advertises no API" in message and "[api] public_url" in message


def test_two_apis_cannot_bounce_a_request_between_them(lone_a: Any) -> None:
    """machine-c's row names this very API: the request comes back once, marked, and stops there."""
    config, url, queue = lone_a
    content = _completed_elsewhere(config, url, "machine-c")
    queue.endpoints.advertise_api("machine-c", url, 4242)
    answer = httpx.get(content, timeout=30)
    assert answer.status_code == 404
    assert "machine 'machine-c'" in answer.json()["error"]["message"]


@contextmanager
def _answering_once(raw: bytes) -> Iterator[tuple[str, threading.Event]]:
    """A stand-in for another machine's API that answers one request with ``raw`` bytes, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    served = threading.Event()

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(raw)
        served.set()

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", served
    finally:
        listener.close()


def test_a_stream_that_breaks_off_ends_the_clients_answer_short(lone_a: Any) -> None:
    """The other machine promises 1000 bytes and closes after 500: the client gets those 500 and an incomplete
    answer (its Content-Length says so), never other bytes and never a body that looks whole."""
    config, url, queue = lone_a
    content = _completed_elsewhere(config, url, "machine-e")
    sent = os.urandom(500)
    received = b""
    with _answering_once(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 1000\r\n\r\n"
                         + sent) as (other, served):
        queue.endpoints.advertise_api("machine-e", other, 4242)
        with pytest.raises(httpx.RemoteProtocolError), httpx.stream("GET", content, timeout=30) as answer:
            assert answer.status_code == 200 and answer.headers["Content-Length"] == "1000"
            for chunk in answer.iter_bytes():
                received += chunk
        assert served.wait(10)
    assert received == sent[:len(received)]


def test_a_redirect_from_the_other_machine_is_not_followed(lone_a: Any) -> None:
    config, url, queue = lone_a
    content = _completed_elsewhere(config, url, "machine-f")
    with _answering_once(b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n"
                         b"Content-Length: 0\r\n\r\n") as (other, served):
        queue.endpoints.advertise_api("machine-f", other, 4242)
        answer = httpx.get(content, timeout=30)
        assert served.wait(10)
    assert answer.status_code == 502
    assert "machine 'machine-f'" in answer.json()["error"]["message"] and "302" in answer.json()["error"]["message"]


def test_the_api_refreshes_its_row_and_removes_it_when_it_stops(tmp_path: Path, pg_url: str,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "ADVERTISE_SECONDS", 0.05)
    config = api_config(tmp_path, queue_url=pg_url, public_url="http://10.9.9.9:9189")
    queue = open_queue(config)
    try:
        with running_api_app(config):
            row = queue.endpoints.api_endpoint(host_name())
            assert row is not None and row.url == "http://10.9.9.9:9189"
            queue.endpoints.withdraw_api(host_name(), os.getpid())  # gone: the next heartbeat writes it again
            wait_for(lambda: queue.endpoints.api_endpoint(host_name()), 10, "the heartbeat to write the row again")
        assert queue.endpoints.api_endpoint(host_name()) is None  # stopped: removed at once, not left to age out
    finally:
        queue.close()
