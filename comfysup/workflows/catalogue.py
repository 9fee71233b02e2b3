"""What a node catalogue (ComfyUI's GET /object_info) says about a node's widgets, as the frontend reads it.

The frontend gives a node one widget per catalogue input whose type is a primitive (INT, FLOAT, STRING,
BOOLEAN) or a choice (a list, or COMBO), in the catalogue's input order (required, then optional), unless the
input is ``forceInput``. A saved node's ``widgets_values`` are the values of those widgets in order, with the
values the frontend adds that are no inputs: the ``control_after_generate`` choice after an input that asks
for it (a seed), and the upload button after an input with an ``*_upload`` option (LoadImage's ``image``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

PRIMITIVE_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})
_UPLOAD = re.compile(r"[a-z_]*upload")
_COMMENTS = re.compile(r"/\*[\s\S]*?\*/|//.*")


class Widget(NamedTuple):
    """One entry of a node's ``widgets_values``: an input's widget, or a value the frontend adds (``input`` None)."""

    name: str
    type: str
    options: Mapping[str, Any]
    choices: tuple[Any, ...] | None = None
    input: bool = True

    @property
    def default(self) -> Any:
        """The value a new widget starts with in the frontend."""
        if "default" in self.options:
            return self.options["default"]
        if self.choices is not None:
            return self.choices[0] if self.choices else None
        return {"INT": 0, "FLOAT": 0, "STRING": "", "BOOLEAN": False}.get(self.type)


def ordered_inputs(spec: Mapping[str, Any]) -> list[tuple[str, Any, Mapping[str, Any]]]:
    """(name, type, options) of every input of a catalogue entry: required, then optional, in input order."""
    found = []
    declared = spec.get("input") or {}
    order = spec.get("input_order") or {}
    for group in ("required", "optional"):
        entries = declared.get(group) or {}
        for name in order.get(group) or list(entries):
            entry = entries.get(name)
            if not isinstance(entry, list) or not entry:
                continue
            options = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
            found.append((name, entry[0], options))
    return found


def _choices(kind: Any, options: Mapping[str, Any]) -> tuple[Any, ...] | None:
    if isinstance(kind, list):
        return tuple(kind)
    if kind == "COMBO":
        return tuple(options.get("options") or ())
    return None


def widget_of(name: str, kind: Any, options: Mapping[str, Any]) -> Widget | None:
    """The widget the frontend gives an input, or None for a socket-only input."""
    if options.get("forceInput"):
        return None
    if not isinstance(kind, list) and kind not in PRIMITIVE_TYPES:
        return None
    return Widget(name, "COMBO" if isinstance(kind, list) else kind, options, _choices(kind, options))


def widget_layout(spec: Mapping[str, Any]) -> list[Widget]:
    """The widgets of a node of this catalogue entry in ``widgets_values`` order, added values included."""
    layout = []
    for name, kind, options in ordered_inputs(spec):
        widget = widget_of(name, kind, options)
        if widget is None:
            continue
        layout.append(widget)
        if options.get("control_after_generate"):
            layout.append(Widget("control_after_generate", "COMBO", {}, None, input=False))
        layout.extend(Widget("upload", "BUTTON", {}, None, input=False)
                      for option, value in options.items() if value is True and is_upload_option(option))
    return layout


def is_upload_option(option: str) -> bool:
    """Whether an input option (``image_upload``, ``video_upload``, ...) makes the frontend add an upload button."""
    return _UPLOAD.fullmatch(option) is not None


def fits(widget: Widget, value: Any) -> bool:
    """Whether a saved value can be this widget's (JSON type only: choice lists change with the files)."""
    if not widget.input or value is None:
        return True
    expected: dict[str, Callable[[Any], bool]] = {
        "INT": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "FLOAT": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "BOOLEAN": lambda v: isinstance(v, bool),
        "STRING": lambda v: isinstance(v, str),
    }
    check = expected.get(widget.type)
    return check is None or check(value)


def dynamic_prompt(text: str, choose: Callable[[Sequence[str]], str] = random.choice) -> str:
    """What the frontend sends for a widget with ``dynamicPrompts``: comments removed, one option of each ``{a|b}``.

    Backslash escapes are kept as they are (ComfyUI's text encoders see them), as the frontend keeps them.
    """
    source = _COMMENTS.sub("", text)
    return _Choices(source, choose).text()


class _Choices:
    """The frontend's reading of ``{a|b|{c|d}}``: nested choices, ``\\`` escaping the next character."""

    def __init__(self, source: str, choose: Callable[[Sequence[str]], str]) -> None:
        self.source = source
        self.at = 0
        self.choose = choose

    def _next(self) -> str:
        char = self.source[self.at]
        self.at += 1
        return char

    def _escape(self) -> str:
        following = self.source[self.at] if self.at < len(self.source) else "undefined"
        self.at += 1
        return "\\" + following

    def text(self) -> str:
        out = []
        while self.at < len(self.source):
            char = self._next()
            if char == "\\":
                out.append(self._escape())
            elif char == "{":
                out.append(self._block())
            else:
                out.append(char)
        return "".join(out)

    def _block(self) -> str:
        options: list[str] = []
        current: list[str] = []
        depth = 0
        while self.at < len(self.source):
            char = self._next()
            if char == "\\":
                current.append(self._escape())
                continue
            if char == "}" and not depth:
                break
            if char == "|" and not depth:
                options.append("".join(current))
                current = []
                continue
            depth += {"{": 1, "}": -1}.get(char, 0)
            current.append(char)
        options.append("".join(current))
        return _Choices(self.choose(options), self.choose).text()
