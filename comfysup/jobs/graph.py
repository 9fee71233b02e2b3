"""A workflow's graph, checked as ComfyUI checks it at POST /prompt: links to existing nodes and outputs, no
cycles, an output node; and the node catalogue (/object_info) those checks use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from comfysup.jobs.values import JobLineError, did_you_mean

# ComfyUI's built-in nodes with OUTPUT_NODE = True: a prompt without one of these (or a custom output
# node) is refused with prompt_no_outputs.
BUILTIN_OUTPUT_NODES = frozenset({
    "SaveImage", "PreviewImage", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveLatent", "SaveAudio",
    "SaveAudioMP3", "SaveAudioOpus", "PreviewAudio", "SaveVideo", "SaveWEBM", "SaveGLB", "Preview3D",
    "Preview3DAnimation", "PreviewAny", "CheckpointSave", "CLIPSave", "VAESave", "ModelSave", "LoraSave",
    "SaveSVGNode", "ImageAddNoise_Save", "SaveImageWebsocket", "ETN_SendImageWebSocket",
})
# Built-in classes that are known not to be output nodes, so "no output node" can be an error rather than
# a warning when a workflow uses only these.
BUILTIN_OTHER_NODES = frozenset({
    "EmptyImage", "ImageInvert", "ImageBlur", "ImageToMask", "MaskToImage", "LoadImage", "ImageScale",
    "ImageScaleBy", "ImageSharpen", "ImageBatch", "ImagePadForOutpaint", "ImageCrop", "SolidMask",
    "CheckpointLoaderSimple", "CheckpointLoader", "UNETLoader", "CLIPLoader", "DualCLIPLoader",
    "VAELoader", "LoraLoader", "LoraLoaderModelOnly", "ControlNetLoader", "CLIPTextEncode", "KSampler",
    "KSamplerAdvanced", "EmptyLatentImage", "VAEDecode", "VAEEncode", "LatentUpscale", "ConditioningCombine",
    "ControlNetApply", "ControlNetApplyAdvanced", "CLIPSetLastLayer", "UpscaleModelLoader",
    "ImageUpscaleWithModel", "PrimitiveNode",
})


class ObjectInfo:
    """What is known of node classes: ComfyUI's /object_info when a cached copy exists, else built-ins."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data = data or {}

    @classmethod
    def load(cls, path: Path | None) -> ObjectInfo:
        if path is not None and path.is_file():
            try:
                return cls(json.loads(path.read_text()))
            except (OSError, ValueError):
                return cls()
        return cls()

    def is_output(self, class_type: str) -> bool | None:
        """True/False when known, None when this class is unknown here."""
        if class_type in self.data:
            return bool(self.data[class_type].get("output_node"))
        if class_type in BUILTIN_OUTPUT_NODES:
            return True
        if class_type in BUILTIN_OTHER_NODES:
            return False
        return None

    def inputs(self, class_type: str) -> set[str] | None:
        info = self.data.get(class_type)
        if not info:
            return None
        spec = info.get("input", {})
        return set(spec.get("required", {})) | set(spec.get("optional", {}))


def check_api_format(workflow: Any, where: str) -> None:
    if not isinstance(workflow, dict):
        raise JobLineError(f"{where} is not an API-format workflow (expected an object of nodes)")
    if "nodes" in workflow and "links" in workflow:
        raise JobLineError(f"{where} is in ComfyUI's UI format (it has 'nodes' and 'links'); export it in "
                           "API format: in ComfyUI, Workflow > Export (API), or with the dev mode setting "
                           "on, 'Save (API Format)'")
    if not workflow:
        raise JobLineError(f"{where} has no nodes")
    for node_id, node in workflow.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str) \
                or not isinstance(node.get("inputs", {}), dict):
            raise JobLineError(f"{where}: node {node_id!r} is not an API-format node "
                               "(expected {\"class_type\": ..., \"inputs\": {...}})")


def is_link(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and not isinstance(value[1], bool))


