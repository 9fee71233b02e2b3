"""What ``comfysup run`` does about the model manifest besides pulling: under systemd it asks for more start time
while the pull lasts (a pull of gigabytes outlasts TimeoutStartSec), and its unit may write to the model cache."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from comfysup.commands import run
from comfysup.commands.systemd_unit import unit
from comfysup.config import build_config
from comfysup.models import pull as pulling

MODEL = {"folder": "checkpoints", "name": "a.safetensors", "url": "https://hf.example/a", "sha256": "ab" * 32}


def test_systemd_is_asked_to_wait_while_models_are_pulled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        heard: list[str] = []

        def pull(config: Any, **_: Any) -> pulling.PullReport:  # the pull lasts until systemd heard of it
            heard.append(sock.recv(4096).decode())
            return pulling.PullReport(fetched=1)

        monkeypatch.setattr(pulling, "pull", pull)
        run.pull_models(build_config({"comfyui": {"gpus": "cpu:1"}, "models": [MODEL]}, root=str(tmp_path), env={}))
    assert heard and f"EXTEND_TIMEOUT_USEC={run.EXTEND_SECONDS * 1_000_000}" in heard[0]
    assert "WATCHDOG=1" in heard[0] and "STATUS=pulling model files" in heard[0]


def test_nothing_is_pulled_without_a_manifest_or_without_launched_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pulling, "pull", lambda *a, **k: pytest.fail("pulled"))
    run.pull_models(build_config({}, env={}))
    run.pull_models(build_config({"comfyui": {"gpus": "none"}, "servers": [{"name": "a", "url": "http://h:1"}],
                                  "models": [MODEL]}, env={}))


def test_the_unit_may_write_to_the_model_cache(tmp_path: Path) -> None:
    config = build_config({"queue": {"path": "/srv/q/queue.db"}, "comfyui": {"models_cache": "/mnt/models"},
                           "models": [MODEL]}, root=str(tmp_path), env={})
    writable = next(line for line in unit(config, tmp_path / "config.toml", "render").splitlines()
                    if line.startswith("ReadWritePaths="))
    assert "/mnt/models" in writable.split("=", 1)[1].split()


def test_a_file_that_cannot_be_pulled_stops_the_start(tmp_path: Path) -> None:
    from tests.models_support import FileServer, content, entry

    with FileServer({}).serving() as files:
        config = build_config({"comfyui": {"gpus": "cpu:1"}, "models": [entry(f"{files.url}/gone", content(10))]},
                              root=str(tmp_path), env={})
        with pytest.raises(pulling.ModelsError, match=r"checkpoints/tiny-sd.safetensors .*HTTP 404"):
            run.pull_models(config)
