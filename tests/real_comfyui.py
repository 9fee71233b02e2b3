"""A real ComfyUI on the CPU for the opt-in tests (``COMFYUI_DIR``: a checkout that runs with --cpu;
``COMFYUI_PYTHON``: its environment's Python; docs/comfyui-versions.md says how to make both). One function starts
it on a free port in a folder of the test's and waits for /system_stats; the caller's ``with`` stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.port_support import server_port

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
START_SECONDS = 120.0


@contextmanager
def started(base: Path) -> Iterator[str]:
    """ComfyUI from ``COMFYUI_DIR`` with ``--base-directory base``; yields its URL once /system_stats answers."""
    assert COMFYUI_DIR, "set COMFYUI_DIR (the caller skips without it)"
    (base / "custom_nodes").mkdir(parents=True, exist_ok=True)
    port = server_port()
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    with open(base / "comfyui.log", "wb") as log:
        proc = subprocess.Popen([python, str(Path(COMFYUI_DIR) / "main.py"), "--cpu", "--listen", "127.0.0.1",
                                 "--port", str(port), "--base-directory", str(base), "--disable-auto-launch"],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI exited with {proc.returncode}; see {base / 'comfyui.log'}")
            try:
                requests.get(f"{url}/system_stats", timeout=1).raise_for_status()
                break
            except requests.RequestException:
                time.sleep(0.2)  # polling a server that is starting: nothing to wait on but its answer
        else:
            pytest.fail(f"ComfyUI did not answer /system_stats within {START_SECONDS:g} s")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
