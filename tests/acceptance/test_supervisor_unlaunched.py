"""`comfysup run` around servers it does not launch, and a supervisor with no slot alive:
`gpus = "none"` with [[servers]] supervises runners, metrics, the status page and webhooks and launches no
ComfyUI; with every slot failed it exits non-zero with the reason and never says READY, so that
systemd's Restart=on-failure acts instead of a service that looks up and runs nothing."""

from __future__ import annotations

import json
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from supervisor_support import Supervised, job, processes_under, wait_for

from tests.webhook_support import Receiver


@pytest.fixture
def harness() -> Iterator[list[Supervised]]:
    made: list[Supervised] = []
    yield made
    for h in made:
        h.cleanup()


@pytest.mark.timeout(90)
def test_gpus_none_supervises_the_servers_of_the_config_without_launching_comfyui(
        harness: list[Supervised], tmp_path: Path) -> None:
    from fake_comfy import FakeComfy

    receiver = Receiver(fail_first=0).start()
    with FakeComfy(base_directory=tmp_path / "a", node_ms=100) as a, \
            FakeComfy(base_directory=tmp_path / "b", node_ms=100) as b:
        h = Supervised(tmp_path, servers=[{"name": "left", "url": a.url}, {"name": "right", "url": b.url}],
                       extra_sections={"comfyui": {"gpus": "none", "main": "/nonexistent/main.py"},
                                       "webhooks": {"url": f"{receiver.url}/done", "allow_private": True}})
        harness.append(h)
        ids = h.submit([job(n) for n in range(80, 88)])
        proc = h.start()
        jobs = h.wait_terminal(ids)
        assert {j.state for j in jobs.values()} == {"done"}
        assert {j.server for j in jobs.values()} == {"left", "right"}, "both servers' runners take jobs"
        state = h.state()
        assert state is not None
        assert [(s["name"], s["state"], s["pid"]) for s in state["slots"]] == [("left", "external", None),
                                                                               ("right", "external", None)]
        base = h.metrics_url(proc)
        with urllib.request.urlopen(base + "metrics", timeout=5) as r:
            assert 'comfysup_jobs{state="done"} 8.0' in r.read().decode()
        with urllib.request.urlopen(base, timeout=5) as r:
            assert "left" in r.read().decode()
        wait_for(lambda: len(receiver.got) >= len(ids), 20, "a webhook per job", h.describe)
        assert {json.loads(r.body)["id"] for r in receiver.got} == set(ids)
        assert h.stop(proc) == 0
        assert a.stats()["prompts"] and b.stats()["prompts"]
    receiver.stop()
    assert not (tmp_path / "var" / "comfyui").exists(), "no ComfyUI base directory: nothing was launched"
    assert "ComfyUI" not in "".join(line for line in h.log().splitlines() if "started" in line.lower())
    assert not processes_under(tmp_path)


def test_gpus_none_without_servers_says_what_to_add(harness: list[Supervised], tmp_path: Path) -> None:
    h = Supervised(tmp_path, extra_sections={"comfyui": {"gpus": "none"}})
    harness.append(h)
    proc = h.start()
    assert proc.wait(30) != 0
    assert 'gpus = "none" launches no ComfyUI server; list the servers to supervise as [[servers]]' in h.log()


EXITS_AT_ONCE = """\
import sys
print("this ComfyUI cannot start: no CUDA device", file=sys.stderr)
sys.exit(3)
"""


@pytest.mark.timeout(60)
def test_with_every_slot_failed_run_exits_non_zero_with_the_reason_and_sends_no_ready(
        harness: list[Supervised], tmp_path: Path) -> None:
    main = tmp_path / "comfyui_main.py"
    main.write_text(EXITS_AT_ONCE)
    h = Supervised(tmp_path, main=main, supervisor={"max_quick_failures": 2, "restart_max_delay_seconds": 0.2})
    harness.append(h)
    address = f"@comfysup-test-{uuid.uuid4().hex}"
    messages: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + address[1:])
        sock.settimeout(0.2)
        proc = h.start(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000"})

        def exited() -> bool:
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                pass
            return proc.poll() is not None

        wait_for(exited, 40, "the supervisor to exit", h.describe)
    assert proc.returncode == 3, h.describe()
    log = h.log()
    assert "every slot failed: cpu0: failed after 2 quick failures in a row" in log
    assert "no slot is alive, stopping (exit code 3)" in log
    assert not any(m.startswith("READY=1") for m in messages), messages
    state = h.state()
    assert state is not None and state["state"] == "stopped"
    assert not processes_under(tmp_path)
