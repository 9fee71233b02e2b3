"""A prompt's graph as the executor walks it: the order its nodes run in and the cache key of each node.

Pure functions of the prompt (ComfyUI's API format), shared by the executor and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from .nodes import is_link


def _links(node: dict[str, Any], prompt: dict[str, Any]) -> list[str]:
    return [v[0] for v in node.get("inputs", {}).values() if is_link(v) and v[0] in prompt]


def post_order(prompt: dict[str, Any], roots: Iterable[str], expand: Callable[[str], bool]) -> list[str]:
    """Ancestors before descendants, from `roots`; a node's inputs are walked only if `expand(node)`."""
    order: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[str, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node_id, done = stack.pop()
        if done:
            order.append(node_id)
            continue
        if node_id in seen:
            continue
        seen.add(node_id)
        stack.append((node_id, True))
        if expand(node_id):
            stack.extend((src, False) for src in reversed(_links(prompt[node_id], prompt)) if src not in seen)
    return order


def signatures(prompt: dict[str, Any]) -> dict[str, str]:
    """Cache keys: class and inputs, with each link replaced by its source's key (node ids do not count)."""
    sigs: dict[str, str] = {}
    for node_id in post_order(prompt, prompt, lambda _: True):
        node = prompt[node_id]
        parts = []
        for name in sorted(node.get("inputs", {})):
            value = node["inputs"][name]
            if is_link(value) and value[0] in prompt:
                parts.append([name, "link", sigs[value[0]], value[1]])
            else:
                parts.append([name, "value", value])
        text = json.dumps([node.get("class_type"), parts], sort_keys=True, default=str)
        sigs[node_id] = hashlib.sha256(text.encode()).hexdigest()
    return sigs
