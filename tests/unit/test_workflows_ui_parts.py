"""comfysup.workflows' UI-format pieces as tables: refusals, limits, image metadata, names and settable inputs."""

from __future__ import annotations

import copy
import io
import json
import struct
import zlib
from pathlib import Path

import pytest

from comfysup.workflows import catalogue, graph, image, names
from comfysup.workflows.errors import UIWorkflowError
from comfysup.workflows.ui import is_ui_workflow, to_prompt
from tests.ui_reference import cases

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
OBJECT_INFO = json.loads((RECORDED / "object-info.json").read_text())
IMAGES = RECORDED / "images"


def convert(workflow):
    return to_prompt(workflow, OBJECT_INFO, catalogue_name="server gpu0's catalogue", choose=lambda o: o[0])


def test_ui_and_api_formats_are_told_apart() -> None:
    assert is_ui_workflow(cases.mute_and_bypass())
    assert not is_ui_workflow({"3": {"class_type": "KSampler", "inputs": {}}})


def test_an_unknown_node_type_names_the_node_and_the_catalogue() -> None:
    workflow = cases.mute_and_bypass()
    workflow["nodes"][0]["type"] = "CheckpointLoaderGGUF"
    with pytest.raises(UIWorkflowError) as refused:
        convert(workflow)
    assert "node 1 'Load Checkpoint' (CheckpointLoaderGGUF)" in str(refused.value)
    assert "server gpu0's catalogue has no node type 'CheckpointLoaderGGUF'" in str(refused.value)


def test_a_group_node_without_its_definition_is_refused_with_what_to_do() -> None:
    workflow = cases.group_node()
    del workflow["extra"]["groupNodes"]
    with pytest.raises(UIWorkflowError, match="node 30 \\(workflow>Sampling\\): a group node whose definition is not"):
        convert(workflow)


def test_saved_values_that_do_not_fit_name_the_widgets_expected() -> None:
    workflow = cases.mute_and_bypass()
    workflow["nodes"][3]["widgets_values"] = ["512", 512, 1]
    with pytest.raises(UIWorkflowError, match=r"node 4 \(EmptyLatentImage\): its saved widget values \['512', 512, 1\]"
                                              r" do not fit .*\['width', 'height', 'batch_size'\]"):
        convert(workflow)


def test_a_link_to_a_missing_node_names_both_ends_and_every_problem_is_listed() -> None:
    workflow = cases.mute_and_bypass()
    workflow["links"][0][1] = 999
    workflow["nodes"][1]["inputs"][0]["link"] = 4242
    with pytest.raises(UIWorkflowError) as refused:
        convert(workflow)
    assert len(refused.value.problems) == 2
    assert "node 8 (LoraLoader) input 'model': its link 1 comes from node 999, which is not there" in str(refused.value)
    assert "input 'clip': its link 4242 is not in the workflow's links" in str(refused.value)


def test_a_subgraph_that_contains_itself_is_refused() -> None:
    workflow = cases.nested_subgraphs()
    prompts = workflow["definitions"]["subgraphs"][1]
    prompts["nodes"].append({**copy.deepcopy(prompts["nodes"][0]), "id": 150, "type": prompts["id"], "inputs": []})
    with pytest.raises(UIWorkflowError, match="subgraph 'Prompts' contains itself"):
        convert(workflow)


def test_where_the_frontend_throws_links_are_followed_as_elsewhere() -> None:
    """A PrimitiveNode inside a subgraph, and a subgraph input wired straight to one of its outputs."""
    workflow = cases.nested_subgraphs()
    sampler = workflow["definitions"]["subgraphs"][0]
    sampler["nodes"].append({"id": 299, "type": "PrimitiveNode", "mode": 0, "inputs": [], "widgets_values": [8],
                             "outputs": [{"name": "INT", "type": "INT", "links": [699], "widget": {"name": "steps"}}]})
    ksampler = next(node for node in sampler["nodes"] if node["type"] == "KSampler")
    ksampler["inputs"].append({"name": "steps", "type": "INT", "widget": {"name": "steps"}, "link": 699})
    sampler["links"].append({"id": 699, "origin_id": 299, "origin_slot": 0, "target_id": ksampler["id"],
                             "target_slot": 5, "type": "INT"})
    sampler["outputs"].append({"id": "latent-again", "name": "latent", "type": "LATENT", "linkIds": [698]})
    sampler["links"].append({"id": 698, "origin_id": -10, "origin_slot": 2, "target_id": -20, "target_slot": 1,
                             "type": "LATENT"})
    outer = next(node for node in workflow["nodes"] if node["id"] == 57)
    outer["outputs"].append({"name": "latent", "type": "LATENT", "links": [20]})
    decode = next(node for node in workflow["nodes"] if node["type"] == "VAEDecode")
    decode["inputs"][0]["link"] = 20
    workflow["links"].append([20, 57, 1, decode["id"], 0, "LATENT"])
    prompt = convert(workflow)
    assert prompt["57:212"]["inputs"]["steps"] == 8
    assert prompt[str(decode["id"])]["inputs"]["samples"] == ["2", 0]