def check_graph(workflow: dict[str, Any], object_info: ObjectInfo) -> list[str]:
    """Raise on a broken graph (dangling link, cycle, no output node); return warnings."""
    edges: dict[str, list[str]] = {}
    for node_id, node in workflow.items():
        edges[node_id] = []
        for name, value in node.get("inputs", {}).items():
            if is_link(value):
                if value[0] not in workflow:
                    raise JobLineError(f"node {node_id} ({node['class_type']}) input {name!r} links to node "
                                       f"{value[0]!r}, which is not in the workflow")
                edges[node_id].append(value[0])
    cycle = _find_cycle(edges)
    if cycle:
        named = " -> ".join(f"{n} ({workflow[n]['class_type']})" for n in cycle)
        raise JobLineError(f"the workflow has a cycle: {named}")
    kinds = {node_id: object_info.is_output(node["class_type"]) for node_id, node in workflow.items()}
    if any(kinds.values()):
        return []
    unknown = sorted({workflow[n]["class_type"] for n, k in kinds.items() if k is None})
    if not unknown:
        raise JobLineError("the workflow has no output node (such as SaveImage or PreviewImage); "
                           "ComfyUI would refuse it with prompt_no_outputs")
    return [f"no known output node; {', '.join(unknown)} unknown here (once a server has run, its runner records "
            "its /object_info in the queue); ComfyUI refuses the job if none of them is an output node"]


def _find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """An iterative depth-first search: a workflow can be deep enough to overflow recursion."""
    state: dict[str, int] = {}
    for start in edges:
        if state.get(start):
            continue
        stack = [(start, iter(edges[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                if state.get(child) == 1:
                    return [*path[path.index(child):], child]
                if not state.get(child):
                    state[child] = 1
                    stack.append((child, iter(edges.get(child, []))))
                    path.append(child)
                    break
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    return None


def apply_set(workflow: dict[str, Any], overrides: Any, object_info: ObjectInfo,
              problems: list[str] | None = None) -> dict[str, Any]:
    """The nodes that ``"<node>.<input>": value`` overrides change, as copies; ``workflow`` is left as it is
    (it may be a template shared by many lines). The node and the input must exist: each key that names none
    is added to ``problems`` and the others applied, or without ``problems``, JobLineError with every one."""
    if not isinstance(overrides, dict):
        raise JobLineError(f"set must be an object of \"<node>.<input>\": value, not {type(overrides).__name__}")
    found: list[str] = [] if problems is None else problems
    changed: dict[str, Any] = {}
    for key, value in overrides.items():
        problem = _set_problem(key, workflow, changed, object_info)
        if problem:
            found.append(problem)
            continue
        node_id, _, name = key.rpartition(".")
        node = changed.get(node_id)
        if node is None:
            original = workflow[node_id]
            node = changed[node_id] = {**original, "inputs": dict(original.get("inputs", {}))}
        node["inputs"][name] = value
    if problems is None and found:
        raise JobLineError(*found)
    return changed


def _set_problem(key: str, workflow: dict[str, Any], changed: dict[str, Any], object_info: ObjectInfo) -> str:
    """Why ``set`` key ``"<node>.<input>"`` names no input of the workflow (its node as ``changed`` has it), or ""."""
    node_id, dot, name = key.rpartition(".")
    if not dot or not node_id or not name:
        return f"set key {key!r} is not \"<node>.<input>\" (for example \"3.seed\")"
    node = changed.get(node_id) or workflow.get(node_id)
    if node is None:
        return (f"set key {key!r} names node {node_id!r}, which is not in the workflow "
                f"(nodes: {', '.join(sorted(workflow)[:20])})")
    inputs = node.get("inputs", {})
    allowed = None if name in inputs else object_info.inputs(node["class_type"])
    if name in inputs or (allowed is not None and name in allowed):
        return ""
    names = set(inputs) | (allowed or set())
    hint = did_you_mean(name, names)
    return (f"set key {key!r}: node {node_id} ({node['class_type']}) has no input {name!r} "
            f"(inputs: {', '.join(sorted(names)[:30]) or 'none'})" + (f"; {hint}" if hint else ""))
