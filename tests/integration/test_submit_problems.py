"""``comfysup submit`` on a queue that holds a server's node catalogue reports every problem
of a line, each as ``jobs.jsonl:LINE: reason``, with "did you mean" for class names, input names and combo
values, "an INT", a refusal for a value where only a link can go, and a hint for a file name that is a local
file the servers do not have.

The catalogue is the fake's own /object_info (fake_comfy/data/object_info.json) as a runner records it, with the
checkpoint files a real server would list; each case runs the command as a person types it, from the jobs
file's folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_support import TRIVIAL, cli, count_jobs, db_path, job_id, line, run_cli, write_config, write_jobs

from comfysup.queue.sqlite import SQLiteQueue

FAKE_INFO = Path(__file__).resolve().parents[2] / "fake_comfy" / "data" / "object_info.json"
CHECKPOINTS = ["v1-5-pruned-emaonly.safetensors", "sd_xl_base_1.0.safetensors", "dreamshaper_8.safetensors"]
WITH_CHECKPOINT = {**TRIVIAL, "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINTS[0]}}}
LOAD_INVERT = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "comfysup/example.png"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "comfysup"}},
}

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("COMFYSUP_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def catalogue(load_image_choices: list[str] | None = None) -> dict[str, Any]:
    """The fake's /object_info, as a server with CHECKPOINTS in models/checkpoints would answer it."""
    info = json.loads(FAKE_INFO.read_text())
    info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] = list(CHECKPOINTS)
    info["LoadImage"]["input"]["required"]["image"][0] = list(load_image_choices or [])
    return info


def submit(capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str],
           workflow: dict[str, Any] | None = None, info: dict[str, Any] | None = None) -> tuple[int, str, list[str]]:
    """``comfysup submit jobs.jsonl`` on a queue where runner gpu0 recorded ``info``: (exit code, stdout, the
    problem lines of stderr)."""
    config = write_config(tmp_path)
    queue = SQLiteQueue(db_path(tmp_path))
    queue.fleet.record_catalogue("gpu0", "host", info or catalogue())
    queue.close()
    write_jobs(tmp_path, lines, workflow=workflow)
    code, out, err = cli(capsys, "submit", "--config", str(config), "jobs.jsonl")
    assert "Traceback" not in err
    return code, out, [x for x in err.splitlines() if x.startswith("jobs.jsonl:")] + \
        [x for x in err.splitlines() if "nothing was submitted" in x]


def test_every_problem_of_a_line_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A bad priority, a set key that names no input and two values out of bounds: four problems, one line each,
    in the order of the line's checks; before, only the first was said and the next submit found the next."""
    bad = line(1, priority="high", set={"1.colour": 5, "1.width": 0, "1.height": 99999})
    code, out, problems = submit(capsys, tmp_path, [line(0), bad])
    assert code == 2
    assert problems == [
        "jobs.jsonl:2: priority 'high' is not a whole number",
        "jobs.jsonl:2: set key '1.colour': node 1 (EmptyImage) has no input 'colour' (inputs: batch_size, color, "
        "height, width); did you mean 'color'?",
        "jobs.jsonl:2: node 1 (EmptyImage): width 0 is below its minimum 1",
        "jobs.jsonl:2: node 1 (EmptyImage): height 99999 is above its maximum 16384",
        "comfysup submit: 4 problem(s) in jobs.jsonl; nothing was submitted",
    ]
    assert "submitted" not in out
    assert count_jobs(tmp_path) == 0


def test_a_line_with_very_many_problems_says_how_many_more(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    many = {str(n): {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1, "color": 0}}
            for n in range(1, 31)}
    workflow = {**many, "99": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}
    code, _out, problems = submit(capsys, tmp_path, [line(1, set={})], workflow)
    assert code == 2
    assert problems[:2] == ["jobs.jsonl:1: node 1 (EmptyImage): width 0 is below its minimum 1",
                            "jobs.jsonl:1: node 2 (EmptyImage): width 0 is below its minimum 1"]
    assert problems[18] == "jobs.jsonl:1: node 19 (EmptyImage): width 0 is below its minimum 1"
    assert problems[19:] == ["jobs.jsonl:1: … and 11 more problem(s) on this line not shown",
                             "comfysup submit: 30 problem(s) in jobs.jsonl; nothing was submitted"]


