"""Workflows as people bring them, through comfysup.jobs.JobsFile (every door's translation): UI-format files and
inline objects converted with the servers' catalogues, images ComfyUI saved, set keys by title or id path, the UI
workflow carried in extra_pnginfo, dynamic prompts chosen by job id, and the refusals, each naming what it is about.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from comfysup.jobs import JobsFile
from comfysup.jobs.catalogue import Catalogue
from comfysup.workflows import image

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
OBJECT_INFO = json.loads((RECORDED / "object-info.json").read_text())
NESTED = json.loads((RECORDED / "built-nested-subgraphs.json").read_text())
IMAGES = RECORDED / "images"


def jobs_of(tmp_path: Path, lines: list[dict[str, Any]], *, catalogues: bool = True,
            workflow: dict[str, Any] | None = None) -> tuple[JobsFile, Any]:
    (tmp_path / "ui.json").write_text(json.dumps(workflow or NESTED["workflow"]))
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = [Catalogue(1, OBJECT_INFO, ("cpu0@host",))] if catalogues else []
    jobs = JobsFile(path, catalogues=found)
    return jobs, jobs.validate()


def the_jobs(tmp_path: Path, lines: list[dict[str, Any]], **kw: Any) -> list[Any]:
    jobs, checked = jobs_of(tmp_path, lines, **kw)
    assert checked.ok, checked.problems
    return list(jobs.jobs())


def test_a_ui_file_runs_the_prompt_the_frontend_queues_with_its_workflow_in_extra_pnginfo(tmp_path: Path) -> None:
    [job] = the_jobs(tmp_path, [{"workflow": "ui.json", "extra_data": {"client": "x"}}])
    assert {k: (v["class_type"], v["inputs"]) for k, v in job.workflow.items()} == \
        {k: (v["class_type"], v["inputs"]) for k, v in NESTED["prompt"].items()}
    assert job.extra_data == {"client": "x", "extra_pnginfo": {"workflow": NESTED["workflow"]}}


def test_an_inline_ui_workflow_is_converted_too(tmp_path: Path) -> None:
    [job] = the_jobs(tmp_path, [{"workflow": NESTED["workflow"]}])
    assert job.workflow["57:212"]["inputs"]["seed"] == 777
    assert job.extra_data["extra_pnginfo"]["workflow"] == NESTED["workflow"]


def test_an_api_format_job_is_unchanged(tmp_path: Path) -> None:
    [job] = the_jobs(tmp_path, [{"workflow": NESTED["prompt"], "extra_data": {"a": 1}}])
    assert job.workflow == NESTED["prompt"] and job.extra_data == {"a": 1}


def test_set_keys_name_nodes_by_title_class_or_id_path_and_are_stored_by_id(tmp_path: Path) -> None:
    [job] = the_jobs(tmp_path, [{"workflow": "ui.json", "set": {
        "Positive Prompt.text": "a dog", "KSampler.seed": 42, "57:212.steps": 3, "2.width": 512}}])
    assert job.params == {"57:210:100.text": "a dog", "57:212.seed": 42, "57:212.steps": 3, "2.width": 512}
    assert job.workflow["57:210:100"]["inputs"]["text"] == "a dog"
    assert (job.workflow["57:212"]["inputs"]["seed"], job.workflow["57:212"]["inputs"]["steps"]) == (42, 3)


def test_an_unknown_or_ambiguous_name_is_refused_with_the_candidates(tmp_path: Path) -> None:
    _, checked = jobs_of(tmp_path, [{"workflow": "ui.json", "set": {
        "Positve Prompt.text": "x", "CLIPTextEncode.text": "y", "KSampler.sed": 1}}])
    messages = [(p.line, p.message) for p in checked.problems]
    assert messages[0] == (1, "set key 'Positve Prompt.text': no node is named 'Positve Prompt' (did you mean: "
                              "'Positive Prompt', 'Negative Prompt'?)")
    assert messages[1][1].startswith("set key 'CLIPTextEncode.text': 'CLIPTextEncode' names 2 nodes "
                                     "(57:210:100, 57:210:101)")
    assert "node 57:212 (KSampler) has no input 'sed'" in messages[2][1] and "seed" in messages[2][1]
    assert len(messages) == 3


def test_the_same_line_is_the_same_job_and_its_id_derives_from_the_ui_file(tmp_path: Path) -> None:
    line = {"workflow": "ui.json", "set": {"KSampler.seed": 1}}
    first = the_jobs(tmp_path, [line])[0]
    again = the_jobs(tmp_path, [line])[0]
    assert first.id == again.id and first.spec_hash == again.spec_hash
    changed = json.loads(json.dumps(NESTED["workflow"]))
    changed["extra"] = {**changed.get("extra", {}), "note": "saved again"}
    assert the_jobs(tmp_path, [line], workflow=changed)[0].id != first.id


def dynamic_workflow() -> dict[str, Any]:
    return json.loads(json.dumps(NESTED["workflow"]).replace('"a cat"', '"a {cat|dog|fox|owl|bee|elk}"'))


def test_dynamic_prompts_choose_by_job_id_the_same_again_and_each_job_its_own(tmp_path: Path) -> None:
    lines = [{"id": str(uuid.UUID(int=n)), "workflow": "ui.json"} for n in range(1, 9)]
    texts = [j.workflow["57:210:100"]["inputs"]["text"] for j in the_jobs(tmp_path, lines, workflow=dynamic_workflow())]
    again = [j.workflow["57:210:100"]["inputs"]["text"] for j in the_jobs(tmp_path, lines, workflow=dynamic_workflow())]
    assert texts == again
    assert all(t in {"a cat", "a dog", "a fox", "a owl", "a bee", "a elk"} for t in texts) and len(set(texts)) > 1
    [derived] = the_jobs(tmp_path, [{"workflow": dynamic_workflow()}])
    [derived_again] = the_jobs(tmp_path, [{"workflow": dynamic_workflow()}])
    assert derived.id == derived_again.id and derived.spec_hash == derived_again.spec_hash


def test_an_image_comfyui_saved_runs_its_prompt_again_with_set_applied(tmp_path: Path) -> None:
    for name in ("comfyui-saveimage.png", "comfyui-saveanimatedwebp.webp"):
        shutil.copy(IMAGES / name, tmp_path / name)
    posted = json.loads((IMAGES / "posted-prompt.json").read_text())
    png, webp = the_jobs(tmp_path, [{"workflow": "comfyui-saveimage.png", "set": {"Blank.width": 32}},
                                    {"workflow": "comfyui-saveanimatedwebp.webp"}])
    assert png.workflow == {**posted, "1": {**posted["1"], "inputs": {**posted["1"]["inputs"], "width": 32}}}
    assert png.params == {"1.width": 32}
    assert webp.workflow == posted
    assert png.extra_data["extra_pnginfo"]["workflow"] == image.read(IMAGES / "comfyui-saveimage.png").workflow


def test_a_ui_workflow_without_a_catalogue_is_refused_saying_how_to_convert_it(tmp_path: Path) -> None:
    _, checked = jobs_of(tmp_path, [{"workflow": "ui.json"}, {"workflow": NESTED["workflow"]}], catalogues=False)
    assert [p.line for p in checked.problems] == [1, 2]
    for problem in checked.problems:
        assert "is in ComfyUI's UI format; converting it needs the node catalogue (/object_info)" in problem.message
        assert "comfysup workflow convert FILE --object-info" in problem.message


def broken() -> dict[str, Any]:
    """The nested workflow with a custom node no server has, widget values of another version, a dangling link."""
    workflow = json.loads(json.dumps(NESTED["workflow"]))
    for node in workflow["nodes"]:
        if node["type"] == "VAEDecode":
            node.update(type="FancyDecode", title="My Decoder")
        if node["type"] == "EmptyLatentImage":
            node["widgets_values"] = ["wide", 512, 1]
    workflow["links"][0][1] = 999
    return workflow


@pytest.mark.parametrize("inline", [False, True], ids=["file", "inline"])
def test_every_problem_of_a_ui_workflow_is_refused_with_its_line(tmp_path: Path, inline: bool) -> None:
    line = {"workflow": broken() if inline else "ui.json"}
    _, checked = jobs_of(tmp_path, [{"workflow": NESTED["prompt"]}, line], workflow=broken())
    messages = [p.message for p in checked.problems]
    assert {p.line for p in checked.problems} == {2} and len(messages) == 3, messages
    assert any("node 58 'My Decoder' (FancyDecode): the node catalogue of cpu0@host has no node type 'FancyDecode'"
               in m for m in messages)
    assert any("node 2 (EmptyLatentImage): its saved widget values ['wide', 512, 1] do not fit the widgets the node "
               "catalogue of cpu0@host expects ['width', 'height', 'batch_size']" in m for m in messages)
    assert any("input 'model': its link 1 comes from node 999, which is not there" in m for m in messages)


def test_a_node_type_no_server_has_names_every_server(tmp_path: Path) -> None:
    workflow = json.loads(json.dumps(NESTED["workflow"]).replace('"VAEDecode"', '"FancyDecode"'))
    (tmp_path / "ui.json").write_text(json.dumps(workflow))
    path = tmp_path / "jobs.jsonl"
    path.write_text(json.dumps({"workflow": "ui.json"}) + "\n")
    found = [Catalogue(1, OBJECT_INFO, ("cpu0@a",)), Catalogue(2, OBJECT_INFO, ("gpu0@b", "gpu1@b"))]
    [problem] = JobsFile(path, catalogues=found).validate().problems
    assert problem.message.endswith("node 58 (FancyDecode): the node catalogue of every server (cpu0@a; gpu0@b, "
                                    "gpu1@b) has no node type 'FancyDecode' (a custom node that is not installed?)")
