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

Beyond ComfyUI's own checks: a value for an input of a type that only a link can give (``LINK_ONLY_TYPES``:
IMAGE, LATENT, MODEL, …), which ComfyUI accepts at POST and fails at run time; and a file input's value
(a combo with ``image_upload``, as LoadImage's) that no server lists but that names a local file, which a
``{"file": …}`` value would have sent. Every problem of a node is found (``node_issues``); the runner's
claim needs only the first (``first_issue``). What a person reads of them, with "did you mean", is
``refusal_texts``.

A template is checked once per catalogue (``TemplateCheck``); a line re-checks only the nodes its ``set``
changed, so 100,000 lines of one workflow cost their changed nodes, not the whole graph each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from comfysup.jobs.values import article, close_matches, did_you_mean

MAX_CHOICES_SHOWN = 8
LINK_ONLY_TYPES = frozenset({
    "IMAGE", "LATENT", "MASK", "MODEL", "CLIP", "VAE", "CONDITIONING", "CONTROL_NET", "CLIP_VISION",
    "CLIP_VISION_OUTPUT", "STYLE_MODEL", "GLIGEN", "UPSCALE_MODEL", "SIGMAS", "NOISE", "SAMPLER", "GUIDER",
    "AUDIO", "VIDEO", "LATENT_OPERATION", "HOOKS", "HOOK_KEYFRAMES", "TIMESTEPS_RANGE", "PHOTOMAKER", "MESH",
    "VOXEL", "WAN_CAMERA_EMBEDDING", "LORA_MODEL", "LOSS_MAP",
})
"""ComfyUI's own socket types, which only another node's output gives: a literal for one passes ComfyUI's
validation and fails at run time. Other types are not judged: a frontend extension may give them a widget
that holds a value (Load3D's LOAD_3D, WebcamCapture's WEBCAM, custom nodes' own)."""
LocalFile = Callable[[str], bool]
"""Whether a name is a file on this side that a ``{"file": …}`` value could send."""


class Issue(NamedTuple):
    """Why one node cannot run on one catalogue. ``input`` is None for a missing class; ``choices`` are the
    catalogue's choices for a combo value it lacks."""

    node_id: str
    class_type: str
    input: str | None
    kind: str
    text: str
    value: Any = None
    choices: tuple[Any, ...] = ()
    local: bool = False
    """A file input's value that names a local file: ``{"file": …}`` would send it."""

    def key(self) -> tuple[str, str | None, str]:
        return self.node_id, self.input, self.kind


class Catalogue(NamedTuple):
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


def node_issues(node_id: str, node: Mapping[str, Any], catalogue: Mapping[str, Any],
                local: LocalFile | None = None) -> list[Issue]:
    """Every reason ComfyUI would refuse node ``node_id`` on a server with ``catalogue``: a missing class,
    then each missing required input, then each input's value, in the node's order."""
    class_type = node.get("class_type")
    info = catalogue.get(class_type) if isinstance(class_type, str) else None
    if not isinstance(info, dict):
        return [Issue(node_id, str(class_type), None, "missing_node_type", f"class {class_type!r} is not installed",
                      class_type)]
    inputs = node.get("inputs") or {}
    required = (info.get("input") or {}).get("required") or {}
    issues = [Issue(node_id, class_type, name, "required_input_missing", f"required input {name!r} is missing"
                    + _misnamed(name, inputs, info)) for name in required if name not in inputs]
    for name, value in inputs.items():
        issue = check_input(node_id, class_type, info, name, value, local)
        if issue is not None:
            issues.append(issue)
    return issues


def _misnamed(name: str, inputs: Mapping[str, Any], info: Mapping[str, Any]) -> str:
    """A hint when the node has an input its class does not declare that looks like the missing one."""
    found = close_matches(name, [n for n in inputs if _spec(info, n) is None], limit=1)
    return f" (the node has {found[0]!r}: a typo of {name!r}?)" if found else ""


def check_node(node_id: str, node: Mapping[str, Any], catalogue: Mapping[str, Any]) -> Issue | None:
    """The first reason ComfyUI would refuse node ``node_id`` on a server with ``catalogue``, or None."""
    issues = node_issues(node_id, node, catalogue)
    return issues[0] if issues else None


def check_input(node_id: str, class_type: str, info: Mapping[str, Any], name: str, value: Any,
                local: LocalFile | None = None) -> Issue | None:
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
    if isinstance(kind, str) and kind in LINK_ONLY_TYPES:
        return Issue(node_id, class_type, name, "link_only", f"input {name!r} takes a link to another node's {kind} "
                     f"output, not a value ({_short(value)})", value)
    return _check_value(node_id, class_type, name, value, kind, options, local)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _check_value(node_id: str, class_type: str, name: str, value: Any, kind: Any,
                 options: dict[str, Any], local: LocalFile | None) -> Issue | None:
    if kind in ("INT", "FLOAT"):
        return _check_number(node_id, class_type, name, value, kind, options)
    choices = _combo(kind, options)
    if choices is None:
        return None
    return _check_choice(node_id, class_type, name, value, choices, options, local)


def _check_number(node_id: str, class_type: str, name: str, value: Any, kind: str,
                  options: dict[str, Any]) -> Issue | None:
    """An INT or FLOAT input: a number of its kind, within its min and max (NaN is ComfyUI's to judge)."""
    try:
        value = int(value) if kind == "INT" else float(value)
    except (TypeError, ValueError, OverflowError):
        return Issue(node_id, class_type, name, "invalid_input_type", f"{name} {_short(value)} is not {article(kind)}",
                     value)
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


def _check_choice(node_id: str, class_type: str, name: str, value: Any, choices: list[Any], options: dict[str, Any],
                  local: LocalFile | None) -> Issue | None:
    """A COMBO input: each value (each of a multiselect's list) one of the server's choices."""
    # A file input (LoadImage's image: image_upload) whose value is a local file: {"file": …} sends it.
    upload = local is not None and any(k.endswith("_upload") and v is True for k, v in options.items())
    values = value if options.get("multiselect") and isinstance(value, list) else [value]
    for v in values:
        if _is_choice(v, choices):
            continue
        is_local = upload and isinstance(v, str) and local is not None and local(v)
        # An empty list (a server that lists no file of that kind, fake_comfy's loaders) is not held against a
        # job: ComfyUI would refuse it at POST. A local file's name is.
        if choices or is_local:
            return Issue(node_id, class_type, name, "value_not_in_list",
                         f"{name} {_short(v)} is not on this server" + (f"; {send_hint(v)}" if is_local else ""),
                         v, tuple(choices), is_local)
    return None


def _is_choice(value: Any, choices: list[Any]) -> bool:
    """Whether ``value`` is one of ``choices`` (an unhashable value, a list, is none of a set's)."""
    try:
        return value in choices
    except TypeError:
        return False


def send_hint(name: str) -> str:
    return f"to send this local file, write {json.dumps({'file': name})}"


def _shown(choices: Iterable[Any]) -> str:
    listed = sorted({repr(c) for c in choices})
    more = f", … {len(listed) - MAX_CHOICES_SHOWN} more" if len(listed) > MAX_CHOICES_SHOWN else ""
    return ", ".join(c.strip("'") for c in listed[:MAX_CHOICES_SHOWN]) + more if listed else "none"


def refusal_text(issues: Mapping[int, Issue], catalogues: Mapping[int, Catalogue]) -> str:
    """One reason for a job that every catalogue refuses, each catalogue's first issue given."""
    return "; ".join(refusal_texts({cid: [issue] for cid, issue in issues.items()}, catalogues))


def refusal_texts(issues: Mapping[int, Sequence[Issue]], catalogues: Mapping[int, Catalogue],
                  set_keys: Iterable[str] = (), hints: Hints | None = None) -> list[str]:
    """Why no catalogue can run a job, one reason a problem: each that every catalogue has, worded once for all
    of them (with "did you mean"); then, when each catalogue still has others of its own, each server's first.
    ``set_keys``: the line's ``set``, whose values are named as set there."""
    hints = hints or Hints(catalogues)
    keyed = [{i.key(): i for i in found} for found in issues.values()]
    common = [k for k in keyed[0] if all(k in other for other in keyed[1:])]
    overrides = frozenset(set_keys)
    texts = [_worded([found[k] for found in keyed], hints, overrides) for k in common]
    rest = {cid: [i for i in found if i.key() not in common] for cid, found in issues.items()}
    if all(rest.values()):
        texts.append("no server can run it: " + "; ".join(
            f"{catalogues[c].label if c in catalogues else f'catalogue {c}'}: node {i[0].node_id} ({i[0].class_type}) "
            f"{i[0].text}" for c, i in rest.items()))
    return texts


def _worded(same: list[Issue], hints: Hints, overrides: frozenset[str]) -> str:
    """One problem that every catalogue has, as a person reads it."""
    first = same[0]
    where = f"node {first.node_id} ({first.class_type})" if first.input is not None else f"node {first.node_id}"
    if first.kind == "missing_node_type":
        text = f"{where}: class {first.class_type!r} is on no server (its custom node is not installed on any)"
        return _and(text, hints.class_name(first.class_type))
    if first.kind == "value_not_in_list":
        known = [c for i in same for c in i.choices]
        text = f"{where}: {first.input} {_short(first.value)} is not on any server (known: {_shown(known)})"
        if first.local and isinstance(first.value, str):
            return f"{text}; {send_hint(first.value)}"
        return _and(text, hints.choice(first.class_type, first.input or "", first.value, known))
    if first.kind == "link_only":
        in_set = f"{first.node_id}.{first.input}" in overrides
        return f"{where}: {first.text}; " + ("link it in the workflow, not in set" if in_set else
                                             'link it to a node\'s output: ["<node id>", <output index>]')
    return f"{where}: {first.text}"


def _and(text: str, hint: str) -> str:
    return f"{text}; {hint}" if hint else text


class Hints:
    """"did you mean" against one set of catalogues, each answer worked out once: a file of 100,000 lines with
    the same typo asks the same question 100,000 times, and a catalogue may list thousands of classes or files."""

    def __init__(self, catalogues: Mapping[int, Catalogue]) -> None:
        self.catalogues = catalogues
        self._classes: set[str] | None = None
        self._answers: dict[tuple[Any, ...], str] = {}

    def class_name(self, word: str) -> str:
        if self._classes is None:
            self._classes = {name for c in self.catalogues.values() for name in c.info}
        return self._answer(("class", word), word, self._classes)

    def choice(self, class_type: str, name: str, word: Any, choices: Sequence[Any]) -> str:
        if not isinstance(word, str):
            return ""
        return self._answer(("choice", class_type, name, word), word, choices)

    def _answer(self, key: tuple[Any, ...], word: str, candidates: Iterable[Any]) -> str:
        found = self._answers.get(key)
        if found is None:
            if len(self._answers) > 10_000:
                self._answers.clear()
            found = self._answers[key] = did_you_mean(word, candidates)
        return found


def first_issue(workflow: Mapping[str, Any], catalogue: Mapping[str, Any]) -> Issue | None:
    """The first node (in id order) that ``catalogue`` cannot run, or None: what a runner checks at claim."""
    for node_id in sorted(workflow):
        issue = check_node(node_id, workflow[node_id], catalogue)
        if issue is not None:
            return issue
    return None


def node_order(node_id: str) -> tuple[int, int, str]:
    """Nodes in the order a person counts them: 2 before 10, then any other id."""
    return (0, int(node_id), node_id) if node_id.isdigit() else (1, 0, node_id)


class TemplateCheck:
    """A template's nodes checked once per catalogue; a line's changed nodes checked again alone."""

    def __init__(self, workflow: Mapping[str, Any], catalogues: Mapping[int, Catalogue],
                 local: LocalFile | None = None) -> None:
        self.workflow = workflow
        self.catalogues = catalogues
        self.local = local
        self.issues: dict[int, dict[str, list[Issue]]] = {
            cid: {n: found for n in workflow if (found := node_issues(n, workflow[n], c.info, local))}
            for cid, c in catalogues.items()}

    def refusals(self, changed: Mapping[str, Any]) -> dict[int, Issue]:
        """The catalogues that refuse the template with ``changed`` nodes, each with its first issue."""
        return {cid: found[0] for cid, found in self.all_refusals(changed).items()}

    def all_refusals(self, changed: Mapping[str, Any]) -> dict[int, list[Issue]]:
        """The catalogues that refuse the template with ``changed`` nodes, each with every issue, node by node."""
        refused: dict[int, list[Issue]] = {}
        for cid, catalogue in self.catalogues.items():
            base = self.issues[cid]
            found: list[Issue] = []
            for node_id in sorted(set(base) | set(changed) if base else changed, key=node_order):
                found += (self._changed(node_id, changed[node_id], catalogue.info, node_id in base)
                          if node_id in changed else base[node_id])
            if found:
                refused[cid] = found
        return refused

    def _changed(self, node_id: str, node: Mapping[str, Any], info: Mapping[str, Any], failed: bool) -> list[Issue]:
        """A node a line changed: only the inputs whose values differ from the template's are checked again,
        unless the template's own node failed, its class changed, or an input went missing."""
        template = self.workflow.get(node_id)
        if failed or not isinstance(template, dict) or template.get("class_type") != node.get("class_type"):
            return node_issues(node_id, node, info, self.local)
        inputs, base = node.get("inputs") or {}, template.get("inputs") or {}
        if not base.keys() <= inputs.keys():
            return node_issues(node_id, node, info, self.local)
        class_info = info.get(node["class_type"])
        if not isinstance(class_info, dict):
            return node_issues(node_id, node, info, self.local)
        found = []
        for name, value in inputs.items():
            if value is not base.get(name, _MISSING):
                issue = check_input(node_id, node["class_type"], class_info, name, value, self.local)
                if issue is not None:
                    found.append(issue)
        return found


_MISSING = object()