def test_a_class_typo_gets_did_you_mean(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    typo = {**TRIVIAL, "2": {"class_type": "ImageInvrt", "inputs": {"image": ["1", 0]}}}
    code, _out, problems = submit(capsys, tmp_path, [line(1)], typo)
    assert code == 2
    assert problems[0] == ("jobs.jsonl:1: node 2: class 'ImageInvrt' is on no server (its custom node is not "
                           "installed on any); did you mean 'ImageInvert'?")


def test_an_input_name_typo_gets_did_you_mean(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _out, problems = submit(capsys, tmp_path, [line(1, set={"4.ckpt_nam": CHECKPOINTS[1]})], WITH_CHECKPOINT)
    assert code == 2
    assert problems[0] == ("jobs.jsonl:1: set key '4.ckpt_nam': node 4 (CheckpointLoaderSimple) has no input "
                           "'ckpt_nam' (inputs: ckpt_name); did you mean 'ckpt_name'?")


def test_a_combo_typo_gets_did_you_mean(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = [line(1, set={"4.ckpt_name": "v1-5-pruned-emaonly.safetensor"}),
             line(2, set={"4.ckpt_name": "sdxl.safetensors"})]
    code, _out, problems = submit(capsys, tmp_path, lines, WITH_CHECKPOINT)
    assert code == 2
    known = "dreamshaper_8.safetensors, sd_xl_base_1.0.safetensors, v1-5-pruned-emaonly.safetensors"
    assert problems[:2] == [
        "jobs.jsonl:1: node 4 (CheckpointLoaderSimple): ckpt_name 'v1-5-pruned-emaonly.safetensor' is not on any "
        f"server (known: {known}); did you mean 'v1-5-pruned-emaonly.safetensors'?",
        # Not every .safetensors file is "close": the names are compared without their common extension.
        f"jobs.jsonl:2: node 4 (CheckpointLoaderSimple): ckpt_name 'sdxl.safetensors' is not on any server "
        f"(known: {known})"]


def test_a_value_that_is_not_a_number_says_an_int(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _out, problems = submit(capsys, tmp_path, [line(1, set={"1.width": "wide"})])
    assert code == 2
    assert problems[0] == "jobs.jsonl:1: node 1 (EmptyImage): width 'wide' is not an INT"


def test_a_value_where_only_a_link_can_go_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ImageInvert's image is another node's IMAGE output: ComfyUI takes "photo.png" there at POST and fails
    when it runs the node. In set it replaced the link; in the workflow it was written there."""
    in_workflow = {**TRIVIAL, "2": {"class_type": "ImageInvert", "inputs": {"image": 5}}}
    code, out, problems = submit(capsys, tmp_path, [line(1, set={"2.image": "photo.png"}),
                                                    line(2, workflow=in_workflow)])
    assert code == 2, out
    assert problems[:2] == [
        "jobs.jsonl:1: node 2 (ImageInvert): input 'image' takes a link to another node's IMAGE output, not a value "
        "('photo.png'); link it in the workflow, not in set",
        "jobs.jsonl:2: node 2 (ImageInvert): input 'image' takes a link to another node's IMAGE output, not a value "
        "(5); link it to a node's output: [\"<node id>\", <output index>]"]
    assert count_jobs(tmp_path) == 0


@pytest.mark.parametrize("choices", [[], ["comfysup/example.png"]], ids=["server-lists-none", "server-lists-others"])
def test_a_local_file_named_as_a_server_file_gets_the_file_hint(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                choices: list[str]) -> None:
    """LoadImage's image names a file in the server's input folder; photo.png is next to the jobs file and on no
    server, so the line meant to send it. A name that is neither is left to the server, as before."""
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    info = catalogue(choices)
    lines = [line(1, set={"1.image": "photo.png"})]
    code, _out, problems = submit(capsys, tmp_path, lines, LOAD_INVERT, info)
    assert code == 2
    known = ", ".join(choices) or "none"
    assert problems[0] == (f"jobs.jsonl:1: node 1 (LoadImage): image 'photo.png' is not on any server (known: "
                           f"{known}); to send this local file, write {{\"file\": \"photo.png\"}}")
    code, out, problems = submit(capsys, tmp_path, [line(1, set={"1.image": {"file": "photo.png"}})], LOAD_INVERT,
                                 info)
    assert (code, problems) == (0, []), problems
    assert "submitted 1 job(s)" in out


def test_the_command_itself_prints_each_problem(tmp_path: Path) -> None:
    """``python -m comfysup submit`` as typed: the same lines, exit code 2."""
    config = write_config(tmp_path)
    queue = SQLiteQueue(db_path(tmp_path))
    queue.fleet.record_catalogue("gpu0", "host", catalogue())
    queue.close()
    write_jobs(tmp_path, [json.dumps({"id": job_id(1), "workflow": "wf.json", "set": {"1.width": "wide",
                                                                                      "2.image": "photo.png"}})])
    done = run_cli("submit", "--config", str(config), "jobs.jsonl", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "jobs.jsonl:1: node 1 (EmptyImage): width 'wide' is not an INT",
        "jobs.jsonl:1: node 2 (ImageInvert): input 'image' takes a link to another node's IMAGE output, not a value "
        "('photo.png'); link it in the workflow, not in set",
        "comfysup submit: 2 problem(s) in jobs.jsonl; nothing was submitted"]
