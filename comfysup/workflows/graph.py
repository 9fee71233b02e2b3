"""A UI-format workflow flattened: subgraphs expanded into one table of nodes with the frontend's ids.

A node inside a subgraph instance gets the id ``outer:inner`` (nested: ``a:b:c``), as the frontend's
execution ids. Links become sources, ``(item id, output slot)``; a link from a subgraph's input side is
bound to what feeds the instance's input outside (or the value of the instance's widget for it), and an
instance's outputs become an ``exit`` item whose slots name what feeds the subgraph's output side inside
(its inputs are the instance's own, for a bypassed instance). A muted or bypassed instance's inner nodes stay,
as the frontend keeps them.

The workflow is untrusted: nesting depth and the number of nodes are bounded, and a subgraph that contains
itself is refused. Nothing is executed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from comfysup.workflows import groupnodes
from comfysup.workflows.errors import UIWorkflowError

MAX_DEPTH = 16
"""Subgraphs inside subgraphs, at most; the frontend's own templates nest two deep."""
MAX_NODES = 10_000
"""Nodes after expansion, at most: a workflow of thousands of nodes is already far beyond a real one."""
SUBGRAPH_INPUT = -10
SUBGRAPH_OUTPUT = -20


class Value:
    """A constant that takes a link's place: a PrimitiveNode's value, or a subgraph instance's widget. Never a
    tuple, so that it is told from a link's ``(item id, slot)`` by its class.

    The records of this module are plain classes and named tuples, not dataclasses: the module is imported by
    every door that reads a workflow, and a dataclass's generated methods (none needed here) are made by ``exec``
    at import."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


Source = tuple[str, int] | Value | None


class Slot(NamedTuple):
    name: str
    type: str
    source: Source
    widget: bool


class Item:
    """One node after expansion (``kind``: node, exit) with its inputs' sources."""

    __slots__ = ("exits", "id", "inputs", "kind", "mode", "outputs", "title", "type", "widgets_values")

    def __init__(self, id: str, type: str, title: str | None, mode: int, inputs: list[Slot],
                 widgets_values: Any, outputs: list[str] | None = None, exits: list[Source] | None = None,
                 kind: str = "node") -> None:
        self.id = id
        self.type = type
        self.title = title
        self.mode = mode
        self.inputs = inputs
        self.widgets_values = widgets_values
        self.outputs = [] if outputs is None else outputs
        self.exits = [] if exits is None else exits
        self.kind = kind


