"""A UI-format ("litegraph") workflow as the API prompt that ComfyUI's frontend queues for it.

``to_prompt(workflow, object_info)`` gives what the frontend's ``app.graphToPrompt()`` gives after
``app.loadGraphData(workflow)``: ``{node_id: {"class_type", "inputs", "_meta": {"title"}}}``. Widget values
are named by the catalogue's input order (``catalogue.widget_layout``); values the frontend adds that are no
inputs (``control_after_generate``, upload buttons) are left out; a linked input takes its link. Reroute
nodes and native reroutes pass their link through, a PrimitiveNode's value takes the place of its link,
Note and MarkdownNote are dropped, muted nodes (mode 2) are left out with the inputs they fed, and a
bypassed node (mode 4) hands on what feeds its input of the requested type (its input at the same slot
first, then its first input of that type). Subgraphs are expanded with the frontend's ``outer:inner`` ids
(``graph.Flattener``), and legacy group nodes (``extra.groupNodes``) with the frontend's ``group:index`` ids
(``groupnodes``).

A widget with ``dynamicPrompts`` gets what the frontend sends: comments removed and one option of each
``{a|b}`` chosen at random (``catalogue.dynamic_prompt``). Values that only the frontend's own extensions
add (inputs the catalogue does not declare, such as ``LoadImageOutput``'s ``refresh``) are not produced:
ComfyUI ignores inputs a node does not declare. Problems (unknown node types, saved values that do not fit
the catalogue, links to nothing) are collected and raised together as ``UIWorkflowError``. Where the
frontend's own conversion throws (frontend 1.27.10: a PrimitiveNode inside a subgraph, a subgraph input wired
straight to an output), links are followed as everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comfysup.workflows import catalogue, graph, groupnodes
from comfysup.workflows.errors import UIWorkflowError
from comfysup.workflows.graph import Item, Value

VIRTUAL_TYPES = frozenset({"Note", "MarkdownNote", "PrimitiveNode", "Reroute"})
"""Nodes of the frontend alone: never queued."""
MUTED, BYPASSED = 2, 4
_MAX_HOPS = 10_000

Choose = Callable[[Sequence[str]], str]


def is_ui_workflow(workflow: Any) -> bool:
    """Whether a parsed workflow is in the UI format (a ``nodes`` list) rather than the API format."""
    return isinstance(workflow, dict) and isinstance(workflow.get("nodes"), list)


def to_prompt(workflow: Mapping[str, Any], object_info: Mapping[str, Any], *,
              catalogue_name: str = "the node catalogue", choose: Choose | None = None) -> dict[str, dict[str, Any]]:
    """The API prompt of a UI workflow; raises ``UIWorkflowError`` listing every problem found."""
    flat = graph.Flattener(workflow, object_info)
    converter = _Converter(flat.items, object_info, choose, catalogue_name)
    prompt = converter.convert()
    problems = flat.problems + converter.problems
    if problems:
        raise UIWorkflowError(problems)
    return prompt


class _Converter:
    def __init__(self, items: Mapping[str, Item], object_info: Mapping[str, Any], choose: Choose | None,
                 catalogue_name: str) -> None:
        self.items = items
        self.object_info = object_info
        self.choose = choose
        self.catalogue_name = catalogue_name
        self.problems: list[str] = []

    def convert(self) -> dict[str, dict[str, Any]]:
        prompt = {}
        for item in self.items.values():
            if item.kind != "node" or item.type in VIRTUAL_TYPES or item.mode in (MUTED, BYPASSED):
                continue
            spec = self.object_info.get(item.type)
            if not isinstance(spec, dict):
                self.problems.append(self._unknown(item))
                continue
            inputs = self._widget_inputs(item, spec)
            inputs.update(self._linked_inputs(item))
            prompt[item.id] = {"inputs": inputs, "class_type": item.type,
                               "_meta": {"title": item.title or spec.get("display_name") or item.type}}
        _drop_links_to_missing(prompt)
        return prompt

    def _unknown(self, item: Item) -> str:
        if groupnodes.group_name(item.type) is not None:
            return (f"{_name(item)}: a group node whose definition is not in the workflow's extra.groupNodes"
                    " (in ComfyUI, convert it to a subgraph and save the workflow again)")
        return (f"{_name(item)}: {self.catalogue_name} has no node type {item.type!r}"
                " (a custom node that is not installed?)")

    def _widget_inputs(self, item: Item, spec: Mapping[str, Any]) -> dict[str, Any]:
        layout = catalogue.widget_layout(spec)
        values = saved_values(item.widgets_values, layout)
        self._check_fit(item, layout, values)
        inputs = {}
        for index, widget in enumerate(layout):
            if not widget.input:
                continue
            value = values[index] if index < len(values) else widget.default
            if widget.options.get("dynamicPrompts") and isinstance(value, str):
                value = catalogue.dynamic_prompt(value, self.choose) if self.choose else catalogue.dynamic_prompt(value)
            inputs[widget.name] = _wrapped(value)
        return inputs

    def _check_fit(self, item: Item, layout: list[catalogue.Widget], values: list[Any]) -> None:
        misfits = [widget.name for widget, value in zip(layout, values, strict=False)
                   if not catalogue.fits(widget, value)]
        if misfits:
            expected = [widget.name for widget in layout]
            self.problems.append(f"{_name(item)}: its saved widget values {values!r} do not fit the widgets"
                                 f" {self.catalogue_name} expects {expected} (first misfit: {misfits[0]})")

    def _linked_inputs(self, item: Item) -> dict[str, Any]:
        linked = {}
        for slot in item.inputs:
            if slot.source is None:
                continue
            resolved = self.resolve(slot.source, slot.type)
            if isinstance(resolved, Value):
                linked[slot.name] = _wrapped(resolved.value)
            elif resolved is not None:
                linked[slot.name] = [resolved[0], resolved[1]]
        return linked

    def resolve(self, source: graph.Source, wanted: str) -> graph.Source:
        """Follow a source through reroutes, primitives, subgraph exits and bypassed nodes to a node or value."""
        for _ in range(_MAX_HOPS):
            if source is None or isinstance(source, Value):
                return source
            item = self.items.get(source[0])
            if item is None:
                return None
            step = _STEPS.get(item.type)
            if step is None and item.mode != BYPASSED:
                step = _STEPS.get(item.kind)
            if step is not None:
                source = step(item, source[1])
            elif item.mode == BYPASSED:
                source = _bypassed(item, source[1], wanted)
            else:
                return source
        return None


def _bypassed(item: Item, slot: int, wanted: str) -> graph.Source:
    """What a bypassed node hands on: what feeds its input of the wanted type, the same slot first."""
    order = [slot, *range(len(item.inputs))]
    match = next((index for index in order if 0 <= index < len(item.inputs) and item.inputs[index].type == wanted),
                 None)
    return None if match is None else item.inputs[match].source


def _through_reroute(item: Item, slot: int) -> graph.Source:
    return item.inputs[0].source if item.inputs else None


def _primitive(item: Item, slot: int) -> graph.Source:
    saved = item.widgets_values
    return Value(saved[0]) if isinstance(saved, list) and saved else None


def _exit(item: Item, slot: int) -> graph.Source:
    return item.exits[slot] if 0 <= slot < len(item.exits) else None


_STEPS: dict[str, Callable[[Item, int], graph.Source]] = {
    "Reroute": _through_reroute, "PrimitiveNode": _primitive, "exit": _exit}


def saved_values(saved: Any, layout: list[catalogue.Widget]) -> list[Any]:
    """A node's ``widgets_values`` as a list in layout order (some nodes save them by name)."""
    if isinstance(saved, dict):
        return [saved.get(widget.name, widget.default) for widget in layout]
    return list(saved) if isinstance(saved, list) else []


def _wrapped(value: Any) -> Any:
    """A list value travels as ``{"__value__": [...]}``: a bare two-item list would read as a link."""
    return {"__value__": value} if isinstance(value, list) else value


def _drop_links_to_missing(prompt: dict[str, dict[str, Any]]) -> None:
    """Inputs fed by a node that is not queued (muted, or dropped) are left out, as the frontend leaves them."""
    for node in prompt.values():
        inputs = node["inputs"]
        for name in [name for name, value in inputs.items() if isinstance(value, list) and len(value) == 2
                     and value[0] not in prompt]:
            del inputs[name]


def _name(item: Item) -> str:
    title = f" {item.title!r}" if item.title else ""
    return f"node {item.id}{title} ({item.type})"
