"""jobs.jsonl: read, validate and resolve jobs before anything reaches the queue.

A line is ``{"id", "workflow", "set", "priority", "extra_data", "meta"}`` (docs/design.md "Jobs"). The
whole file is checked first and every problem is reported as ``file:line: reason``; only a clean file
is inserted, in one transaction. The graph checks are the ones ComfyUI would make at POST /prompt
(links to existing nodes, no cycles, an output node), so a bad job is refused at submit rather than
dead-lettered an hour later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

from comfysup.config import InputsConfig
from comfysup.jobs.brought import Brought, bring, name_by_id
from comfysup.jobs.catalogue import Catalogue, Hints, TemplateCheck, refusal_texts
from comfysup.jobs.graph import (  # noqa: F401  (the names callers import from comfysup.jobs)
    BUILTIN_OTHER_NODES,
    BUILTIN_OUTPUT_NODES,
    ObjectInfo,
    apply_set,
    check_api_format,
    check_graph,
)
from comfysup.jobs.identity import ID_NAMESPACE, as_written, derived_id, sorted_json  # noqa: F401
from comfysup.jobs.inputs import InputFiles
from comfysup.jobs.line import (  # noqa: F401
    LINE_KEYS,
    MAX_LINE_BYTES,
    PRIORITY_RANGE,
    Line,
    Made,
    load_line,
    new_job,
    priority_problems,
    tenant_problems,
    unknown_key,
)
from comfysup.jobs.readahead import read_ahead
from comfysup.jobs.template import MAX_WORKFLOW_BYTES, Template, WorkflowCache  # noqa: F401
from comfysup.jobs.values import (  # noqa: F401
    MAX_DEPTH,
    MAX_URL_CHARS,
    JobLineError,
    canonical_id,
    check_callback_url,
    check_depth,
    check_text,
    depth,
    did_you_mean,
    loads_strict,
    shown_reasons,
)
from comfysup.queue.base import NewJob
from comfysup.workflows import canonical, content_hash, model_key

if TYPE_CHECKING:
    from comfysup.jobs.fetch import Progress  # comfysup.jobs.fetch itself only where an input is fetched

MAX_LINES = 1_000_000
MAX_PROBLEMS_SHOWN = 50
READ_AHEAD_LINES = 5000
"""From this many lines, comfysup submit reads and builds the jobs in a second process while it inserts."""
READ_AHEAD_BATCH = 500

class Problem(NamedTuple):
    line: int
    message: str
    warning: bool = False


class Validation:
    """What the first pass over a file found (a plain class: submit imports it, and none of a dataclass's
    methods, made by ``exec`` at import, is needed)."""

    __slots__ = ("count", "hidden", "lines_by_id", "problems", "warnings")

    def __init__(self) -> None:
        self.count = 0
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        self.lines_by_id: dict[str, int] = {}
        self.hidden = 0
        """Problems of lines with more than MAX_REASONS, counted but not in ``problems``."""

    @property
    def problem_count(self) -> int:
        return len(self.problems) + self.hidden

    @property
    def ok(self) -> bool:
        return not self.problems


class JobsFile:
    """A jobs file read twice: once to validate everything, once to yield jobs for one transaction."""

    def __init__(self, path: Path, *, label: str | None = None, base_dir: Path | None = None,
                 object_info: ObjectInfo | None = None, allow_private_callbacks: bool = False,
                 catalogues: Sequence[Catalogue] = (), max_input_bytes: int | None = None,
                 max_job_input_bytes: int | None = None, input_roots: Sequence[Path] | None = None,
                 inputs_where: str = "the jobs file's folder", remote: InputsConfig | None = None,
                 s3_buckets: Sequence[str] | None = None, progress: Progress | None = None,
                 inputs: InputFiles | None = None) -> None:
        self.path = path
        self.allow_private_callbacks = allow_private_callbacks
        """[webhooks] allow_private: a callback_url may then name this machine or a private network."""
        self.label = label or str(path)
        self.base_dir = base_dir if base_dir is not None else path.resolve().parent
        self.inputs = inputs or InputFiles(self.base_dir, None if input_roots is None else tuple(input_roots),
                                           inputs_where)
        """Input files of ``set`` (comfysup.jobs.inputs): {"file": ...} below ``input_roots`` (None: the jobs file's
        folder; empty: none), {"url"|"s3": ...} fetched by ``remote`` from ``s3_buckets`` (None: any bucket)."""
        _bound_inputs(self.inputs, max_input_bytes, max_job_input_bytes, s3_buckets)
        self.inputs.remote = remote or self.inputs.remote
        self.inputs.progress = progress or self.inputs.progress
        self.derived: set[str] = set()
        """The ids this file's lines did not give, derived from their content (comfysup.jobs.derived_id)."""
        self.catalogues = {c.id: c for c in catalogues}
        """The node catalogues servers have now (comfysup.jobs.catalogue): a line that none can run is refused;
        one that only some can run keeps the others' refusals, which the claim of their servers honours."""
        if object_info is None and catalogues:
            object_info = ObjectInfo({name: info for c in catalogues for name, info in c.info.items()})
        self.object_info = object_info or ObjectInfo()
        self._checks: dict[int, TemplateCheck] = {}
        """Each template's nodes checked against every catalogue once, by id(template)."""
        self._hints = Hints(self.catalogues)
        self._local: dict[str, bool] = {}
        self._any_refused: bool | None = None
        """Whether ``validate`` met a line that some catalogue refused; False: building the jobs skips the check."""
        self.cache = WorkflowCache(self.object_info, _catalogue_name(catalogues))
        self._named: dict[str, Template] = {}
        """Workflow text by the path as the lines spell it: each path is resolved (realpath, one lstat per path
        component) once, not for every line that names it."""

    def close(self) -> None:
        """Remove the inputs fetched for this file's jobs (comfysup.jobs.inputs): call it once they are inserted
        into the queue, or refused."""
        self.inputs.release()

    def _lines(self) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            yield from enumerate(f, start=1)

    def validate(self) -> Validation:
        result = Validation()
        self._any_refused = False
        for number, raw in self._lines():
            if not raw.strip():
                continue
            if number > MAX_LINES:
                result.problems.append(Problem(number, f"the file has more than {MAX_LINES:,} lines; split it"))
                break
            try:
                job_id, warnings = self._parse(raw, check=True, build=False)
            except JobLineError as exc:
                shown = shown_reasons(exc.reasons) or [str(exc)]
                result.problems += [Problem(number, reason) for reason in shown]
                result.hidden += max(0, len(exc.reasons) - len(shown))
                continue
            result.count += 1
            result.warnings += [Problem(number, w, warning=True) for w in warnings]
            first = result.lines_by_id.get(job_id)
            if first is not None and job_id in self.derived:
                result.problems.append(Problem(number, f"the same job as line {first} (a line without an id is "
                                                       "named by its content); give each line an id to run it twice"))
            elif first is not None:
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
        """``jobs()``, read and built by a forked child process while the caller inserts what it has sent
        (comfysup.jobs.readahead); if the child fails or dies, this raises and nothing is half-inserted."""
        return read_ahead(self.jobs, self.label, batch)

    def parse(self, raw: bytes, *, check: bool) -> tuple[NewJob, list[str]]:
        """One line as a job (with ``check``, the graph checks too) and its warnings; JobLineError if bad."""
        return self._parse(raw, check=check, build=True)

    def _parse(self, raw: bytes, *, check: bool, build: bool) -> tuple[Any, list[str]]:
        """The line's checks; with ``build`` the NewJob (its hashes, model key), else only its id. The first
        pass over a file needs no hash: 100,000 lines of a 10 KB workflow are a gigabyte to hash."""
        line = self._line(raw)
        value = line.fields.get("workflow")
        if isinstance(value, str):
            made = self._from_template(line, value, check, build)
        else:
            made = self._from_inline(line, value, check, build)
        if made is None:
            return line.job_id, line.warnings
        return new_job(line, made), line.warnings

    def _line(self, raw: bytes) -> Line:
        """The line's own fields checked, its ``set`` resolved (input files read, inputs from elsewhere fetched);
        every problem is in its ``reasons``, in the order of its checks: all are reported, not only the first."""
        fields = load_line(raw)
        reasons = [unknown_key(unknown) for unknown in sorted(fields.keys() - LINE_KEYS)]
        job_id = ""
        if "id" in fields:  # without one, the id is derived from the line's content once its workflow is read
            try:  # a try of its own, not a call of _collect: this runs for every line of a file
                job_id = canonical_id(fields["id"])
            except JobLineError as exc:
                reasons += exc.reasons
        priority = fields.get("priority", 0)
        reasons += priority_problems(priority)
        reasons += tenant_problems(fields.get("tenant"))
        reasons += [f"{key} must be an object" for key in ("extra_data", "meta")
                    if not isinstance(fields.get(key, {}), dict)]
        written = fields.get("set", {})
        if not isinstance(written, dict):
            reasons.append(f"set must be an object of \"<node>.<input>\": value, not {type(written).__name__}")
            written = {}
        try:
            params, found = self.inputs.resolve(written)
        except JobLineError as exc:
            reasons += exc.reasons
            params, found = written, ()
        callback = "" if "callback_url" not in fields else _collect(
            reasons, check_callback_url, fields["callback_url"], allow_private=self.allow_private_callbacks)
        # What the id and the spec hash take (comfysup.jobs.identity).
        return Line(fields, job_id, priority, params, as_written(written, params), found, callback, reasons)

    def _derive_id(self, line: Line, workflow_hash: str) -> None:
        """The id of a line that gives none, from its content; remembered as derived (``derived``)."""
        if "id" not in line.fields:
            line.job_id = derived_id(line.fields, line.named, workflow_hash)
            self.derived.add(line.job_id)

    def _from_template(self, line: Line, value: str, check: bool, build: bool) -> Made | None:
        """A line whose workflow is a file's: checked (and with ``build``, applied and hashed) against the template
        read once for every line that names it."""
        try:
            template = self._template(value)
        except JobLineError as exc:
            raise JobLineError(*line.reasons, *exc.reasons) from None
        self._derive_id(line, template.source_hash)
        name_by_id(template.workflow, line)
        ran = template.for_job(line.job_id) if build else template
        changed = apply_set(ran.workflow, line.params, self.object_info, line.reasons)
        if check:
            line.warnings = _collect(line.reasons, ran.check, changed, line.params, self.object_info) or []
        refused = self._refused(self._template_check(template), changed, check, line.reasons, line.params)
        if line.reasons:
            raise JobLineError(*line.reasons)
        if not build:
            return None
        # The text ComfyUI would be given is never stored (the template is, with the set): only its hash
        # is needed, and it starts from the template's saved state.
        named = changed
        if line.named is not line.params:  # an input from elsewhere: hashed as written
            named = apply_set(ran.workflow, line.named, self.object_info, [])
        return Made({**ran.workflow, **changed}, ran.name, "", ran.hasher(named), ran.stored, ran.stored_hash,
                    ran.model_key(changed), refused, ran.brought.ui)

    def _from_inline(self, line: Line, value: Any, check: bool, build: bool) -> Made | None:
        """A line whose workflow is in the line itself: checked as ComfyUI would (and with ``build``, hashed)."""
        brought = _collect(line.reasons, self._inline, value)
        if brought is None:
            raise JobLineError(*line.reasons)
        self._derive_id(line, brought.source_hash or content_hash(canonical(brought.prompt)))
        inline = brought.for_job(line.job_id)
        name_by_id(inline, line)
        workflow = {**inline, **apply_set(inline, line.params, self.object_info, line.reasons)}
        if check:
            line.warnings = _collect(line.reasons, check_graph, workflow, self.object_info) or []
        checker = TemplateCheck(workflow, self.catalogues, self._local_file) if self.catalogues else None
        refused = self._refused(checker, {}, check, line.reasons, line.params)
        if line.reasons:
            raise JobLineError(*line.reasons)
        if not build:
            return None
        text = canonical(workflow)
        named = text if line.named is line.params else canonical(
            {**inline, **apply_set(inline, line.named, self.object_info, [])})
        # Stored before its `set`, so lines that share an inline workflow share one stored copy.
        stored = canonical(inline) if line.params else text
        return Made(workflow, "inline", text, hashlib.sha256(named.encode()), stored, content_hash(stored),
                    model_key(workflow) or "", refused, brought.ui)

    def _template_check(self, template: Template) -> TemplateCheck | None:
        if not self.catalogues:
            return None
        found = self._checks.get(id(template))
        if found is None:
            found = self._checks[id(template)] = TemplateCheck(template.workflow, self.catalogues, self._local_file)
        return found

    def _refused(self, checker: TemplateCheck | None, changed: dict[str, Any], check: bool, reasons: list[str],
                 params: Mapping[str, Any]) -> tuple[tuple[int, str], ...]:
        """(catalogue id, reason) for each catalogue that cannot run the line; with ``check``, when none can
        (ComfyUI on every server would refuse it at POST), each problem added to ``reasons``."""
        if checker is None or (not check and self._any_refused is False):
            return ()
        issues = checker.all_refusals(changed)
        if check and issues:
            self._any_refused = True
        if check and issues and len(issues) == len(self.catalogues):
            reasons += refusal_texts(issues, self.catalogues, params, self._hints)
            return ()
        return tuple((cid, f"node {i[0].node_id} ({i[0].class_type}): {i[0].text}") for cid, i in issues.items())

    def _local_file(self, name: str) -> bool:
        """Whether ``name`` is a file below the folders a ``{"file": …}`` value may name (the jobs file's): a file
        input whose value names no file the servers list, but one here, which the line meant to send."""
        found = self._local.get(name)
        if found is None:
            relative = PurePosixPath(name.replace("\\", "/"))
            try:
                found = bool(name) and "\0" not in name and not relative.is_absolute() and ".." not in relative.parts \
                    and any((root / relative).is_file() for root in self.inputs.roots or ())
            except (OSError, ValueError):  # a name the file system cannot take (a lone surrogate, too long)
                found = False
            if len(self._local) > 10_000:
                self._local.clear()
            self._local[name] = found
        return found

    def _template(self, value: str) -> Template:
        if value not in self._named:
            check_text(value, "workflow path")
            path = Path(value)
            if not path.is_absolute():
                path = self.base_dir / path
            self._named[value] = self.cache.template(path)
        return self._named[value]

    def _inline(self, value: Any) -> Brought:
        if isinstance(value, dict):
            brought = bring(value, self.object_info.data, "the inline workflow", self.cache.catalogue_name)
            check_api_format(brought.prompt, "the inline workflow")
            return brought
        if value is None:
            raise JobLineError("workflow is missing: give a path relative to the jobs file, or a workflow object "
                               "(API or UI format)")
        raise JobLineError(f"workflow must be a path or a workflow object, not {type(value).__name__}")


