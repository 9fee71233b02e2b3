"""A job's nodes checked against the node catalogues (``/object_info``) that runners recorded in the queue.

The checks are ComfyUI's own, as ``validate_prompt`` and ``validate_inputs`` make them at POST /prompt
(Comfy-Org/ComfyUI execution.py@cb707e9c29a8f2f1be76ebcde134cb8c69842180): a class the server lacks
(``missing_node_type``), a required input missing (``required_input_missing``), a literal that does not
convert to INT/FLOAT (``invalid_input_type``; STRING and BOOLEAN convert anything), below ``min`` or above
``max`` (``value_smaller_than_min``/``value_bigger_than_max``), and a value not among a combo's choices
(``value_not_in_list``, old ``[[choices], {…}]`` and new ``["COMBO", {"options": […]}]`` specs). A value
wrapped as ``{"__value__": v}`` is unwrapped as ComfyUI does. Left out: link return types, and
``VALIDATE_INPUTS`` functions (invisible in /object_info); a file input (``{"file": …}``) is put on the
server by the runner, so its name is not checked.

A template is checked once per catalogue (``TemplateCheck``); a line re-checks only the nodes its ``set``
changed, so 100,000 lines of one workflow cost their changed nodes, not the whole graph each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_CHOICES_SHOWN = 8


@dataclass(frozen=True)
class Issue:
    """Why one node cannot run on one catalogue. ``input`` is None for a missing class; ``choices`` are the
    catalogue's choices for a combo value it lacks."""

    node_id: str
    class_type: str
    input: str | None
    kind: str
    text: str
    value: Any = None
    choices: tuple[Any, ...] = ()

    def key(self) -> tuple[str, str | None, str]:
        return self.node_id, self.input, self.kind


@dataclass(frozen=True)
class Catalogue:
    """One server's /object_info, with the runners (``runner@machine``) whose server has it now."""

    id: int
    info: Mapping[str, Any]
    servers: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return ", ".join(self.servers) or f"catalogue {self.id}"


def _spec(info: Mapping[str, Any], name: str) -> tuple[str, Any, dict[str, Any]] | None:
    """(category, type, options) of input ``name`` of a class's object_info entry."""
    inputs = info.get("input") or {}
    for category in ("required", "optional"):
        spec = (inputs.get(category) or {}).get(name)
        if spec is not None:
            if not isinstance(spec, list) or not spec:
                return category, None, {}
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            return category, spec[0], options
    return None


def _combo(kind: Any, options: dict[str, Any]) -> list[Any] | None:
    if isinstance(kind, list):
        return kind
    if kind == "COMBO":
        choices = options.get("options", [])
        return choices if isinstance(choices, list) else []
    return None


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def check_node(node_id: str, node: Mapping[str, Any], catalogue: Mapping[str, Any]) -> Issue | None:
    """The first reason ComfyUI would refuse node ``node_id`` on a server with ``catalogue``, or None."""
    class_type = node.get("class_type")
    info = catalogue.get(class_type) if isinstance(class_type, str) else None
    if not isinstance(info, dict):
        return Issue(node_id, str(class_type), None, "missing_node_type", f"class {class_type!r} is not installed")
    inputs = node.get("inputs") or {}
    required = (info.get("input") or {}).get("required") or {}
    for name in required:
        if name not in inputs:
            return Issue(node_id, class_type, name, "required_input_missing", f"required input {name!r} is missing")
    for name, value in inputs.items():
        issue = check_input(node_id, class_type, info, name, value)
        if issue is not None:
            return issue
    return None


def check_input(node_id: str, class_type: str, info: Mapping[str, Any], name: str, value: Any) -> Issue | None:
    """One input's value against its class's spec (a link, an input the class does not declare, or a file
    reference is not checked here)."""
    spec = _spec(info, name)
    if spec is None or _is_link(value):
        return None
    _category, kind, options = spec
    if isinstance(value, dict):
        if "__value__" not in value:
            return None  # a file reference: the runner uploads it and names it
        value = value["__value__"]
    return _check_value(node_id, class_type, name, value, kind, options)


