"""A ``POST /api/v2/jobs`` body as a comfysup job line, validated by the same code as ``comfysup submit``.

The body (comfy-api-proxy ``spec/openapi.yaml`` 2.0.0 ``postJobs``; comfy-sdk 0.5.0 ``comfy_low/transport.py``
``_jobs_body``) is ``{"workflow": {...API format...}, "extra_data": {...}, "metadata": {"k": "v"}}``; comfysup
adds ``priority`` (a whole number, as a jobs.jsonl line has it). It becomes the line ``{"id", "workflow",
"priority", "extra_data", "meta"}`` and goes through ``comfysup.jobs.JobsFile.parse`` with the node catalogues
the servers recorded: one validation for every front door. A UI-format workflow (ComfyUI's Save) is converted
there with those catalogues (comfysup.jobs.brought); before any server has recorded one, it is 422
``workflow_format_ui``, saying how to convert it.

What the spec draws, refused before anything else: a body that is not an object or carries a field no job has is
400 ``invalid_request``; the reserved ``webhook_url`` and ``inputs`` are 422 ``invalid_workflow`` (the spec:
"rejected if present today"); ``extra_data`` is a closed object whose only key is ``api_key_comfy_org``, a string
(anything else, ``null`` included, is 400 ``invalid_request``).

The job id is the ``Idempotency-Key``: itself when it is a UUID, else a UUID derived from it (uuid5 in a fixed
namespace), so every request with one key names one job. The key is single-use (the spec's reject-on-duplicate):
comfysup.api.app answers 422 ``idempotency_key_reuse`` to every request whose job the queue already holds, decided
by the queue's transaction (the job id is its primary key). Without a key the job gets a fresh random id.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comfysup.api.errors import ApiError
from comfysup.api.references import references, remote_references
from comfysup.config import Config
from comfysup.jobs import PRIORITY_RANGE, JobLineError, JobsFile
from comfysup.jobs.brought import NO_CATALOGUE
from comfysup.jobs.catalogue import Catalogue
from comfysup.jobs.inputs import InputFiles
from comfysup.queue.assets import ApiAsset
from comfysup.queue.base import NewJob
from comfysup.workflows.ui import is_ui_workflow

KEY_NAMESPACE = uuid.UUID("6f0c4d8e-3b1a-5c7e-9d2f-4a8b6c1e0f35")
"""The namespace of job ids derived from an Idempotency-Key that is not a UUID (fixed: every API process of
every machine derives the same id from the same key)."""
MAX_KEY_CHARS = 255
BODY_KEYS = frozenset({"workflow", "extra_data", "metadata", "priority"})
RESERVED_KEYS = frozenset({"webhook_url", "inputs"})
"""Fields the spec reserves for later and refuses today (422 ``invalid_workflow``)."""
EXTRA_DATA_KEYS = frozenset({"api_key_comfy_org"})
"""``extra_data``'s only key in the spec (``additionalProperties: false``): a partner-node API key, a string."""
MAX_LABELS = 16
MAX_LABEL_CHARS = 256


def job_id_for(key: str | None) -> str:
    if key is None:
        return str(uuid.uuid4())
    key = key.strip()
    if not key or len(key) > MAX_KEY_CHARS or not key.isprintable() or not key.isascii():
        raise ApiError(400, "invalid_request", f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable ASCII "
                       "characters")
    try:
        return str(uuid.UUID(key))
    except ValueError:
        return str(uuid.uuid5(KEY_NAMESPACE, key))


def _labels(value: Any) -> dict[str, str]:
    """``metadata``: at most 16 string pairs (the SDK's ``submit`` names the limit and ``metadata_invalid``)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(422, "metadata_invalid", "metadata must be an object of string labels")
    if len(value) > MAX_LABELS:
        raise ApiError(422, "metadata_invalid", f"metadata has {len(value)} pairs; at most {MAX_LABELS}")
    for key, item in value.items():
        if not isinstance(item, str) or not key or len(key) > MAX_LABEL_CHARS or len(item) > MAX_LABEL_CHARS:
            raise ApiError(422, "metadata_invalid", f"metadata {key!r}: keys and values are strings of 1 to "
                           f"{MAX_LABEL_CHARS} characters")
    return dict(value)


def _extra_data(body: dict[str, Any]) -> dict[str, str]:
    """The spec's closed ``extra_data``: absent or ``{"api_key_comfy_org": "<string>"}`` (or ``{}``)."""
    if "extra_data" not in body:
        return {}
    extra = body["extra_data"]
    if not isinstance(extra, dict):
        raise ApiError(400, "invalid_request", f"extra_data must be an object (or left out), not "
                       f"{'null' if extra is None else type(extra).__name__}")
    unknown = set(extra) - EXTRA_DATA_KEYS
    if unknown:
        raise ApiError(400, "invalid_request", f"extra_data accepts only {', '.join(sorted(EXTRA_DATA_KEYS))}; "
                       f"{sorted(unknown)[0][:80]!r} is not one")
    for name, value in extra.items():
        if not isinstance(value, str):
            raise ApiError(400, "invalid_request", f"extra_data.{name} must be a string")
    return dict(extra)


def _priority(body: dict[str, Any]) -> int:
    """comfysup's own ``priority`` (higher runs first): a whole number in the queue's range."""
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or \
            not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise ApiError(400, "invalid_request", f"priority must be a whole number from {PRIORITY_RANGE[0]} to "
                       f"{PRIORITY_RANGE[1]} (higher runs first)")
    return priority


NODE = re.compile(r"(?:the inline workflow: )?node '?([^'\s:(]+)'?(?: \(([^)]*)\))?")
FIELD = re.compile(r"input '([^']+)'")


