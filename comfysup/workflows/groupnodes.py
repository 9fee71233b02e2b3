"""Legacy group nodes (``extra.groupNodes``) laid out as the frontend lays them out.

A group node's type is ``workflow>NAME`` (``workflow/NAME`` before frontend 1.2.63) and its definition holds
the inner nodes (by index), the links between them ``[from index, from slot, to index, to slot, ...]`` and the
outputs used outside. The frontend builds the group node's inputs and widgets from the inner nodes in order,
each inner node's catalogue inputs in declaration order: a widget input becomes a group widget (a seed also
gets its ``control_after_generate``), an input slot not linked inside becomes a group input, and widgets the
inner node had converted to inputs come last, after all nodes. An output is the group's unless it is only
linked inside. Inner nodes execute as ``group_id:index``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from comfysup.workflows import catalogue

PREFIXES = ("workflow>", "workflow/")
SEED_NAMES = ("seed", "noise_seed")


class Layout:
    """Where a group node's widgets, inputs and outputs lead inside it (a plain class: no dataclass's methods,
    made by ``exec`` at import, are needed)."""

    __slots__ = ("inputs", "internal", "outputs", "slot_names", "widgets")

    def __init__(self, internal: dict[tuple[int, int], tuple[int, int]] | None = None) -> None:
        self.widgets: list[tuple[int, str] | None] = []
        """Per group widget value: (inner index, input name), or None for a value that is no input."""
        self.inputs: list[tuple[int, str]] = []
        """Per group input: (inner index, input name)."""
        self.outputs: list[tuple[int, int]] = []
        """Per group output: (inner index, output slot)."""
        self.internal = {} if internal is None else internal
        """(to index, to slot) -> (from index, from slot) of the links inside."""
        self.slot_names: dict[int, list[str]] = {}
        """Per inner node: its input names in slot order (sockets, then converted widgets)."""


def group_name(node_type: str) -> str | None:
    """The name of a group node's definition, or None for any other type."""
    for prefix in PREFIXES:
        if node_type.startswith(prefix):
            return node_type[len(prefix):]
    return None


def _is_widget(kind: Any) -> bool:
    return isinstance(kind, list) or kind in catalogue.PRIMITIVE_TYPES


def _declared(spec: Mapping[str, Any]) -> list[tuple[str, Any, Mapping[str, Any]]]:
    """The inputs as the frontend's group code reads them: required then optional, in the catalogue's key order."""
    declared = spec.get("input") or {}
    merged = {**(declared.get("required") or {}), **(declared.get("optional") or {})}
    return [(name, entry[0], entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {})
            for name, entry in merged.items() if isinstance(entry, list) and entry]


def _add_widget(layout: Layout, index: int, name: str, options: Mapping[str, Any]) -> None:
    layout.widgets.append((index, name))
    if name in SEED_NAMES or options.get("control_after_generate"):
        layout.widgets.append(None)
    layout.widgets.extend(None for option, value in options.items()
                          if value is True and catalogue.is_upload_option(option))


def _converted(node: Mapping[str, Any], name: str) -> int | None:
    for position, entry in enumerate(node.get("inputs") or []):
        if isinstance(entry, dict) and entry.get("name") == name and (entry.get("widget") or {}).get("name") == name:
            return position
    return None


def layout_of(definition: Mapping[str, Any], object_info: Mapping[str, Any]) -> Layout:
    """The layout of one group definition; inner nodes the catalogue lacks contribute nothing."""
    layout = Layout(internal=_internal_links(definition))
    external = {(entry[0], entry[1]) for entry in definition.get("external") or [] if isinstance(entry, list)}
    converted_later = []
    for index, node in enumerate(definition.get("nodes") or []):
        spec = object_info.get(node.get("type")) if isinstance(node, dict) else None
        if not isinstance(spec, dict):
            continue
        converted_later.append(_inputs_of(layout, index, node, spec))
        _outputs_of(layout, index, spec, external)
    for index, names in converted_later:
        _add_converted(layout, index, names)
    return layout


def _internal_links(definition: Mapping[str, Any]) -> dict[tuple[int, int], tuple[int, int]]:
    return {(link[2], link[3]): (link[0], link[1]) for link in definition.get("links") or []
            if isinstance(link, list) and len(link) >= 4 and link[0] is not None}


def _add_converted(layout: Layout, index: int, names: list[str]) -> None:
    """An inner node's converted widgets: slots after its sockets; open ones are group widgets and inputs."""
    offset = len(layout.slot_names[index])
    layout.slot_names[index].extend(names)
    for position, name in enumerate(names):
        if (index, offset + position) in layout.internal:
            continue
        _add_widget(layout, index, name, {})
        layout.inputs.append((index, name))


def _inputs_of(layout: Layout, index: int, node: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[int, list[str]]:
    """Adds an inner node's widgets and open input slots; returns its converted widgets, for after all nodes."""
    slots, converted = [], {}
    for name, kind, options in _declared(spec):
        if not _is_widget(kind):
            slots.append(name)
            continue
        position = _converted(node, name)
        if position is None:
            _add_widget(layout, index, name, options)
        else:
            converted[position] = name
    layout.slot_names[index] = slots
    layout.inputs.extend((index, name) for slot, name in enumerate(slots) if (index, slot) not in layout.internal)
    return index, [converted[position] for position in sorted(converted)]


def _outputs_of(layout: Layout, index: int, spec: Mapping[str, Any], external: set[tuple[int, int]]) -> None:
    linked_inside = {slot for (source, slot) in layout.internal.values() if source == index}
    for slot, _kind in enumerate(spec.get("output") or []):
        if slot not in linked_inside or (index, slot) in external:
            layout.outputs.append((index, slot))