def test_nesting_depth_and_node_count_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(graph, "MAX_DEPTH", 1)
    with pytest.raises(UIWorkflowError, match="nested more than 1 deep"):
        convert(cases.nested_subgraphs())
    monkeypatch.setattr(graph, "MAX_DEPTH", 16)
    monkeypatch.setattr(graph, "MAX_NODES", 5)
    with pytest.raises(UIWorkflowError, match="more than 5 nodes"):
        convert(cases.nested_subgraphs())


@pytest.mark.parametrize(("text", "expected"), [
    ("a {red|blue} bottle // comment", "a red bottle "),
    ("{a|{b|c}} /* gone */x", "a x"),
    (r"keep \{this|that\}", r"keep \{this|that\}"),
    ("no choices", "no choices"),
])
def test_dynamic_prompts_are_read_as_the_frontend_reads_them(text: str, expected: str) -> None:
    assert catalogue.dynamic_prompt(text, lambda options: options[0]) == expected


@pytest.mark.parametrize("name", ["comfyui-saveimage.png", "comfyui-saveanimatedwebp.webp"])
def test_the_workflows_comfyui_saved_into_its_images_are_read(name: str) -> None:
    found = image.read(IMAGES / name)
    assert found.prompt == json.loads((IMAGES / "posted-prompt.json").read_text())
    assert found.workflow == json.loads((IMAGES / "posted-workflow.json").read_text())


def _png(*chunks: tuple[bytes, bytes]) -> bytes:
    body = b"".join(struct.pack(">I4s", len(data), kind) + data + b"\0\0\0\0" for kind, data in chunks)
    return image.PNG_SIGNATURE + body + struct.pack(">I4s", 0, b"IEND") + b"\0\0\0\0"


def test_compressed_and_international_text_chunks_are_read() -> None:
    prompt = json.dumps({"1": {"class_type": "X", "inputs": {"text": "café"}}})
    itxt = b"prompt\0\x01\0\0\0" + zlib.compress(prompt.encode())
    ztxt = b"workflow\0\0" + zlib.compress(b'{"nodes": []}')
    found = image.read_from(io.BytesIO(_png((b"IDAT", b"\0" * 10), (b"iTXt", itxt), (b"zTXt", ztxt))))
    assert found.prompt == json.loads(prompt)
    assert found.workflow == {"nodes": []}


def test_reads_are_bounded_and_other_files_refused(monkeypatch) -> None:
    monkeypatch.setattr(image, "MAX_TEXT_BYTES", 100)
    with pytest.raises(UIWorkflowError, match="a metadata chunk of 200 bytes"):
        image.read_from(io.BytesIO(_png((b"tEXt", b"prompt\0" + b"x" * 193))))
    bomb = b"prompt\0\0" + zlib.compress(b" " * 10_000)
    with pytest.raises(UIWorkflowError, match="inflates past 100 bytes"):
        image.read_from(io.BytesIO(_png((b"zTXt", bomb))))
    with pytest.raises(UIWorkflowError, match="not a PNG or WEBP image"):
        image.read_from(io.BytesIO(b"GIF89a......"))


NESTED = json.loads((RECORDED / "built-nested-subgraphs.json").read_text())["prompt"]


@pytest.mark.parametrize(("key", "expected"), [
    ("57:212.seed", ("57:212", "seed")),
    ("Positive Prompt.text", ("57:210:100", "text")),
    ("KSampler.seed", ("57:212", "seed")),
    ("2.width", ("2", "width")),
])
def test_set_keys_name_nodes_by_id_path_title_or_class(key: str, expected: tuple[str, str]) -> None:
    assert names.resolve(NESTED, key) == expected


@pytest.mark.parametrize(("key", "message"), [
    ("Positive Promt.text", "no node is named 'Positive Promt' (did you mean: 'Positive Prompt'"),
    ("KSampler.sed", "node 57:212 (KSampler) has no input 'sed' (did you mean: 'seed'"),
    ("CLIPTextEncode.text", "'CLIPTextEncode' names 2 nodes (57:210:100, 57:210:101)"),
    ("seed", "is not NODE.INPUT"),
])
def test_unknown_or_ambiguous_names_list_the_candidates(key: str, message: str) -> None:
    with pytest.raises(names.ParameterNameError) as refused:
        names.resolve(NESTED, key)
    assert message in str(refused.value)


def test_settable_lists_values_with_types_ranges_and_choices() -> None:
    listed = {(p.node_id, p.input): p for p in names.settable(NESTED, OBJECT_INFO)}
    seed = listed["57:212", "seed"]
    assert (seed.title, seed.class_type, seed.value, seed.type, seed.minimum) == ("KSampler", "KSampler", 777, "INT", 0)
    assert "karras" in listed["57:212", "scheduler"].choices
    assert ("57:212", "model") not in listed
