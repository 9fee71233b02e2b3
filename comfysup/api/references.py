"""The ``core/ASSET`` references of a workflow submitted through the API, resolved into the job line's ``set``:
each by ``info.id`` to an asset uploaded through ``/api/v2/assets`` (comfysup.api.assets), or by ``info.url`` to a
file elsewhere.

A ``core/ASSET`` reference with ``info.url`` (``https://…``, or ``s3://bucket/key`` from ``[inputs]
s3_buckets``) and no ``info.id`` names a file elsewhere: the Asset schema's own ``url`` field, in the
reference. It becomes the line's ``{"url": …}`` input, fetched at submit into the asset store
(comfysup.jobs.fetch); its ``info.hash`` (``blake3:<hex>`` or ``sha256:<hex>``) is checked, its
``info.file_path`` names the file. One that cannot be fetched is 422 ``missing_asset``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from comfysup import assets
from comfysup.api import placement, views
from comfysup.api.errors import ApiError
from comfysup.jobs.inputs import remote_value
from comfysup.queue.assets import ApiAsset


def is_id(text: str) -> bool:
    """Whether ``text`` is an id as this API writes one: a UUID in its canonical form."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def references(workflow: Mapping[str, Any], lookup: Callable[[str], ApiAsset | None],
               now: float, models_dir: str = "") -> dict[str, Any]:
    """The ``set`` of a submitted workflow's ``core/ASSET`` references: ``{"<node>.<input>": reference by hash}``
    for the job line (comfysup.jobs.inputs stores each once and links it to the job). ``info.id`` is
    authoritative (the contract's AssetReference); a reference without one, or to an asset this API does not
    hold (never uploaded, deleted, expired), is 422 ``missing_asset`` at submit, naming every such input. So is a
    malformed one (``__type: core/ASSET`` without an ``info`` object, or not an input's whole value): the spec
    refuses it, and queued as it is it would reach ComfyUI as a literal object. A reference to a model placed in
    ``models_dir`` (comfysup.api.placement) becomes the name ComfyUI's loaders list it by."""
    found: dict[str, Any] = {}
    missing: list[dict[str, str]] = []
    for node_id, name, ref in _tagged(workflow):
        info = ref.get("info") if name else None
        asset_id = info.get("id") if isinstance(info, Mapping) else None
        if asset_id is None and isinstance(info, Mapping) and "url" in info:
            found[f"{node_id}.{name}"] = remote_value(info)
            continue
        record = lookup(asset_id) if isinstance(asset_id, str) and is_id(asset_id) else None
        if record is None or record.expires_at <= now:
            missing.append({"node_id": node_id, "input": name, "reason": _why_missing(name, info, asset_id)})
            continue
        model = placement.placed(models_dir, record.file_path)
        found[f"{node_id}.{name}"] = model if model is not None else \
            assets.reference(record.hash, record.file_path, record.size)
    if missing:
        raise _missing_assets(missing)
    return found


def _why_missing(name: str, info: Any, asset_id: Any) -> str:
    """Why a reference names no asset this API holds, as the 422 says it."""
    if not name:
        return "is not an input's whole value (a core/ASSET reference stands alone in place of a file name)"
    if not isinstance(info, Mapping):
        return "has no info object ({\"__type\": \"core/ASSET\", \"info\": {\"id\": ...}})"
    if not asset_id:
        return "has no info.id (the id POST /api/v2/assets answered)"
    if isinstance(asset_id, str) and views.parse_output_id(asset_id):
        return f"names asset {str(asset_id)[:80]!r}, which is a job's output; download it and upload it"
    return (f"names asset {str(asset_id)[:80]!r}, which this API does not hold (never uploaded, deleted, "
            "or past its expires_at); upload the file again")


def _missing_assets(missing: list[dict[str, str]]) -> ApiError:
    """The 422 ``missing_asset``: the first reference in words, every one in ``details.missing``."""
    first = missing[0]
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    where = f"input {first['input']!r}" if first["input"] else "inside an input"
    return ApiError(422, "missing_asset", f"node {first['node_id']} {where}: {first['reason']}{more}",
                    details={"missing": missing})


def remote_references(workflow: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """``(node id, input)`` → the input from elsewhere, for each reference of ``workflow`` by ``info.url``."""
    if not isinstance(workflow, Mapping):
        return {}
    return {(node_id, name): remote_value(ref["info"]) for node_id, name, ref in assets.references(workflow)
            if ref["info"].get("id") is None and "url" in ref["info"]}


def _tagged(workflow: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """``(node id, input name, value)`` of every object tagged ``core/ASSET`` in the workflow's inputs; the input
    name is "" for one nested inside an input's value (a list, an object), which no loader reads as a file."""
    for node_id, node in workflow.items():
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        if not isinstance(inputs, Mapping):
            continue
        for name, value in inputs.items():
            if isinstance(value, Mapping) and value.get("__type") == assets.ASSET_TYPE:
                yield str(node_id), str(name), value
            elif isinstance(value, (Mapping, list)):
                for nested in _nested(value):
                    yield str(node_id), "", nested


def _nested(value: Any) -> Iterator[Mapping[str, Any]]:
    """Tagged objects anywhere below ``value`` (bounded: the body's nesting is checked when it is read)."""
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
    for item in items:
        if isinstance(item, Mapping) and item.get("__type") == assets.ASSET_TYPE:
            yield item
        else:
            yield from _nested(item)
