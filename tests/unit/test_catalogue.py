"""Submit's checks against the node catalogues (comfysup.jobs.catalogue), each as a row of a table, and the
lines of a jobs file checked against two catalogues that differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_support import TRIVIAL, line, write_jobs

from comfysup.jobs import JobLineError, JobsFile
from comfysup.jobs.catalogue import Catalogue, TemplateCheck, check_node, node_issues, refusal_text, refusal_texts
from comfysup.jobs.values import article, did_you_mean

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


@pytest.mark.timeout(10)
def test_every_issue_of_a_node_is_found_in_its_order() -> None:
    node = {"class_type": "EmptyImage", "inputs": {"width": "wide", "colour": 5, "height": 0, "batch_size": 1}}
    assert [(i.input, i.kind, i.text) for i in node_issues("1", node, CAT)] == [
        ("color", "required_input_missing", "required input 'color' is missing (the node has 'colour': a typo of "
                                            "'color'?)"),
        ("width", "invalid_input_type", "width 'wide' is not an INT"),
        ("height", "value_smaller_than_min", "height 0 is below its minimum 1")]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("kind", "refused"), [("IMAGE", True), ("LATENT", True), ("CONDITIONING", True),
                                               ("LOAD_3D", False), ("*", False), ("MY_WIDGET", False)])
def test_a_value_for_a_link_only_type_is_refused_and_other_types_are_not_judged(kind: str, refused: bool) -> None:
    cat = {"Node": {"input": {"required": {"x": [kind, {}]}}}}
    issue = check_node("1", {"class_type": "Node", "inputs": {"x": "photo.png"}}, cat)
    assert (issue is not None) == refused
    if refused:
        assert issue is not None and issue.kind == "link_only"
        assert issue.text == f"input 'x' takes a link to another node's {kind} output, not a value ('photo.png')"
    assert check_node("1", {"class_type": "Node", "inputs": {"x": ["2", 0]}}, cat) is None


@pytest.mark.timeout(10)
def test_a_local_file_named_for_a_file_input_is_refused_with_the_hint_even_when_the_server_lists_none() -> None:
    cat = {"LoadImage": {"input": {"required": {"image": [[], {"image_upload": True}]}}},
           "VAELoader": {"input": {"required": {"vae_name": [[]]}}}}
    here = {"photo.png", "v.pt"}.__contains__
    check = TemplateCheck({"1": {"class_type": "LoadImage", "inputs": {"image": "photo.png"}},
                           "2": {"class_type": "VAELoader", "inputs": {"vae_name": "v.pt"}}},
                          {1: Catalogue(1, cat)}, local=here)
    [issue] = check.all_refusals({})[1]
    assert (issue.node_id, issue.local) == ("1", True)
    assert issue.text == ("image 'photo.png' is not on this server; to send this local file, write "
                          '{"file": "photo.png"}')
    assert TemplateCheck({"1": {"class_type": "LoadImage", "inputs": {"image": "elsewhere.png"}}},
                         {1: Catalogue(1, cat)}, local=here).all_refusals({}) == {}


@pytest.mark.timeout(10)
def test_problems_every_server_has_are_worded_once_and_the_rest_server_by_server() -> None:
    other = {**CAT, "CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [["c.safetensors"]]}}}}
    cats = {1: Catalogue(1, CAT, ("gpu0@a",)), 2: Catalogue(2, other, ("gpu0@b",))}
    workflow = {"1": {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1, "color": 0}},
                "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "c.safetensors"}},
                "5": {"class_type": "KSamplr", "inputs": {}}}
    found = {cid: [i for n in sorted(workflow) for i in node_issues(n, workflow[n], c.info)] for cid, c in cats.items()}
    assert refusal_texts(found, cats) == [
        "node 1 (EmptyImage): width 0 is below its minimum 1",
        "node 5: class 'KSamplr' is on no server (its custom node is not installed on any); did you mean 'KSampler'?"]
    found[2].append(node_issues("6", {"class_type": "ImageInvert", "inputs": {"image": 1}}, other)[0])
    assert refusal_texts(found, cats)[2:] == [
        "no server can run it: gpu0@a: node 4 (CheckpointLoaderSimple) ckpt_name 'c.safetensors' is not on this "
        "server; gpu0@b: node 6 (ImageInvert) input 'image' takes a link to another node's IMAGE output, not a value "
        "(1)"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("word", "candidates", "said"), [
    ("colour", ["color", "width"], "did you mean 'color'?"),
    ("Euler", ["euler", "dpm_2"], "did you mean 'euler'?"),
    ("v1-5-pruned.safetensors", ["sd/v1-5-pruned.safetensors", "x.ckpt"], "did you mean 'sd/v1-5-pruned.safetensors'?"),
    ("sdxl.safetensors", ["a.safetensors", "b.safetensors"], ""),  # the extension alone is no likeness
    ("SavImage", ["SaveImage", "LoadImage", "ImageBlur"], "did you mean 'SaveImage'?"),  # not the far ones too
    ("width", ["width"], ""),
    (5, ["5"], ""),
])
def test_did_you_mean(word: object, candidates: list[str], said: str) -> None:
    assert did_you_mean(word, candidates) == said


@pytest.mark.timeout(10)
def test_a_and_an() -> None:
    assert [article(t) for t in ("INT", "FLOAT", "IMAGE", "UPSCALE_MODEL", "STRING")] == [
        "an INT", "a FLOAT", "an IMAGE", "an UPSCALE_MODEL", "a STRING"]
