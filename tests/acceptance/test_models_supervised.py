"""``comfysup run`` with a model manifest: it pulls what the cache lacks before any server starts (and says how long
that took), each server it launches lists the model through its own extra_model_paths.yaml, a job naming the model
is done, and once the runners have recorded the servers' catalogues, submit refuses a model no server has."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import requests
from supervisor_support import REPO, Supervised

from comfysup.cli import main as cli
from tests.models_support import FileServer, content, entry

CHECKPOINT = "v1-5-pruned-emaonly.safetensors"
T2I = json.loads((REPO / "fake_comfy" / "data" / "workflows" / "t2i_sd15.json").read_text())


@pytest.mark.timeout(90)
def test_run_pulls_the_manifest_before_the_servers_and_they_list_it(
        harness: list[Supervised], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = content(200_000, seed=20)
    with FileServer({"/sd15": data}).serving() as files:
        h = Supervised(tmp_path, extra_sections={"models": [entry(f"{files.url}/sd15", data, name=CHECKPOINT)]})
        harness.append(h)
        proc = h.start()
        state = h.wait_ready(proc, seconds=40)
        assert files.sent["/sd15"] == len(data)
    log = h.log()
    summary = log.index("models: 0 already cached, 1 fetched")
    assert summary < log.index("cpu0"), "the pull ends before any server starts"
    for slot in state["slots"]:
        info = requests.get(f"{slot['url']}/object_info/CheckpointLoaderSimple", timeout=5).json()
        assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] == [CHECKPOINT]
    done = str(uuid.uuid4())
    h.submit([{"id": done, "workflow": T2I, "set": {"3.steps": 2}}])
    assert h.wait_terminal([done])[done].state == "done"
    # The runners recorded what their servers list: a model outside the manifest is refused at the door.
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": str(uuid.uuid4()), "workflow": T2I,
                                 "set": {"4.ckpt_name": "sd_xl_base_1.0.safetensors"}}) + "\n")
    capsys.readouterr()
    assert cli(["submit", "--config", str(h.config_path), str(other)]) != 0
    assert "ckpt_name 'sd_xl_base_1.0.safetensors' is not on any server" in capsys.readouterr().err
    assert h.stop(proc) == 0