def node_errors(reasons: list[str]) -> dict[str, Any]:
    """``invalid_workflow``'s per-node details, as the spec's example draws them: ``{"node_errors": {"<node id>":
    [{"field", "class_type", "reason"}]}}`` for each reason about a node (``field``: the input it names, or null),
    and every reason as it reads in ``reasons``."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for reason in reasons:
        found = NODE.match(reason)
        if found:
            field = FIELD.search(reason)
            nodes.setdefault(found.group(1), []).append({"field": field.group(1) if field else None,
                                                         "class_type": found.group(2), "reason": reason})
    return {"node_errors": nodes, "reasons": list(reasons)}


class Intake:
    """Builds jobs from bodies; one per API process, with the node catalogues refreshed by the caller."""

    def __init__(self, base_dir: Path, config: Config | None = None) -> None:
        self.base_dir = base_dir
        self.config = config or Config()
        self.allow_private_callbacks = self.config.webhooks.allow_private
        self.models_dir = str(self.config.resolve(self.config.api.models_dir)) if self.config.api.models_dir else ""
        """``[api] models_dir``: a reference to a model placed there is its name (comfysup.api.placement)."""
        self.stopping = threading.Event()
        """Set when the API stops: the downloads in flight end (the process waits for their threads at exit)."""

    def inputs(self) -> InputFiles:
        """Where a job's input files come from: no file of this machine; by URL as [inputs] says, s3 only from
        [inputs] s3_buckets (a client would read with this machine's credentials)."""
        c = self.config
        return InputFiles(self.base_dir, (), "the API: a job names its input files by core/ASSET references to "
                          "uploads or by info.url", c.assets.max_file_mb * 2**20, c.assets.max_job_mb * 2**20,
                          c.inputs, c.inputs.s3_buckets, stopping=self.stopping)

    def fetch(self, body: Any) -> InputFiles | None:
        """The workflow's references by ``info.url``, fetched into the inputs ``job`` then uses (in a thread of
        its own: a download never holds the queue's worker); None when it has none. One that cannot be fetched is
        422 ``missing_asset``, naming every such input."""
        found = remote_references(body.get("workflow") if isinstance(body, dict) else None)
        if not found:
            return None
        inputs, missing, sizes = self.inputs(), [], {}
        until = time.monotonic() + self.config.inputs.max_seconds  # the job's downloads together
        try:
            for (node_id, name), value in found.items():
                try:
                    sizes.update((a.hash, a.size) for a in inputs.resolve({f"{node_id}.{name}": value}, until)[1])
                except JobLineError as exc:
                    missing.append({"node_id": node_id, "input": name, "reason": str(exc)})
                if sum(sizes.values()) > inputs.max_job_bytes:  # refused anyway: download no more of them
                    raise ApiError(422, "invalid_workflow", f"the job's input files by URL are more than "
                                   f"{int(inputs.max_job_bytes):,} bytes together ([assets] max_job_mb)")
        except BaseException:  # what was fetched is not left in the staging folder
            inputs.release()
            raise
        if missing:
            inputs.release()
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ApiError(422, "missing_asset", f"node {missing[0]['node_id']} input {missing[0]['input']!r}: "
                           f"{missing[0]['reason']}{more}", details={"missing": missing})
        return inputs

    def line(self, body: Any, key: str | None) -> dict[str, Any]:
        """The body checked on its face (no I/O: called before its inputs by URL are fetched, so a request that
        fails anyway downloads nothing), as the job line without its inputs."""
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "the body must be a JSON object with a workflow")
        reserved = set(body) & RESERVED_KEYS
        if reserved:
            raise ApiError(422, "invalid_workflow", f"{sorted(reserved)[0]!r} is reserved by the Comfy API v2 and "
                           "not accepted yet; leave it out (a webhook is [webhooks] url in comfysup's config)")
        unknown = set(body) - BODY_KEYS
        if unknown:
            raise ApiError(400, "invalid_request", f"unknown field {sorted(unknown)[0]!r}; a job has "
                           f"{', '.join(sorted(BODY_KEYS))}")
        workflow = body.get("workflow")
        if not isinstance(workflow, dict):
            raise ApiError(422, "invalid_workflow", "workflow must be an object: an API-format prompt or a UI-format "
                           "workflow")
        return {"id": job_id_for(key), "workflow": workflow, "extra_data": _extra_data(body),
                "meta": _labels(body.get("metadata")), "priority": _priority(body)}

    def job(self, body: Any, key: str | None, catalogues: list[Catalogue],
            lookup: Callable[[str], ApiAsset | None] = lambda _id: None, fetched: InputFiles | None = None) -> NewJob:
        """``lookup``: an uploaded asset's record by id (the queue's ``api_asset``), for the workflow's
        ``core/ASSET`` references; each becomes a ``set`` value by hash, as a jobs.jsonl line carries it.
        ``fetched``: what ``fetch`` answered for this body (its inputs by URL, already fetched)."""
        line = self.line(body, key)
        if is_ui_workflow(line["workflow"]) and not catalogues:
            raise ApiError(422, "workflow_format_ui", f"workflow is in ComfyUI's UI format; {NO_CATALOGUE}")
        inputs = references(line["workflow"], lookup, time.time(), self.models_dir)
        if inputs:
            line["set"] = inputs
        jobs = JobsFile(self.base_dir / "api.jsonl", label="api", base_dir=self.base_dir, catalogues=catalogues,
                        allow_private_callbacks=self.allow_private_callbacks, inputs=fetched or self.inputs())
        try:
            job, _warnings = jobs.parse(json.dumps(line).encode(), check=True)
        except JobLineError as exc:
            raise ApiError(422, "invalid_workflow", str(exc), details=node_errors(exc.reasons)) from None
        return job
