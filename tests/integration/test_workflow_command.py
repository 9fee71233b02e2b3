"""``comfysup workflow convert|inspect``: a UI file converted with --object-info or the queue's catalogues, an API
file and an image as they are, the settable inputs as a table and as JSON, and refusals a person reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from comfysup.queue.sqlite import SQLiteQueue
from tests.cli_support import cli, db_path, write_config

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
OBJECT_INFO = RECORDED / "object-info.json"
NESTED = json.loads((RECORDED / "built-nested-subgraphs.json").read_text())
IMAGES = RECORDED / "images"


@pytest.fixture
def ui_file(tmp_path: Path) -> Path:
    path = tmp_path / "ui.json"
    path.write_text(json.dumps(NESTED["workflow"]))
    return path


def inputs(prompt: dict) -> dict:
    return {k: (v["class_type"], v["inputs"]) for k, v in prompt.items()}


def test_convert_prints_the_api_prompt_with_object_info(capsys: pytest.CaptureFixture[str], ui_file: Path) -> None:
    code, out, err = cli(capsys, "workflow", "convert", str(ui_file), "--object-info", str(OBJECT_INFO))
    assert code == 0, err
    prompt = json.loads(out)
    assert inputs(prompt) == inputs(NESTED["prompt"])
    assert prompt["57:210:100"]["_meta"] == {"title": "Positive Prompt"}


def test_convert_uses_the_catalogues_the_queue_recorded(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        ui_file: Path) -> None:
    config = write_config(tmp_path)
    queue = SQLiteQueue(db_path(tmp_path))
    queue.fleet.record_catalogue("gpu0", "host", json.loads(OBJECT_INFO.read_text()))
    queue.close()
    code, out, err = cli(capsys, "workflow", "convert", str(ui_file), "--config", str(config))
    assert code == 0, err
    assert inputs(json.loads(out)) == inputs(NESTED["prompt"])


def test_convert_an_image_prints_the_prompt_it_carries(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(IMAGES / "comfyui-saveimage.png", tmp_path / "render.png")
    code, out, err = cli(capsys, "workflow", "convert", str(tmp_path / "render.png"))
    assert code == 0, err
    assert json.loads(out) == json.loads((IMAGES / "posted-prompt.json").read_text())


def test_convert_without_a_catalogue_says_how_to_get_one(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         ui_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "workflow", "convert", str(ui_file))
    assert code == 2 and out == ""
    assert "is in ComfyUI's UI format; converting it needs the node catalogue (/object_info)" in err
    assert "--object-info object_info.json" in err and "Traceback" not in err


def test_convert_refuses_every_problem_naming_the_node(capsys: pytest.CaptureFixture[str], ui_file: Path) -> None:
    workflow = json.loads(json.dumps(NESTED["workflow"]).replace('"VAEDecode"', '"FancyDecode"'))
    workflow["links"][0][1] = 999
    ui_file.write_text(json.dumps(workflow))
    code, _out, err = cli(capsys, "workflow", "convert", str(ui_file), "--object-info", str(OBJECT_INFO))
    assert code == 2
    assert "node 58 (FancyDecode): the node catalogue has no node type 'FancyDecode'" in err
    assert "its link 1 comes from node 999, which is not there" in err
    assert "2 problem(s) in" in err


def test_inspect_lists_what_a_job_can_set(capsys: pytest.CaptureFixture[str], ui_file: Path) -> None:
    code, out, err = cli(capsys, "workflow", "inspect", str(ui_file), "--object-info", str(OBJECT_INFO))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["node", "title", "class", "input", "value", "type", "range", "or", "choices"]
    seed = next(line for line in lines if line.startswith("57:212") and " seed " in line)
    assert seed.split()[:6] == ["57:212", "KSampler", "KSampler", "seed", "777", "INT"]
    assert "0..18446744073709551615" in seed
    prompt = next(line for line in lines if line.startswith("57:210:100"))
    assert "Positive Prompt" in prompt and "a cat" in prompt and "STRING" in prompt
    assert "euler, " in next(line for line in lines if " sampler_name " in line)


def test_inspect_json(capsys: pytest.CaptureFixture[str], ui_file: Path) -> None:
    code, out, err = cli(capsys, "workflow", "inspect", str(ui_file), "--object-info", str(OBJECT_INFO), "--json")
    assert code == 0, err
    rows = json.loads(out)
    seed = next(r for r in rows if r["node"] == "57:212" and r["input"] == "seed")
    assert seed == {"node": "57:212", "title": "KSampler", "class": "KSampler", "input": "seed", "value": 777,
                    "type": "INT", "limits": {"min": 0, "max": 18446744073709551615, "step": None}}
    scheduler = next(r for r in rows if r["input"] == "scheduler")
    assert "karras" in scheduler["limits"]


def test_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "workflow", "--help")
    assert code == 0 and "convert" in out and "inspect" in out and "PNG/WEBP" in out
    code, out, _ = cli(capsys, "workflow", "inspect", "--help")
    assert code == 0 and "Positive Prompt.text" in out