def _bound_inputs(inputs: InputFiles, max_file_bytes: int | None, max_job_bytes: int | None,
                  s3_buckets: Sequence[str] | None) -> None:
    """The bounds a JobsFile was given, set on its InputFiles; each None leaves the InputFiles' own."""
    if max_file_bytes is not None:
        inputs.max_file_bytes = max_file_bytes
    if max_job_bytes is not None:
        inputs.max_job_bytes = max_job_bytes
    if s3_buckets is not None:
        inputs.s3_buckets = tuple(s3_buckets)


def _catalogue_name(catalogues: Sequence[Catalogue]) -> str:
    """How a refusal of a UI workflow's conversion names the catalogues it was converted with (their servers)."""
    if len(catalogues) > 1:
        return f"the node catalogue of every server ({'; '.join(c.label for c in catalogues)})"
    return f"the node catalogue of {catalogues[0].label}" if catalogues else "the node catalogue"


def _collect(reasons: list[str], check: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``check``'s answer; its JobLineError's reasons added to ``reasons`` instead (then None)."""
    try:
        return check(*args, **kwargs)
    except JobLineError as exc:
        reasons += exc.reasons
        return None


def format_problems(label: str, problems: list[Problem], limit: int = MAX_PROBLEMS_SHOWN) -> list[str]:
    lines = [f"{label}:{p.line}: {'warning: ' if p.warning else ''}{p.message}" for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"… and {len(problems) - limit} more problem(s) not shown")
    return lines
