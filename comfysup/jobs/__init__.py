"""jobs.jsonl: read, validate and resolve jobs before anything reaches the queue.

A line is ``{"id", "workflow", "set", "priority", "extra_data", "meta"}`` (DESIGN.md "Jobs"). The
whole file is checked first and every problem is reported as ``file:line: reason``; only a clean file
is inserted, in one transaction. The graph checks are the ones ComfyUI would make at POST /prompt
(links to existing nodes, no cycles, an output node), so a bad job is refused at submit rather than
dead-lettered an hour later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from comfysup.config import InputsConfig
from comfysup.errors import ComfysupError
from comfysup.jobs import identity
from comfysup.jobs.catalogue import Catalogue, Hints, TemplateCheck, refusal_texts
from comfysup.jobs.graph import (  # noqa: F401  (the names callers import from comfysup.jobs)
    BUILTIN_OTHER_NODES,
    BUILTIN_OUTPUT_NODES,
    ObjectInfo,
    apply_set,
    check_api_format,
    check_graph,
)
from comfysup.jobs.identity import as_written, derived_id, sorted_json
from comfysup.jobs.inputs import InputFiles
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

MAX_LINE_BYTES = 16 * 1024 * 1024
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
    hidden: int = 0
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
        if max_input_bytes is not None:
            self.inputs.max_file_bytes = max_input_bytes
        if max_job_input_bytes is not None:
            self.inputs.max_job_bytes = max_job_input_bytes
        self.inputs.remote = remote or self.inputs.remote
        self.inputs.s3_buckets = self.inputs.s3_buckets if s3_buckets is None else tuple(s3_buckets)
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
        self._hints = Hints(self.catalogues)
        self._local: dict[str, bool] = {}
        self._any_refused: bool | None = None
        """Whether ``validate`` met a line that some catalogue refused; False: building the jobs skips the check."""
        """Each template's nodes checked against every catalogue once, by id(template)."""
        self.cache = WorkflowCache(self.object_info)
        self._named: dict[str, Template] = {}
        """Workflow text by the path as the lines spell it: resolving it again for every line (realpath,
        one lstat per path component) took half the time of a large submit."""

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
        """``jobs()``, read and built by a forked child process while the caller inserts what it has sent.

        A large submit is two parts of similar cost: reading lines and hashing their workflows (Python) and
        inserting the rows (SQLite); on two CPUs they overlap. Only each job's own fields cross the pipe, as
        a tuple (a batch of them pickles in a tenth of the time a batch of NewJobs with their workflows
        does): the queue stores ``template_json`` and ``params``, never ``workflow``, which is left empty.
        The child is the parent's fork, so it reads the file exactly as ``jobs()`` would; if it fails or
        dies, this raises and the caller's transaction rolls back: nothing is half-inserted.
        """
        import multiprocessing  # here: only a file of READ_AHEAD_LINES or more needs it, and every submit paid ~6 ms

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
                     key, refused, found) in payload:
                    yield NewJob(id=job_id, workflow=_NOT_SENT, spec_hash=spec_hash, priority=priority,
                                 extra_data=extra, meta=meta, params=params, workflow_name=name, workflow_json=text,
                                 callback_url=callback, template_json=template, template_hash=template_hash,
                                 model_key=key, refused=refused, assets=found)
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
                             job.template_hash, job.model_key, job.refused, job.assets))
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
        reasons: list[str] = []
        """Every problem of the line, in the order of its checks: all are reported, not only the first."""
        for unknown in () if line.keys() <= LINE_KEYS else sorted(line.keys() - LINE_KEYS):
            hint = did_you_mean(unknown, LINE_KEYS)
            reasons.append(f"unknown key {unknown!r}; {hint + ' ' if hint else ''}a line may have "
                           f"{', '.join(sorted(LINE_KEYS))}")
        derive = "id" not in line  # no id given: it is derived from the line's content, below
        job_id = ""
        if not derive:
            try:  # each check in a try of its own, not a call of _collect: a few microseconds a line, 100,000 lines
                job_id = canonical_id(line["id"])
            except JobLineError as exc:
                reasons += exc.reasons
        priority = line.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            reasons.append(f"priority {priority!r} is not a whole number")
        elif not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
            reasons.append(f"priority {priority} is out of range; expected a whole number from "
                           f"{PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]}")
        for key in ("extra_data", "meta"):
            if not isinstance(line.get(key, {}), dict):
                reasons.append(f"{key} must be an object")
        params = line.get("set", {})
        if not isinstance(params, dict):
            reasons.append(f"set must be an object of \"<node>.<input>\": value, not {type(params).__name__}")
            params = {}
        written = params
        try:
            params, found = self.inputs.resolve(written)
        except JobLineError as exc:
            reasons += exc.reasons
            found = ()
        named = as_written(written, params)  # what the id and the spec hash take (comfysup.jobs.identity)
        callback = "" if "callback_url" not in line else _collect(
            reasons, check_callback_url, line["callback_url"], allow_private=self.allow_private_callbacks)
        value = line.get("workflow")
        if isinstance(value, str):
            try:
                template = self._template(value)
            except JobLineError as exc:
                raise JobLineError(*reasons, *exc.reasons) from None
            if derive:
                job_id = derived_id(line, named, template.stored_hash)
                self.derived.add(job_id)
            changed = apply_set(template.workflow, params, self.object_info, reasons)
            warnings = (_collect(reasons, template.check, changed, params, self.object_info) or []) if check else []
            refused = self._refused(self._template_check(template), changed, check, reasons, params)
            if reasons:
                raise JobLineError(*reasons)
            if not build:
                return job_id, warnings
            workflow, name = {**template.workflow, **changed}, template.name
            # The text ComfyUI would be given is never stored (the template is, with the set): only its hash
            # is needed, and it starts from the template's saved state.
            text, digest = "", template.hasher(changed if named is params else
                                               apply_set(template.workflow, named, self.object_info, []))
            stored, stored_hash, key = template.stored, template.stored_hash, template.model_key(changed)
        else:
            inline, name = _collect(reasons, self._inline, value), "inline"
            if inline is None:
                raise JobLineError(*reasons)
            if derive:
                job_id = derived_id(line, named, content_hash(canonical(inline)))
                self.derived.add(job_id)
            workflow = {**inline, **apply_set(inline, params, self.object_info, reasons)}
            warnings = (_collect(reasons, check_graph, workflow, self.object_info) or []) if check else []
            checker = TemplateCheck(workflow, self.catalogues, self._local_file) if self.catalogues else None
            refused = self._refused(checker, {}, check, reasons, params)
            if reasons:
                raise JobLineError(*reasons)
            if not build:
                return job_id, warnings
            text = canonical(workflow)
            digest = hashlib.sha256((text if named is params else
                                     canonical({**inline, **apply_set(inline, named, self.object_info, [])})).encode())
            # Stored before its `set`, so lines that share an inline workflow share one stored copy.
            stored = canonical(inline) if params else text
            stored_hash, key = content_hash(stored), model_key(workflow) or ""
        meta = line.get("meta", {})
        extra = line.get("extra_data", {})
        # The spec hash: the applied workflow's text (an input from elsewhere as written: its fetched bytes never
        # make a redelivery a conflict), then these. The callback joins only when given, so the ids of every file
        # without one keep their hash.
        digest.update(b"\0")
        for part in (sorted_json(extra), sorted_json(meta), str(priority), *([callback] if callback else [])):
            digest.update(part.encode())
            digest.update(b"\0")
        if isinstance(meta.get("kind"), str) and meta["kind"]:
            name = meta["kind"]
        return NewJob(id=job_id, workflow=workflow, spec_hash=digest.hexdigest(), priority=priority,
                      extra_data=extra, meta=meta, params=params or {}, workflow_name=name,
                      workflow_json=text, callback_url=callback, template_json=stored, template_hash=stored_hash,
                      model_key=key, refused=refused, assets=found), warnings

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

    def _inline(self, value: Any) -> dict[str, Any]:
        if isinstance(value, dict):
            check_api_format(value, "the inline workflow")
            return value
        if value is None:
            raise JobLineError("workflow is missing: give a path relative to the jobs file, or an API-format "
                               "object")
        raise JobLineError(f"workflow must be a path or an API-format object, not {type(value).__name__}")


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


def __getattr__(name: str) -> Any:
    if name == "ID_NAMESPACE":  # made on first use (comfysup.jobs.identity): uuid is for lines without an id
        return identity.ID_NAMESPACE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
