"""``set`` keys that name a node the way a person sees it, and the list of what a job can set.

A key is ``NODE.INPUT``. ``NODE`` is a node id of the API prompt (``"3"``), an id path inside a subgraph as
the frontend gives it (``"57:12"``), or a node's title (``"Positive Prompt"``, the ``_meta.title`` of the
prompt); where no title matches, a class name that one node alone has (``"KSampler"``). The key is split at
its last dot, so titles may contain dots. A name that matches several nodes, or none, is refused with the
candidates (did-you-mean, by closeness).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, NamedTuple

from comfysup.workflows import catalogue
from comfysup.workflows.errors import UIWorkflowError

SUGGESTIONS = 5


class ParameterNameError(UIWorkflowError):
    """A ``set`` key that names no node input, or more than one."""


def _title(node: Mapping[str, Any]) -> str | None:
    meta = node.get("_meta")
    return meta.get("title") if isinstance(meta, dict) else None


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=SUGGESTIONS, cutoff=0.5)
    shown = close or sorted(candidates)[:SUGGESTIONS]
    return f" (did you mean: {', '.join(repr(name) for name in shown)}?)" if shown else ""


def find_node(prompt: Mapping[str, Any], name: str) -> str:
    """The id of the one node ``name`` names (id, id path, title, or unique class name)."""
    if name in prompt:
        return name
    for field in (_title, lambda node: node.get("class_type")):
        matches = [node_id for node_id, node in prompt.items() if isinstance(node, dict) and field(node) == name]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise ParameterNameError([f"{name!r} names {len(matches)} nodes ({', '.join(sorted(matches))}):"
                                      " name one by its id"])
    titles = [_title(node) for node in prompt.values() if isinstance(node, dict)]
    known = list(prompt) + [title for title in titles if title]
    raise ParameterNameError([f"no node is named {name!r}{_did_you_mean(name, known)}"])


def resolve(prompt: Mapping[str, Any], key: str) -> tuple[str, str]:
    """(node id, input name) that the ``set`` key ``NODE.INPUT`` names in an API prompt."""
    node_name, dot, input_name = key.rpartition(".")
    if not dot or not node_name or not input_name:
        raise ParameterNameError([f"{key!r} is not NODE.INPUT (a node id, id path or title, a dot, an input)"])
    node_id = find_node(prompt, node_name)
    inputs = prompt[node_id].get("inputs") or {}
    if input_name not in inputs:
        raise ParameterNameError([f"node {node_id} ({prompt[node_id].get('class_type')}) has no input"
                                  f" {input_name!r}{_did_you_mean(input_name, list(inputs))}"])
    return node_id, input_name


class Parameter(NamedTuple):
    """One input a job can set: where it is, what it holds now, and what the catalogue allows."""

    node_id: str
    title: str | None
    class_type: str
    input: str
    value: Any
    type: str | None
    minimum: Any = None
    maximum: Any = None
    step: Any = None
    choices: tuple[Any, ...] | None = None


def settable(prompt: Mapping[str, Any], object_info: Mapping[str, Any] | None = None) -> list[Parameter]:
    """Every input of the prompt that holds a value (not a link), with its type and range or choices."""
    found = []
    for node_id, node in prompt.items():
        if not isinstance(node, dict):
            continue
        spec = (object_info or {}).get(node.get("class_type")) or {}
        declared = {name: catalogue.widget_of(name, kind, options) for name, kind, options
                    in catalogue.ordered_inputs(spec)}
        for name, value in (node.get("inputs") or {}).items():
            if isinstance(value, list):
                continue
            widget = declared.get(name)
            options = widget.options if widget else {}
            found.append(Parameter(node_id, _title(node), str(node.get("class_type")), name, value,
                                   widget.type if widget else None, options.get("min"), options.get("max"),
                                   options.get("step"), widget.choices if widget else None))
    return found
