"""Submit's checks against the node catalogues (comfysup.jobs.catalogue), each as a row of a table, and the
lines of a jobs file checked against two catalogues that differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_support import TRIVIAL, line, write_jobs

from comfysup.jobs import JobLineError, JobsFile
from comfysup.jobs.catalogue import Catalogue, TemplateCheck, check_node, refusal_text

CAT: dict[str, Any] = {
    "EmptyImage": {"input": {"required": {"width": ["INT", {"min": 1, "max": 16384}],
                                          "height": ["INT", {"min": 1, "max": 16384}],
                                          "batch_size": ["INT", {"min": 1, "max": 4096}],
                                          "color": ["INT", {"min": 0, "max": 16777215}]}}},
    "ImageInvert": {"input": {"required": {"image": ["IMAGE"]}}},
    "SaveImage": {"input": {"required": {"images": ["IMAGE"], "filename_prefix": ["STRING", {}]}},
                  "output_node": True},
    "CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [["a.safetensors", "b.safetensors"]]}}},
    "KSampler": {"input": {"required": {"denoise": ["FLOAT", {"min": 0.0, "max": 1.0}],
                                        "sampler_name": ["COMBO", {"options": ["euler", "dpm"]}]},
                           "optional": {"flag": ["BOOLEAN", {}]}}},
}


@pytest.mark.parametrize(("node", "kind", "text"), [
    ({"class_type": "Foo", "inputs": {}}, "missing_node_type", "class 'Foo' is not installed"),
    ({"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1}}, "required_input_missing",
     "required input 'color' is missing"),
    ({"class_type": "EmptyImage", "inputs": {"width": "wide", "height": 8, "batch_size": 1, "color": 0}},
     "invalid_input_type", "width 'wide' is not an INT"),
    ({"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1, "color": 0}},
     "value_smaller_than_min", "width 0 is below its minimum 1"),
    ({"class_type": "EmptyImage", "inputs": {"width": 8, "height": 99999, "batch_size": 1, "color": 0}},
     "value_bigger_than_max", "height 99999 is above its maximum 16384"),
    ({"class_type": "KSampler", "inputs": {"denoise": "x", "sampler_name": "euler"}}, "invalid_input_type",
     "denoise 'x' is not a FLOAT"),
    ({"class_type": "KSampler", "inputs": {"denoise": 1.5, "sampler_name": "euler"}}, "value_bigger_than_max",
     "denoise 1.5 is above its maximum 1.0"),
    ({"class_type": "KSampler", "inputs": {"denoise": 0.5, "sampler_name": "ddim"}}, "value_not_in_list",
     "sampler_name 'ddim' is not on this server"),
    ({"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}}, "value_not_in_list",
     "ckpt_name 'sdxl.safetensors' is not on this server"),
    ({"class_type": "EmptyImage", "inputs": {"width": {"__value__": 0}, "height": 8, "batch_size": 1, "color": 0}},
     "value_smaller_than_min", "width 0 is below its minimum 1"),
])
def test_each_check_refuses_as_comfyui_would(node: dict[str, Any], kind: str, text: str) -> None:
    issue = check_node("4", node, CAT)
    assert issue is not None
    assert (issue.kind, issue.text) == (kind, text)


@pytest.mark.parametrize("node", [
    {"class_type": "EmptyImage", "inputs": {"width": "8", "height": 8.7, "batch_size": True, "color": 0}},  # int()
    {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},  # a link: not a literal
    {"class_type": "KSampler", "inputs": {"denoise": 1, "sampler_name": "dpm", "flag": "anything"}},
    {"class_type": "KSampler", "inputs": {"denoise": 0.5, "sampler_name": "euler", "unknown_extra": 5}},
    {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": {"file": "x.safetensors"}}},  # uploaded
    {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": 12}},  # str() converts
])
def test_what_comfyui_accepts_passes(node: dict[str, Any]) -> None:
    assert check_node("4", node, CAT) is None


def test_an_empty_choice_list_is_not_held_against_a_job() -> None:
    cat = {"VAELoader": {"input": {"required": {"vae_name": [[]]}}}}
    assert check_node("1", {"class_type": "VAELoader", "inputs": {"vae_name": "v.pt"}}, cat) is None


def test_the_template_is_checked_once_and_only_changed_nodes_per_line() -> None:
    cats = {1: Catalogue(1, CAT, ("gpu0@a",))}
    check = TemplateCheck(TRIVIAL, cats)
    assert check.refusals({}) == {}
    bad = {"1": {**TRIVIAL["1"], "inputs": {**TRIVIAL["1"]["inputs"], "width": 0}}}
    assert check.refusals(bad)[1].kind == "value_smaller_than_min"


def test_the_reason_names_every_servers_choices_when_none_has_the_file() -> None:
    other = {**CAT, "CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [["c.safetensors"]]}}}}
    cats = {1: Catalogue(1, CAT, ("gpu0@a",)), 2: Catalogue(2, other, ("gpu0@b",))}
    node = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}}
    issues = {cid: check_node("4", node, c.info) for cid, c in cats.items()}
    assert refusal_text(issues, cats) == ("node 4 (CheckpointLoaderSimple): ckpt_name 'sdxl.safetensors' is not on "
                                         "any server (known: a.safetensors, b.safetensors, c.safetensors)")
    missing = {cid: check_node("2", {"class_type": "Foo", "inputs": {}}, c.info) for cid, c in cats.items()}
    assert refusal_text(missing, cats) == ("node 2: class 'Foo' is on no server (its custom node is not installed "
                                          "on any)")


def _two(tmp_path: Path, lines: list[str]) -> tuple[JobsFile, list[Catalogue]]:
    with_blur = {**CAT, "ImageBlur": {"input": {"required": {"image": ["IMAGE"]}}}}
    cats = [Catalogue(1, CAT, ("gpu0@a",)), Catalogue(2, with_blur, ("gpu1@a",))]
    return JobsFile(write_jobs(tmp_path, lines), catalogues=cats), cats


def test_a_line_only_one_catalogue_can_run_keeps_the_others_refusal(tmp_path: Path) -> None:
    blur = {**TRIVIAL, "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0]}}}
    jobs, _ = _two(tmp_path, [line(1), line(2, workflow=blur)])
    assert jobs.validate().ok
    plain, blurred = jobs.jobs()
    assert plain.refused == ()
    assert blurred.refused == ((1, "node 2 (ImageBlur): class 'ImageBlur' is not installed"),)


def test_a_line_no_catalogue_can_run_is_a_problem(tmp_path: Path) -> None:
    jobs, _ = _two(tmp_path, [line(1, set={"1.width": 0}), line(2, set={"1.color": 5})])
    checked = jobs.validate()
    assert [(p.line, p.message) for p in checked.problems] == [
        (1, "node 1 (EmptyImage): width 0 is below its minimum 1")]
    with pytest.raises(JobLineError):
        jobs.parse(line(3, set={"1.width": 0}).encode(), check=True)
