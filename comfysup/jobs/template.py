"""Workflow files named by jobs lines, parsed and checked once however many lines name them; a changed
node's text assembled from its inputs' texts, so a large file is not encoded again per line."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from comfysup.jobs.brought import Brought, bring, bring_image, is_image
from comfysup.jobs.graph import ObjectInfo, check_api_format, check_graph, is_link
from comfysup.jobs.values import JobLineError, check_depth, loads_strict
from comfysup.workflows import canonical, content_hash, model_key, touches_loader

MAX_WORKFLOW_BYTES = 16 * 1024 * 1024


class Template:
    """A workflow file parsed and checked once, shared by every line that names it.

    A line's ``set`` copies only the nodes it changes; the canonical text is assembled from each node's
    text, encoded once, so a 10 KB workflow is neither parsed nor encoded again for each of 100,000
    lines. A changed node is assembled the same way from its inputs' texts, only the values that its
    line changed encoded again (not the whole node, for every line). The text
    is exactly ``canonical(workflow)``: spec hashes do not depend on these shortcuts.
    """

    def __init__(self, workflow: dict[str, Any], name: str, brought: Brought | None = None) -> None:
        self.workflow = workflow
        self.name = name
        self.brought = brought or Brought(workflow)
        """What the file held: the UI workflow converted, or an image's (comfysup.jobs.brought)."""
        self.order = sorted(workflow)
        self.node_text = {k: f"{canonical(k)}:{canonical(workflow[k])}" for k in self.order}
        self._graph: tuple[list[str], JobLineError | None] | None = None
        self.stored = self.text({})
        """What the queue stores once for every line of this file: the workflow before any ``set``."""
        self.stored_hash = content_hash(self.stored)
        self.source_hash = self.brought.source_hash or self.stored_hash
        """What a line's derived id takes: the address of the workflow as the file holds it."""
        self._model_key = model_key(workflow) or ""
        self.index = {k: i for i, k in enumerate(self.order)}
        self._keys = {k: f"{canonical(k)}:" for k in self.order}
        self._layouts = {k: layout for k in self.order if (layout := _NodeLayout.of(workflow[k])) is not None}
        self._parts = [self.node_text[k].encode() for k in self.order]
        # sha256 states of the text so far before each node: a line's spec hash starts from the state before
        # the first node its set changes, rather than hashing the whole (10 KB) text again for every line.
        digest = hashlib.sha256(b"{")
        self._states = []
        for i, part in enumerate(self._parts):
            self._states.append(digest.copy())
            digest.update(part if i == len(self._parts) - 1 else part + b",")
        self._states.append(digest)

    def for_job(self, job_id: str) -> Template:
        """The template job ``job_id`` runs: this one, or where a dynamic prompt chooses, its own conversion."""
        if not self.brought.dynamic:
            return self
        return Template(self.brought.for_job(job_id), self.name, self.brought)

    def hasher(self, changed: dict[str, Any]) -> Any:
        """sha256 fed with exactly ``text(changed)``, from the saved state before the first changed node
        (see ``__init__``); the rest goes in as one buffer, which costs less than one update per node."""
        first = min((self.index[k] for k in changed), default=len(self._parts))
        digest = self._states[first].copy()
        if first < len(self._parts):
            parts = self._parts[first:]
            for key in changed:
                parts[self.index[key] - first] = (self._keys[key] + self._node_text(key, changed[key])).encode()
            digest.update(b",".join(parts))
        digest.update(b"}")
        return digest

    def model_key(self, changed: dict[str, Any]) -> str:
        """The model key of the template with ``changed`` nodes: the template's, unless a loader changed."""
        if changed and touches_loader(self.workflow, changed):
            return model_key({**self.workflow, **changed}) or ""
        return self._model_key

    def text(self, changed: dict[str, Any]) -> str:
        return "{" + ",".join(self._keys[k] + self._node_text(k, changed[k]) if k in changed else self.node_text[k]
                              for k in self.order) + "}"

    def _node_text(self, key: str, node: Any) -> str:
        """``canonical(node)`` for a changed copy of node ``key``."""
        layout = self._layouts.get(key)
        text = layout.text(node) if layout is not None else None
        return text if text is not None else canonical(node)

    def check(self, changed: dict[str, Any], overrides: dict[str, Any], object_info: ObjectInfo) -> list[str]:
        """check_graph's answer for this template with ``overrides`` (``changed``: the nodes they change).

        Overrides that set no link can only change values or drop links, which adds no cycle, no dangling
        link and no output node, so the template's own answer holds; it is computed once. A template that
        fails, or an override that sets a link, is checked in full (an override may also repair a link).
        """
        if self._graph is None:
            try:
                self._graph = (check_graph(self.workflow, object_info), None)
            except JobLineError as exc:
                self._graph = ([], exc)
        warnings, error = self._graph
        if error is None and not any(is_link(v) for v in overrides.values()):
            return list(warnings)
        return check_graph({**self.workflow, **changed}, object_info)


