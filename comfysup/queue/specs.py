"""What a submit works out once per workflow rather than once per job, for both backends.

A batch of 100,000 lines of one 10 KB workflow shares one template text (the same object, from
comfysup.jobs.Template), so its hash and model key are computed once and its id in ``workflows`` is looked
up once. Caches are keyed by object identity and bounded: texts that differ per job (inline workflows)
would otherwise keep a copy of every one of them in memory.
"""

from __future__ import annotations

from typing import Any

from comfysup.queue.base import NewJob
from comfysup.workflows import canonical, compact, content_hash, model_key

SPEC_CACHE = 64
"""Workflow objects one submit remembers the hash and model key of (a file names a few; inline ones differ)."""


def dumps_plain(value: dict[str, Any]) -> str:
    """A job's own small JSON (params, extra_data, meta): compact, and the empty object without encoding."""
    return compact(value) if value else "{}"


class SpecCache:
    """Per submit: workflow ids by hash (``ids``), and the hash and model key of recently seen objects."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self._hashes: dict[int, tuple[str, str]] = {}
        self._keys: dict[int, tuple[Any, str | None]] = {}

    def template(self, job: NewJob) -> tuple[str, str]:
        """The text stored for ``job``'s workflow (its template, or the whole workflow) and its hash."""
        text = job.template_json or job.workflow_json or canonical(job.workflow)
        if job.template_hash and job.template_json:
            return text, job.template_hash
        seen = self._hashes.get(id(text))
        if seen is None or seen[0] is not text:
            if len(self._hashes) >= SPEC_CACHE:
                self._hashes.clear()
            seen = self._hashes[id(text)] = (text, content_hash(text))
        return text, seen[1]

    def model_key(self, job: NewJob) -> str | None:
        """The job's model key: given by submit ("" for none), else derived from its workflow, once per object."""
        if job.model_key is not None:
            return job.model_key or None
        seen = self._keys.get(id(job.workflow))
        if seen is None or seen[0] is not job.workflow:
            if len(self._keys) >= SPEC_CACHE:
                self._keys.clear()
            seen = self._keys[id(job.workflow)] = (job.workflow, model_key(job.workflow))
        return seen[1]