def _links(graph: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    """link id -> (origin node id, origin slot), from either the array or the object form."""
    table = {}
    for link in graph.get("links") or []:
        if isinstance(link, list) and len(link) >= 5:
            table[link[0]] = (link[1], link[2])
        elif isinstance(link, dict):
            table[link.get("id")] = (link.get("origin_id"), link.get("origin_slot"))
    return table


class _Scope(NamedTuple):
    prefix: str
    links: dict[int, tuple[int, int]]
    bindings: list[Source]
    node_ids: set[Any]


class Flattener:
    """Expands a workflow's subgraphs into ``items``; ``problems`` collects the links that lead nowhere."""

    def __init__(self, workflow: Mapping[str, Any], object_info: Mapping[str, Any] | None = None) -> None:
        definitions = (workflow.get("definitions") or {}).get("subgraphs") or []
        self.subgraphs = {sub.get("id"): sub for sub in definitions if isinstance(sub, dict)}
        groups = (workflow.get("extra") or {}).get("groupNodes")
        self.groups = groups if isinstance(groups, dict) else {}
        self.object_info = object_info or {}
        self.items: dict[str, Item] = {}
        self.problems: list[str] = []
        self._stack: list[str] = []
        self._expand(workflow, "", [])

    def _expand(self, graph: Mapping[str, Any], prefix: str, bindings: list[Source]) -> None:
        nodes = [node for node in graph.get("nodes") or [] if isinstance(node, dict)]
        scope = _Scope(prefix, _links(graph), bindings, {node.get("id") for node in nodes})
        for node in nodes:
            if len(self.items) >= MAX_NODES:
                raise UIWorkflowError([f"more than {MAX_NODES} nodes after expanding its subgraphs"])
            if node.get("type") in self.subgraphs:
                self._instance(node, scope)
            elif groupnodes.group_name(str(node.get("type"))) in self.groups:
                self._group(node, scope)
            else:
                self._add(node, scope)

    def _source(self, link_id: Any, scope: _Scope, where: str) -> Source:
        if link_id is None:
            return None
        origin = scope.links.get(link_id)
        if origin is None:
            self.problems.append(f"{where}: its link {link_id} is not in the workflow's links")
            return None
        origin_id, slot = origin
        if origin_id == SUBGRAPH_INPUT:
            return scope.bindings[slot] if isinstance(slot, int) and 0 <= slot < len(scope.bindings) else None
        if origin_id not in scope.node_ids:
            self.problems.append(f"{where}: its link {link_id} comes from node {origin_id}, which is not there")
            return None
        return f"{scope.prefix}{origin_id}", slot

    def _slots(self, node: Mapping[str, Any], scope: _Scope, where: str) -> list[Slot]:
        slots = []
        for index, entry in enumerate(node.get("inputs") or []):
            if not isinstance(entry, dict):
                continue
            name = entry.get("name", str(index))
            source = self._source(entry.get("link"), scope, f"{where} input {name!r}")
            slots.append(Slot(name, str(entry.get("type")), source, isinstance(entry.get("widget"), dict)))
        return slots

    def _add(self, node: Mapping[str, Any], scope: _Scope) -> None:
        item_id = f"{scope.prefix}{node.get('id')}"
        where = describe(node, item_id)
        self.items[item_id] = Item(
            item_id, str(node.get("type")), node.get("title"), _mode(node), self._slots(node, scope, where),
            node.get("widgets_values"), [str((out or {}).get("type")) for out in node.get("outputs") or []])

    def _instance(self, node: Mapping[str, Any], scope: _Scope) -> None:
        """A subgraph instance: its inner nodes under ``id:``, and an exit item for its outputs."""
        definition = self.subgraphs[node.get("type")]
        item_id = f"{scope.prefix}{node.get('id')}"
        if definition.get("id") in self._stack:
            raise UIWorkflowError([f"{describe(node, item_id)}: subgraph {definition.get('name')!r} contains itself"])
        if len(self._stack) >= MAX_DEPTH:
            raise UIWorkflowError([f"{describe(node, item_id)}: subgraphs nested more than {MAX_DEPTH} deep"])
        slots = self._slots(node, scope, describe(node, item_id))
        bindings = self._bindings(node, definition, slots)
        self._stack.append(definition.get("id"))
        self._expand(definition, f"{item_id}:", bindings)
        self._stack.pop()
        inner = _Scope(f"{item_id}:", _links(definition), bindings,
                       {inner.get("id") for inner in definition.get("nodes") or [] if isinstance(inner, dict)})
        exits = [self._source(_first((out or {}).get("linkIds")), inner, f"{describe(node, item_id)} output")
                 for out in definition.get("outputs") or []]
        self.items[item_id] = Item(item_id, str(node.get("type")), node.get("title") or definition.get("name"),
                                   _mode(node), slots, None, exits=exits, kind="exit")

    def _group(self, node: Mapping[str, Any], scope: _Scope) -> None:
        """A legacy group node: its inner nodes under ``id:index``, and an exit item for its outputs."""
        item_id = f"{scope.prefix}{node.get('id')}"
        definition = self.groups[groupnodes.group_name(str(node.get("type")))]
        layout = groupnodes.layout_of(definition, self.object_info)
        outer = self._slots(node, scope, describe(node, item_id))
        saved = node.get("widgets_values") if isinstance(node.get("widgets_values"), list) else []
        values: dict[int, dict[str, Any]] = {}
        for target, value in zip(layout.widgets, saved, strict=False):
            if target is not None:
                values.setdefault(target[0], {})[target[1]] = value
        for index, inner in enumerate(definition.get("nodes") or []):
            inner_id = f"{item_id}:{index}"
            types = {entry.get("name"): str(entry.get("type")) for entry in inner.get("inputs") or []
                     if isinstance(entry, dict)}
            slots = [Slot(name, types.get(name, "*"), self._group_source(layout, outer, item_id, index, position),
                          False) for position, name in enumerate(layout.slot_names.get(index, []))]
            self.items[inner_id] = Item(inner_id, str(inner.get("type")), inner.get("title"), _mode(inner), slots,
                                        values.get(index, {}))
        exits: list[Source] = [(f"{item_id}:{index}", slot) for index, slot in layout.outputs]
        self.items[item_id] = Item(item_id, str(node.get("type")), node.get("title"), _mode(node), outer, None,
                                   exits=exits, kind="exit")

    @staticmethod
    def _group_source(layout: groupnodes.Layout, outer: list[Slot], item_id: str, index: int,
                      position: int) -> Source:
        inside = layout.internal.get((index, position))
        if inside is not None:
            return f"{item_id}:{inside[0]}", inside[1]
        name = layout.slot_names[index][position]
        external = layout.inputs.index((index, name)) if (index, name) in layout.inputs else len(outer)
        return outer[external].source if external < len(outer) else None

    @staticmethod
    def _bindings(node: Mapping[str, Any], definition: Mapping[str, Any], slots: list[Slot]) -> list[Source]:
        """What feeds each of the subgraph's inputs: the instance's link, else its widget's saved value."""
        by_name = {slot.name: slot for slot in slots}
        values = list(node.get("widgets_values") or []) if isinstance(node.get("widgets_values"), list) else []
        bindings: list[Source] = []
        for entry in definition.get("inputs") or []:
            slot = by_name.get((entry or {}).get("name"))
            if slot is not None and slot.source is not None:
                bindings.append(slot.source)
            elif slot is None or slot.widget:
                bindings.append(Value(values.pop(0)) if values else None)
            else:
                bindings.append(None)
        return bindings


def _first(ids: Any) -> Any:
    return ids[0] if isinstance(ids, list) and ids else None


def _mode(node: Mapping[str, Any]) -> int:
    mode = node.get("mode", 0)
    return mode if isinstance(mode, int) else 0


def describe(node: Mapping[str, Any], item_id: str) -> str:
    """How a problem names a node: ``node 57:12 "Positive Prompt" (CLIPTextEncode)``."""
    title = node.get("title")
    named = f" {title!r}" if title else ""
    return f"node {item_id}{named} ({node.get('type')})"
