"""A refused connection says so: `GET /system_stats: timed out after 2 s` from a
command that took 0.11 s sent a person looking for a slow server when nothing listened at all. Each place
that talks to a ComfyUI server is asked on a port where nothing listens."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import cli, write_config

from comfysup.comfy import ComfyClient, ServerUnavailable, probe


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A port on 127.0.0.1 that nothing listens on: bound and held, never listening, for the whole test (a port
    only closed again could be taken by a server of someone else's before the test connects)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_runner_client_says_connection_refused(dead_url: str) -> None:
    client = ComfyClient(dead_url, timeout_seconds=2)
    try:
        for call in (client.system_stats, client.queue, lambda: client.history("x")):
            with pytest.raises(ServerUnavailable) as caught:
                call()
            assert "connection refused" in str(caught.value.reason)
            assert "timed out" not in str(caught.value.reason)
    finally:
        client.close()


def test_health_says_connection_refused(dead_url: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text() + f'[[servers]]\nname = "remote"\nurl = "{dead_url}"\n')
    started = time.monotonic()
    code, out, _ = cli(capsys, "health", "--config", str(config))
    assert code == 1
    assert "unhealthy: GET /system_stats: connection refused" in out, out
    assert "timed out" not in out
    assert time.monotonic() - started < 2


def test_the_supervisors_readiness_check_says_connection_refused(dead_url: str) -> None:
    assert probe.readiness(dead_url, timeout_seconds=0.5) == "GET /system_stats: connection refused"
    assert not probe.answers(dead_url, timeout_seconds=0.5)


def test_the_readiness_check_of_a_server_that_never_answers_says_timed_out() -> None:
    with socket.socket() as listener:  # accepts connections (the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        assert probe.readiness(url, timeout_seconds=0.2) == "GET /system_stats: timed out after 0.2 s"