def _check_value(node_id: str, class_type: str, name: str, value: Any, kind: Any,
                 options: dict[str, Any]) -> Issue | None:
    if kind in ("INT", "FLOAT"):
        try:
            value = int(value) if kind == "INT" else float(value)
        except (TypeError, ValueError, OverflowError):
            return Issue(node_id, class_type, name, "invalid_input_type", f"{name} {value!r} is not a {kind}", value)
        if isinstance(value, float) and math.isnan(value):
            return None
        low, high = options.get("min"), options.get("max")
        if isinstance(low, int | float) and value < low:
            return Issue(node_id, class_type, name, "value_smaller_than_min",
                         f"{name} {value!r} is below its minimum {low}", value)
        if isinstance(high, int | float) and value > high:
            return Issue(node_id, class_type, name, "value_bigger_than_max",
                         f"{name} {value!r} is above its maximum {high}", value)
        return None
    choices = _combo(kind, options)
    if choices:  # an empty list (a server that lists no file of that kind, fake_comfy's loaders) is not held
        # against a job: ComfyUI would refuse it at POST, as before this check
        values = value if options.get("multiselect") and isinstance(value, list) else [value]
        for v in values:
            try:
                known = v in choices
            except TypeError:
                known = False
            if not known:
                return Issue(node_id, class_type, name, "value_not_in_list",
                             f"{name} {v!r} is not on this server", v, tuple(choices))
    return None


def _shown(choices: Iterable[Any]) -> str:
    listed = sorted({repr(c) for c in choices})
    more = f", … {len(listed) - MAX_CHOICES_SHOWN} more" if len(listed) > MAX_CHOICES_SHOWN else ""
    return ", ".join(c.strip("'") for c in listed[:MAX_CHOICES_SHOWN]) + more if listed else "none"


def refusal_text(issues: Mapping[int, Issue], catalogues: Mapping[int, Catalogue]) -> str:
    """One reason for a job that every catalogue refuses: the node that no server can run, worded for all of
    them when they agree, else each server's own reason."""
    first = next(iter(issues.values()))
    agree = all(i.key() == first.key() for i in issues.values())
    where = f"node {first.node_id} ({first.class_type})" if first.input is not None else f"node {first.node_id}"
    if agree and first.kind == "missing_node_type":
        return f"{where}: class {first.class_type!r} is on no server (its custom node is not installed on any)"
    if agree and first.kind == "value_not_in_list":
        known = [c for i in issues.values() for c in i.choices]
        return f"{where}: {first.input} {first.value!r} is not on any server (known: {_shown(known)})"
    if agree:
        return f"{where}: {first.text}"
    return "no server can run it: " + "; ".join(
        f"{catalogues[c].label if c in catalogues else f'catalogue {c}'}: node {i.node_id} ({i.class_type}) {i.text}"
        for c, i in issues.items())


def first_issue(workflow: Mapping[str, Any], catalogue: Mapping[str, Any]) -> Issue | None:
    """The first node (in id order) that ``catalogue`` cannot run, or None: what a runner checks at claim."""
    for node_id in sorted(workflow):
        issue = check_node(node_id, workflow[node_id], catalogue)
        if issue is not None:
            return issue
    return None


class TemplateCheck:
    """A template's nodes checked once per catalogue; a line's changed nodes checked again alone."""

    def __init__(self, workflow: Mapping[str, Any], catalogues: Mapping[int, Catalogue]) -> None:
        self.workflow = workflow
        self.catalogues = catalogues
        self.issues: dict[int, dict[str, Issue]] = {
            cid: {n: issue for n in workflow if (issue := check_node(n, workflow[n], c.info)) is not None}
            for cid, c in catalogues.items()}

    def refusals(self, changed: Mapping[str, Any]) -> dict[int, Issue]:
        """The catalogues that refuse the template with ``changed`` nodes, each with its first issue."""
        refused: dict[int, Issue] = {}
        for cid, catalogue in self.catalogues.items():
            base = self.issues[cid]
            issue = None
            for node_id in sorted(set(base) | set(changed)) if base else sorted(changed):
                issue = (self._changed(node_id, changed[node_id], catalogue.info, node_id in base)
                         if node_id in changed else base[node_id])
                if issue is not None:
                    break
            if issue is not None:
                refused[cid] = issue
        return refused

    def _changed(self, node_id: str, node: Mapping[str, Any], info: Mapping[str, Any], failed: bool) -> Issue | None:
        """A node a line changed: only the inputs whose values differ from the template's are checked again,
        unless the template's own node failed, its class changed, or an input went missing."""
        template = self.workflow.get(node_id)
        if failed or not isinstance(template, dict) or template.get("class_type") != node.get("class_type"):
            return check_node(node_id, node, info)
        inputs, base = node.get("inputs") or {}, template.get("inputs") or {}
        if not base.keys() <= inputs.keys():
            return check_node(node_id, node, info)
        class_info = info.get(node["class_type"])
        if not isinstance(class_info, dict):
            return check_node(node_id, node, info)
        for name, value in inputs.items():
            if value is not base.get(name, _MISSING):
                issue = check_input(node_id, node["class_type"], class_info, name, value)
                if issue is not None:
                    return issue
        return None


_MISSING = object()