class _NodeLayout:
    """A template node's canonical text in pieces: what comes before its inputs, each input's
    ``"name":value``, what comes after. A copy of the node whose ``set`` changed some input values (and
    nothing else) is then the pieces with only those values encoded again."""

    _MARK = "\x00comfysup inputs\x00"

    def __init__(self, node: dict[str, Any], head: str, tail: str) -> None:
        self.node = node
        self.head, self.tail = head, tail
        self.names = sorted(node["inputs"])  # the order sort_keys gives
        self.quoted = [canonical(n) + ":" for n in self.names]
        self.pieces = [q + canonical(node["inputs"][n]) for q, n in zip(self.quoted, self.names, strict=True)]

    @classmethod
    def of(cls, node: Any) -> _NodeLayout | None:
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            return None
        text, mark = canonical({**node, "inputs": cls._MARK}), canonical(cls._MARK)
        if text.count(mark) != 1:  # the mark within the node's own strings: not worth a layout
            return None
        head, tail = text.split(mark)
        return cls(node, head, tail)

    def text(self, node: dict[str, Any]) -> str | None:
        """The copy's text, or None when it differs from the template in more than input values."""
        inputs, base = node.get("inputs"), self.node["inputs"]
        if not isinstance(inputs, dict) or len(inputs) != len(base) or len(node) != len(self.node):
            return None
        if any(v is not self.node.get(k, _NodeLayout) for k, v in node.items() if k != "inputs"):
            return None
        pieces = self.pieces
        for i, name in enumerate(self.names):
            value = inputs.get(name, _NodeLayout)
            if value is not base[name]:
                if value is _NodeLayout:  # an input renamed: same count, other names
                    return None
                if pieces is self.pieces:
                    pieces = list(pieces)
                pieces[i] = self.quoted[i] + canonical(value)
        return self.head + "{" + ",".join(pieces) + "}" + self.tail


class WorkflowCache:
    """Workflow files parsed and checked once per file, however many lines name them."""

    def __init__(self, object_info: ObjectInfo, catalogue_name: str = "the node catalogue") -> None:
        self.object_info = object_info
        self.catalogue_name = catalogue_name
        self._files: dict[Path, Template] = {}

    def template(self, path: Path) -> Template:
        """The workflow file at ``path`` (API or UI format, or an image ComfyUI saved), read once."""
        key = path.resolve()
        if key not in self._files:
            if not path.is_file():
                raise JobLineError(f"workflow file {str(path)!r} does not exist")
            brought = self._read(path)
            check_api_format(brought.prompt, f"workflow file {str(path)!r}")
            check_depth(brought.prompt, f"workflow file {str(path)!r}")
            self._files[key] = Template(brought.prompt, path.stem, brought)
        return self._files[key]

    def _read(self, path: Path) -> Brought:
        """The file's workflow as an API prompt: a JSON file's (a UI workflow converted), or an image's."""
        where = f"workflow file {str(path)!r}"
        with open(path, "rb") as file:
            head = file.read(12)
        if is_image(head):  # its metadata read within bounds, whatever the size of its pixels
            return bring_image(path, self.object_info.data, where, self.catalogue_name)
        if path.stat().st_size > MAX_WORKFLOW_BYTES:
            raise JobLineError(f"{where} is larger than {MAX_WORKFLOW_BYTES // 2**20} MiB")
        try:
            workflow = loads_strict(path.read_bytes())
        except JobLineError as exc:
            raise JobLineError(f"{where}: {exc}") from exc
        except RecursionError as exc:
            raise JobLineError(f"{where} is nested too deeply to be a workflow") from exc
        except ValueError as exc:
            raise JobLineError(f"{where} is not valid JSON: {exc}") from exc
        if not isinstance(workflow, dict):
            raise JobLineError(f"{where} is not an API-format workflow (expected an object of nodes)")
        return bring(workflow, self.object_info.data, where, self.catalogue_name)
