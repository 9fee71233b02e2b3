"""``comfysup run`` serves the Comfy API v2 as a supervised child: comfy-sdk submits, a real runner runs the job
on fake_comfy, the output comes back through the API, and SIGTERM stops the API with everything else."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psutil
import pytest
from comfy_sdk import Comfy

from tests.port_support import server_port
from tests.supervisor_support import Supervised

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    """A port for a server started (or restarted) on it later, which no connection can take (port_support)."""
    return server_port()


def test_the_sdk_runs_a_job_through_comfysup_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    sup = Supervised(tmp_path, extra_sections={"api": {"listen": f"127.0.0.1:{port}"}})
    url = f"http://127.0.0.1:{port}"
    try:
        proc = sup.start()
        sup.wait_ready(proc)
        sup.wait_api(url, 20)
        monkeypatch.setenv("COMFY_BASE_URL", url)
        monkeypatch.delenv("COMFY_API_KEY", raising=False)
        with Comfy() as client:
            workflow = client.workflows.from_file(ROOT / "examples" / "workflows" / "trivial.json")
            job = client.run(workflow, timeout=40)
            [output] = job.get_outputs("3")
            assert output.to_bytes().startswith(b"\x89PNG")
            # Outputs keyed by the node that made them, not guessed from the prefix: with ComfyUI's
            # default prefix on two save nodes, each node's get_outputs has its own file.
            graph = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())
            graph["3"]["inputs"]["filename_prefix"] = "ComfyUI"
            graph["9"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "ComfyUI"}}
            two = client.run(client.workflows.from_json(graph), timeout=40)
            inverted, plain = two.get_outputs("3"), two.get_outputs("9")
            assert len(inverted) == 1 and len(plain) == 1, httpx.get(f"{url}/api/v2/jobs/{two.id}").json()
            assert inverted[0].to_bytes() != plain[0].to_bytes()  # the image, and its inverse
        api_pids = [p.pid for p in psutil.Process(proc.pid).children() if "api" in p.cmdline()]
        assert len(api_pids) == 1, sup.describe()
        assert sup.stop(proc) == 0
        assert not psutil.pid_exists(api_pids[0]) or psutil.Process(api_pids[0]).status() == psutil.STATUS_ZOMBIE
        assert "API started" in sup.log()
    finally:
        sup.cleanup()
