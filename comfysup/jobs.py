"""jobs.jsonl: read, validate and resolve jobs before anything reaches the queue.

A line is ``{"id", "workflow", "set", "priority", "extra_data", "meta"}`` (DESIGN.md "Jobs"). The
whole file is checked first and every problem is reported as ``file:line: reason``; only a clean file
is inserted, in one transaction. The graph checks are the ones ComfyUI would make at POST /prompt
(links to existing nodes, no cycles, an output node), so a bad job is refused at submit rather than
dead-lettered an hour later.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlparse

from comfysup.destinations import url_problem
from comfysup.errors import ComfysupError
from comfysup.queue.base import NewJob
from comfysup.redact import display_url
from comfysup.workflows import canonical, content_hash, model_key, touches_loader

MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_WORKFLOW_BYTES = 16 * 1024 * 1024
MAX_LINES = 1_000_000
MAX_PROBLEMS_SHOWN = 50
READ_AHEAD_LINES = 5000
"""From this many lines, comfysup submit reads and builds the jobs in a second process while it inserts."""
READ_AHEAD_BATCH = 500
_NOT_SENT: Mapping[str, Any] = MappingProxyType({})
"""A read-ahead job's ``workflow``: the queue stores its template and ``params`` (see NewJob)."""
PRIORITY_RANGE = (-(2**63), 2**63 - 1)
"""What SQLite's INTEGER holds; a larger number would fail at insert, after validation said yes."""
LINE_KEYS = frozenset({"id", "workflow", "set", "priority", "extra_data", "meta", "callback_url"})
MAX_URL_CHARS = 2048
MAX_DEPTH = 64
"""Arrays and objects inside each other, at most: every walk over a job's data (masking, rendering, hashing)
then stays far from Python's recursion limit, and no workflow needs more than a handful of levels."""

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


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""Exactly the strings ``str(uuid.UUID(s)) == s`` accepts: checked first, uuid only to explain a refusal."""


class JobLineError(ValueError):
    """One line of a jobs file is invalid; the message is the reason a person reads."""


@dataclass
class Problem:
    line: int
    message: str
    warning: bool = False


@dataclass
class Validation:
    """What the first pass over a file found."""

    count: int = 0
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    lines_by_id: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def canonical_id(value: Any) -> str:
    """The id must be a lowercase hyphenated UUID exactly: it becomes ComfyUI's prompt id."""
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return value
    if not isinstance(value, str):
        raise JobLineError(f"id {value!r} is not a string; expected a lowercase hyphenated UUID like "
                           f"{uuid.UUID(int=0)}")
    try:
        parsed = str(uuid.UUID(value))
    except ValueError as exc:
        raise JobLineError(f"id {value!r} is not a UUID; expected a lowercase hyphenated UUID "
                           "(python -c 'import uuid; print(uuid.uuid4())')") from exc
    if parsed != value:
        raise JobLineError(f"id {value!r} is not in canonical form; write it as {parsed!r} (lowercase, "
                           "hyphenated): ComfyUI uses it as the prompt id")
    return value


def _reject_constant(name: str) -> Any:
    raise JobLineError(f"{name} is not valid JSON; use null or a number")


def _finite_float(text: str) -> float:
    """A number too large for a float (``1e999``) is infinity, which json would accept silently."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise JobLineError(f"{text[:40]} is too large for a number (it would be Infinity); use a smaller one")
    return value


_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
"""One decoder for every line: json.loads with an argument builds a new one per call."""


def loads_strict(text: str | bytes) -> Any:
    """JSON without NaN or Infinity, which ComfyUI's own JSON handling would not round-trip."""
    if isinstance(text, bytes | bytearray):
        try:
            text = text.decode("utf-8-sig")  # a BOM, as json.loads of bytes accepts (editors on Windows)
        except UnicodeDecodeError:
            return json.loads(text, parse_constant=_reject_constant)  # its error, for the message
    return _STRICT.decode(text)


