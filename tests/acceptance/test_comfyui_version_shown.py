"""`comfysup run` learns each server's ComfyUI version and shows it in the state file, `status`
and /metrics, for either version of the fake."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from cli_support import run_cli
from supervisor_support import Supervised, wait_for


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("fake", "shown"), [("0.3.64", "0.3.64"), ("0.38", "0.38.1")])
def test_each_servers_comfyui_version_is_shown(harness: list[Supervised], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, fake: str, shown: str) -> None:
    monkeypatch.setenv("FAKE_COMFY_VERSION", fake)  # the launched fakes answer as this version
    h = Supervised(tmp_path)
    harness.append(h)
    proc = h.start()
    h.wait_ready(proc)
    slots = wait_for(lambda: (s := (h.state() or {}).get("slots")) and all(x.get("comfyui_version") for x in s)
                     and s, 30, "the servers' versions in the state file", h.describe)
    assert {s["comfyui_version"] for s in slots} == {shown}
    out = run_cli("status", "--config", str(h.config_path)).stdout
    assert shown[:8] in out, out
    metrics = requests.get(h.metrics_url(proc) + "/metrics", timeout=10).text
    assert f'version="{shown}"' in metrics and "comfysup_slot_comfyui_info" in metrics
    assert h.stop(proc) == 0
