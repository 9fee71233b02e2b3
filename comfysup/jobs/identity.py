"""What names a job: the id of a line that gives none, and the ``set`` its id and spec hash are taken from.

A job is named by its line as written. An input file of this machine (``{"file": …}``, an uploaded asset) is
named by its content's hash, so a changed file is a changed job. An input from elsewhere (``{"url": …}``,
``{"s3": …}``, a ``core/ASSET`` reference by ``info.url``) is named by its reference as written (the URL, and any
expected hash or name), never by the bytes fetched: the same message delivered again after its URL's content
changed (a broker consumer cut between its commit and its ack) is the job already submitted, neither a second job
(none runs twice) nor a conflict. To run a changed URL's content again, give the line a new id.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from comfysup.jobs.inputs import remote_source
from comfysup.jobs.values import hyphenated

NAMESPACE = "7a1c0f3e-3b8e-5b6a-9d2e-63f0c0a5e1d4"
"""The namespace of the ids comfysup derives for lines that give none (uuid5)."""
ID_NAMESPACE = bytes.fromhex(NAMESPACE.replace("-", ""))
"""The namespace's 16 bytes, as ``uuid5`` takes it."""


def as_written(written: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` (each input file replaced by its stored reference) with each input from elsewhere as the line
    wrote it; ``resolved`` itself when the line has none (the ids and hashes of such lines never change)."""
    if not any(isinstance(v, dict) and remote_source(v) is not None for v in written.values()):
        return resolved
    return {k: written[k] if isinstance(written.get(k), dict) and remote_source(written[k]) is not None else v
            for k, v in resolved.items()}


def derived_id(line: dict[str, Any], params: dict[str, Any], workflow_hash: str) -> str:
    """The id of a line that gives none: a UUID of its content (the workflow's, its set (``as_written``),
    extra_data, meta, priority, callback), so the same line submitted again is the same job and runs once, and a
    line whose workflow or input file changed is another job."""
    content = {k: v for k, v in line.items() if k not in ("id", "workflow", "set")}
    text = sorted_json({"workflow": workflow_hash, "set": params, **content})
    return uuid5(ID_NAMESPACE, text)


def uuid5(namespace: bytes, name: str) -> str:
    """``str(uuid.uuid5(uuid.UUID(bytes=namespace), name))`` (RFC 4122's name-based UUID): the first 16 bytes of the
    SHA-1 of the namespace and the name, with version 5 and the RFC's variant in their bits. From hashlib, not the
    uuid module, which loads platform for the submit of every line that gives no id."""
    digest = bytearray(hashlib.sha1(namespace + name.encode("utf-8"), usedforsecurity=False).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return hyphenated(digest.hex())


def sorted_json(value: dict[str, Any]) -> str:
    """json.dumps(value, sort_keys=True), without encoding the empty object most lines have."""
    return json.dumps(value, sort_keys=True) if value else "{}"