def depth(value: Any) -> int:
    """How many arrays and objects are nested at the deepest point of ``value``, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def check_depth(value: Any, what: str, raw: bytes | None = None) -> None:
    """JobLineError when ``value`` nests deeper than MAX_DEPTH. With its ``raw`` text, a line that has
    fewer brackets than that in all is passed without a walk: most lines have a handful."""
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    if depth(value) > MAX_DEPTH:
        raise JobLineError(f"{what} is nested more than {MAX_DEPTH} levels deep (arrays or objects inside each "
                           "other); flatten it")


def check_text(value: str, what: str) -> str:
    """A path or URL that the file system or the network can take: no NUL byte, no lone surrogate."""
    if "\0" in value:
        raise JobLineError(f"{what} {value[:100]!r} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JobLineError(f"{what} {value[:100]!r} contains a lone surrogate (\\u{ord(value[exc.start]):04x}), "
                           "which is not text; write the character itself") from None
    return value


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


class Template:
    """A workflow file parsed and checked once, shared by every line that names it.

    A line's ``set`` copies only the nodes it changes; the canonical text is assembled from each node's
    text, encoded once, so a 10 KB workflow is neither parsed nor encoded again for each of 100,000
    lines. A changed node is assembled the same way from its inputs' texts, only the values that its
    line changed encoded again (encoding the whole node took most of a submit's time per line). The text
    is exactly ``canonical(workflow)``: spec hashes do not depend on these shortcuts.
    """

    def __init__(self, workflow: dict[str, Any], name: str) -> None:
        self.workflow = workflow
        self.name = name
        self.order = sorted(workflow)
        self.node_text = {k: f"{canonical(k)}:{canonical(workflow[k])}" for k in self.order}
        self._graph: tuple[list[str], JobLineError | None] | None = None
        self.stored = self.text({})
        """What the queue stores once for every line of this file: the workflow before any ``set``."""
        self.stored_hash = content_hash(self.stored)
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
        if error is None and not any(_is_link(v) for v in overrides.values()):
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

    def __init__(self, object_info: ObjectInfo) -> None:
        self.object_info = object_info
        self._files: dict[Path, Template] = {}

    def template(self, path: Path) -> Template:
        """The API-format workflow file at ``path``, parsed once."""
        key = path.resolve()
        if key not in self._files:
            if not path.is_file():
                raise JobLineError(f"workflow file {str(path)!r} does not exist")
            if path.stat().st_size > MAX_WORKFLOW_BYTES:
                raise JobLineError(f"workflow file {str(path)!r} is larger than "
                                   f"{MAX_WORKFLOW_BYTES // 2**20} MiB")
            try:
                workflow = loads_strict(path.read_bytes())
            except JobLineError as exc:
                raise JobLineError(f"workflow file {str(path)!r}: {exc}") from exc
            except RecursionError as exc:
                raise JobLineError(f"workflow file {str(path)!r} is nested too deeply to be a workflow") from exc
            except ValueError as exc:
                raise JobLineError(f"workflow file {str(path)!r} is not valid JSON: {exc}") from exc
            check_api_format(workflow, f"workflow file {str(path)!r}")
            check_depth(workflow, f"workflow file {str(path)!r}")
            self._files[key] = Template(workflow, path.stem)
        return self._files[key]


def check_callback_url(value: Any, *, allow_private: bool = False) -> str:
    """A job's webhook: an http(s) URL with a host, checked at submit rather than failing at its end; not to
    this machine or a private network unless ``allow_private`` (comfysup.destinations)."""
    if value in ("", None):
        return ""
    if not isinstance(value, str) or len(value) > MAX_URL_CHARS:
        raise JobLineError(f"callback_url must be an http:// or https:// URL of at most {MAX_URL_CHARS} characters")
    check_text(value, "callback_url")
    try:
        parsed = urlparse(value)
        ok = parsed.scheme in ("http", "https") and bool(parsed.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise JobLineError(f"callback_url {value[:100]!r} is not an http:// or https:// URL with a host")
    if not allow_private and (problem := url_problem(value)):
        raise JobLineError(f"callback_url {display_url(value)}: {problem}; set [webhooks] allow_private = true to "
                           "send webhooks inside this network")
    return value


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


def _is_link(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and not isinstance(value[1], bool))


def check_graph(workflow: dict[str, Any], object_info: ObjectInfo) -> list[str]:
    """Raise on a broken graph (dangling link, cycle, no output node); return warnings."""
    edges: dict[str, list[str]] = {}
    for node_id, node in workflow.items():
        edges[node_id] = []
        for name, value in node.get("inputs", {}).items():
            if _is_link(value):
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
    return [f"no known output node; {', '.join(unknown)} unknown here (run a server once so comfysup caches "
            "its /object_info); ComfyUI refuses the job if none of them is an output node"]


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


def apply_set(workflow: dict[str, Any], overrides: Any, object_info: ObjectInfo) -> dict[str, Any]:
    """The nodes that ``"<node>.<input>": value`` overrides change, as copies; ``workflow`` is left as it is
    (it may be a template shared by many lines). The node and the input must exist."""
    if not isinstance(overrides, dict):
        raise JobLineError(f"set must be an object of \"<node>.<input>\": value, not {type(overrides).__name__}")
    changed: dict[str, Any] = {}
    for key, value in overrides.items():
        node_id, dot, name = key.rpartition(".")
        if not dot or not node_id or not name:
            raise JobLineError(f"set key {key!r} is not \"<node>.<input>\" (for example \"3.seed\")")
        node = changed.get(node_id) or workflow.get(node_id)
        if node is None:
            raise JobLineError(f"set key {key!r} names node {node_id!r}, which is not in the workflow "
                               f"(nodes: {', '.join(sorted(workflow)[:20])})")
        inputs = node.get("inputs", {})
        if name not in inputs and ((allowed := object_info.inputs(node["class_type"])) is None or name not in allowed):
            raise JobLineError(f"set key {key!r}: node {node_id} ({node['class_type']}) has no input {name!r} "
                               f"(inputs: {', '.join(sorted(inputs)) or 'none'})")
        if node_id not in changed:
            node = changed[node_id] = {**node, "inputs": dict(inputs)}
        node["inputs"][name] = value
    return changed


class JobsFile:
    """A jobs file read twice: once to validate everything, once to yield jobs for one transaction."""

    def __init__(self, path: Path, *, label: str | None = None, base_dir: Path | None = None,
                 object_info: ObjectInfo | None = None, allow_private_callbacks: bool = False) -> None:
        self.path = path
        self.allow_private_callbacks = allow_private_callbacks
        """[webhooks] allow_private: a callback_url may then name this machine or a private network."""
        self.label = label or str(path)
        self.base_dir = base_dir if base_dir is not None else path.resolve().parent
        self.object_info = object_info or ObjectInfo()
        self.cache = WorkflowCache(self.object_info)
        self._named: dict[str, Template] = {}
        """Workflow text by the path as the lines spell it: resolving it again for every line (realpath,
        one lstat per path component) took half the time of a large submit."""

    def _lines(self) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            yield from enumerate(f, start=1)

    def validate(self) -> Validation:
        result = Validation()
        for number, raw in self._lines():
            if not raw.strip():
                continue
            if number > MAX_LINES:
                result.problems.append(Problem(number, f"the file has more than {MAX_LINES:,} lines; split it"))
                break
            try:
                job_id, warnings = self._parse(raw, check=True, build=False)
            except JobLineError as exc:
                result.problems.append(Problem(number, str(exc)))
                continue
            result.count += 1
            result.warnings += [Problem(number, w, warning=True) for w in warnings]
            first = result.lines_by_id.get(job_id)
            if first is not None:
                result.problems.append(Problem(number, f"id {job_id} appears twice (first on line {first})"))
            else:
                result.lines_by_id[job_id] = number
        return result

    def jobs(self) -> Iterator[NewJob]:
        """The jobs of a file that ``validate`` found clean; the graph checks are not repeated."""
        for _number, raw in self._lines():
            if raw.strip():
                yield self.parse(raw, check=False)[0]

    def jobs_read_ahead(self, batch: int = READ_AHEAD_BATCH) -> Iterator[NewJob]:
        """``jobs()``, read and built by a forked child process while the caller inserts what it has sent.

        A large submit is two parts of similar cost: reading lines and hashing their workflows (Python) and
        inserting the rows (SQLite); on two CPUs they overlap. Only each job's own fields cross the pipe, as
        a tuple (a batch of them pickles in a tenth of the time a batch of NewJobs with their workflows
        does): the queue stores ``template_json`` and ``params``, never ``workflow``, which is left empty.
        The child is the parent's fork, so it reads the file exactly as ``jobs()`` would; if it fails or
        dies, this raises and the caller's transaction rolls back: nothing is half-inserted.
        """
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=self._send_jobs, args=(receive, send, batch), name="comfysup-submit-reader",
                                daemon=True)
        child.start()
        send.close()
        try:
            while True:
                try:
                    kind, payload = receive.recv()
                except EOFError:
                    child.join(5.0)
                    raise ComfysupError(f"{self.label}: the process reading the file stopped (exit code "
                                        f"{child.exitcode}) before its end; nothing was submitted") from None
                if kind == "end":
                    return
                if kind == "error":
                    raise ComfysupError(f"{self.label}: reading the file failed: {payload}; nothing was submitted")
                for (job_id, spec_hash, priority, extra, meta, params, name, text, callback, template, template_hash,
                     key) in payload:
                    yield NewJob(id=job_id, workflow=_NOT_SENT, spec_hash=spec_hash, priority=priority,
                                 extra_data=extra, meta=meta, params=params, workflow_name=name, workflow_json=text,
                                 callback_url=callback, template_json=template, template_hash=template_hash,
                                 model_key=key)
        finally:
            receive.close()
            child.join(5.0)
            if child.is_alive():
                child.kill()
                child.join()

    def _send_jobs(self, receive: Any, send: Any, batch: int) -> None:
        """The child's side of ``jobs_read_ahead``. Its inherited copy of the reading end is closed first:
        with the parent gone (kill -9), the next send then fails and the child ends, instead of filling a
        pipe that it alone still held open and waiting on it forever."""
        receive.close()
        try:
            rows: list[tuple[Any, ...]] = []
            for job in self.jobs():
                rows.append((job.id, job.spec_hash, job.priority, job.extra_data, job.meta, job.params,
                             job.workflow_name, job.workflow_json, job.callback_url, job.template_json,
                             job.template_hash, job.model_key))
                if len(rows) >= batch:
                    send.send(("jobs", rows))
                    rows = []
            send.send(("jobs", rows))
            send.send(("end", None))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the parent stopped reading: it is rolling back, or gone
        except Exception as exc:  # sent to the parent, which raises it in its own transaction
            try:
                send.send(("error", f"{type(exc).__name__}: {exc}"))
            except OSError:
                pass
        finally:
            send.close()

    def parse(self, raw: bytes, *, check: bool) -> tuple[NewJob, list[str]]:
        """One line as a job (with ``check``, the graph checks too) and its warnings; JobLineError if bad."""
        return self._parse(raw, check=check, build=True)

    def _parse(self, raw: bytes, *, check: bool, build: bool) -> tuple[Any, list[str]]:
        """The line's checks; with ``build`` the NewJob (its hashes, model key), else only its id. The first
        pass over a file needs no hash: 100,000 lines of a 10 KB workflow are a gigabyte to hash."""
        if len(raw) > MAX_LINE_BYTES:
            raise JobLineError(f"the line is larger than {MAX_LINE_BYTES // 2**20} MiB")
        try:
            line = loads_strict(raw)
        except JobLineError:
            raise
        except RecursionError as exc:
            raise JobLineError("the line is nested too deeply (JSON arrays or objects inside each other)") from exc
        except ValueError as exc:
            raise JobLineError(f"not valid JSON: {exc}") from exc
        if not isinstance(line, dict):
            raise JobLineError(f"expected a JSON object, got {type(line).__name__}")
        check_depth(line, "the line", raw)
        unknown = set(line) - LINE_KEYS
        if unknown:
            raise JobLineError(f"unknown key {sorted(unknown)[0]!r}; a line may have "
                               f"{', '.join(sorted(LINE_KEYS))}")
        job_id = canonical_id(line.get("id"))
        priority = line.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise JobLineError(f"priority {priority!r} is not a whole number")
        if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
            raise JobLineError(f"priority {priority} is out of range; expected a whole number from "
                               f"{PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]}")
        for key in ("extra_data", "meta"):
            if not isinstance(line.get(key, {}), dict):
                raise JobLineError(f"{key} must be an object")
        params = line.get("set", {})
        if not isinstance(params, dict):
            raise JobLineError(f"set must be an object of \"<node>.<input>\": value, not {type(params).__name__}")
        callback = check_callback_url(line.get("callback_url", ""), allow_private=self.allow_private_callbacks)
        value = line.get("workflow")
        if isinstance(value, str):
            template = self._template(value)
            changed = apply_set(template.workflow, params, self.object_info)
            warnings = template.check(changed, params, self.object_info) if check else []
            if not build:
                return job_id, warnings
            workflow, name = {**template.workflow, **changed}, template.name
            # The text ComfyUI would be given is never stored (the template is, with the set): only its hash
            # is needed, and it starts from the template's saved state.
            text, digest = "", template.hasher(changed)
            stored, stored_hash, key = template.stored, template.stored_hash, template.model_key(changed)
        else:
            inline, name = self._inline(value), "inline"
            workflow = {**inline, **apply_set(inline, params, self.object_info)}
            warnings = check_graph(workflow, self.object_info) if check else []
            if not build:
                return job_id, warnings
            text = canonical(workflow)
            digest = hashlib.sha256(text.encode())
            # Stored before its `set`, so lines that share an inline workflow share one stored copy.
            stored = canonical(inline) if params else text
            stored_hash, key = content_hash(stored), model_key(workflow) or ""
        meta = line.get("meta", {})
        extra = line.get("extra_data", {})
        # The spec hash: the applied workflow's text, then these. The callback joins only when given, so the
        # ids of every file without one keep their hash.
        digest.update(b"\0")
        for part in (_sorted_json(extra), _sorted_json(meta), str(priority), *([callback] if callback else [])):
            digest.update(part.encode())
            digest.update(b"\0")
        if isinstance(meta.get("kind"), str) and meta["kind"]:
            name = meta["kind"]
        return NewJob(id=job_id, workflow=workflow, spec_hash=digest.hexdigest(), priority=priority,
                      extra_data=extra, meta=meta, params=params or {}, workflow_name=name,
                      workflow_json=text, callback_url=callback, template_json=stored, template_hash=stored_hash,
                      model_key=key), warnings

    def _template(self, value: str) -> Template:
        if value not in self._named:
            check_text(value, "workflow path")
            path = Path(value)
            if not path.is_absolute():
                path = self.base_dir / path
            self._named[value] = self.cache.template(path)
        return self._named[value]

    def _inline(self, value: Any) -> dict[str, Any]:
        if isinstance(value, dict):
            check_api_format(value, "the inline workflow")
            return value
        if value is None:
            raise JobLineError("workflow is missing: give a path relative to the jobs file, or an API-format "
                               "object")
        raise JobLineError(f"workflow must be a path or an API-format object, not {type(value).__name__}")


def _sorted_json(value: dict[str, Any]) -> str:
    """json.dumps(value, sort_keys=True), without encoding the empty object most lines have."""
    return json.dumps(value, sort_keys=True) if value else "{}"


def format_problems(label: str, problems: list[Problem], limit: int = MAX_PROBLEMS_SHOWN) -> list[str]:
    lines = [f"{label}:{p.line}: {'warning: ' if p.warning else ''}{p.message}" for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"… and {len(problems) - limit} more problem(s) not shown")
    return lines
