"""One line of a jobs file: its JSON object read within bounds, the checks of its own fields, and the job it
becomes once its workflow is applied and hashed (comfysup.jobs.JobsFile reads the workflow between the two).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from comfysup.config.tenants import TENANT_NAME
from comfysup.jobs.identity import sorted_json
from comfysup.jobs.values import JobLineError, check_depth, did_you_mean, loads_strict
from comfysup.queue.base import NewJob

MAX_LINE_BYTES = 16 * 1024 * 1024
PRIORITY_RANGE = (-(2**63), 2**63 - 1)
"""What SQLite's INTEGER holds; a larger number would fail at insert, after validation said yes."""
LINE_KEYS = frozenset({"id", "workflow", "set", "priority", "extra_data", "meta", "callback_url", "tenant"})


class Line:
    """One line's own fields, checked: its id (derived once its workflow is read, when it gives none), its ``set``
    resolved and as written (``named``, what the id and the spec hash take), the assets it names, and every
    problem found so far."""

    __slots__ = ("callback", "fields", "found", "job_id", "named", "params", "priority", "reasons", "warnings")

    def __init__(self, fields: dict[str, Any], job_id: str, priority: Any, params: dict[str, Any],
                 named: dict[str, Any], found: tuple[Any, ...], callback: str, reasons: list[str],
                 warnings: list[str] | None = None) -> None:
        self.fields = fields
        self.job_id = job_id
        self.priority = priority
        self.params = params
        self.named = named
        self.found = found
        self.callback = callback
        self.reasons = reasons
        self.warnings: list[str] = [] if warnings is None else warnings


class Made(NamedTuple):
    """A line's workflow as its job stores it: the workflow applied, its label, the text ComfyUI is given (empty
    for a template's line: its template is stored), the spec hash begun, the stored template and its hash, the
    model key, and the catalogues that refuse it."""

    workflow: dict[str, Any]
    name: str
    text: str
    digest: Any
    stored: str
    stored_hash: str
    key: str
    refused: tuple[tuple[int, str], ...]
    ui: dict[str, Any] | None = None
    """The UI workflow the line's workflow was converted from (or its image carried): posted with the job."""


def load_line(raw: bytes) -> dict[str, Any]:
    """The line as a JSON object, bounded in size and depth; JobLineError if it is none."""
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
    return line


def unknown_key(unknown: str) -> str:
    hint = did_you_mean(unknown, LINE_KEYS)
    return f"unknown key {unknown!r}; {hint + ' ' if hint else ''}a line may have {', '.join(sorted(LINE_KEYS))}"


def tenant_problems(tenant: Any) -> list[str]:
    """A line's ``tenant``: absent (``default``), or a name as ``[tenants.NAME]`` spells one."""
    if tenant is None or (isinstance(tenant, str) and TENANT_NAME.fullmatch(tenant)):
        return []
    return [f"tenant {tenant!r} is not a tenant's name: 1 to 64 letters, digits, '_', '.' or '-'"]


def priority_problems(priority: Any) -> list[str]:
    if isinstance(priority, bool) or not isinstance(priority, int):
        return [f"priority {priority!r} is not a whole number"]
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        return [f"priority {priority} is out of range; expected a whole number from {PRIORITY_RANGE[0]} to "
                f"{PRIORITY_RANGE[1]}"]
    return []


def new_job(line: Line, made: Made) -> NewJob:
    """The job of a checked line. Its spec hash: the applied workflow's text (an input from elsewhere as written:
    its fetched bytes never make a redelivery a conflict), then its extra_data, meta, priority and, only when
    given, its callback, so the ids of every file without one keep their hash. The UI workflow a job came from is
    added to its extra_data after: the applied workflow already holds what it makes ComfyUI run."""
    meta = line.fields.get("meta", {})
    extra = line.fields.get("extra_data", {})
    digest = made.digest
    digest.update(b"\0")
    callback = [line.callback] if line.callback else []
    for part in (sorted_json(extra), sorted_json(meta), str(line.priority), *callback):
        digest.update(part.encode())
        digest.update(b"\0")
    name = meta["kind"] if isinstance(meta.get("kind"), str) and meta["kind"] else made.name
    return NewJob(id=line.job_id, workflow=made.workflow, spec_hash=digest.hexdigest(), priority=line.priority,
                  extra_data=with_workflow(extra, made.ui), meta=meta, params=line.params or {}, workflow_name=name,
                  workflow_json=made.text,
                  callback_url=line.callback, template_json=made.stored, template_hash=made.stored_hash,
                  model_key=made.key, refused=made.refused, assets=line.found, tenant=line.fields.get("tenant") or "")


def with_workflow(extra_data: dict[str, Any], ui: dict[str, Any] | None) -> dict[str, Any]:
    """A job's extra_data with the UI workflow it came from in ``extra_pnginfo.workflow`` (as the frontend posts
    it); unchanged without one, or where the line gave its own."""
    if ui is None:
        return extra_data
    pnginfo = extra_data.get("extra_pnginfo")
    pnginfo = pnginfo if isinstance(pnginfo, dict) else {}
    if "workflow" in pnginfo:
        return extra_data
    return {**extra_data, "extra_pnginfo": {**pnginfo, "workflow": ui}}
