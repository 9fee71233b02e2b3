"""Outputs are assets: ``GET /api/v2/assets/{id}`` and ``/content`` of an output, and an output named
by a later job's ``core/ASSET`` reference.

An output's id is the asset UUID the queue gave it when its job was done (``Output.id``, table
``output_assets``); a job done before that version has ``<job id>.<n>`` ids (comfysup.api.views ``output_id``),
still served. The bytes come from the result store, opened through comfysup.safefs (no symlink out of the job's
folder), with Range; a file in another machine's store (``[store] dir`` not shared) is streamed from that
machine's API (comfysup.api.remote).

A pipeline of jobs needs no download and re-upload: a ``core/ASSET`` reference whose ``info.id`` is an output's
id is resolved, at submit, to the output's content in the asset store. The API hashes the file (BLAKE3, once per
output id and process: a stored output never changes) and mints an upload record over that content, storing it
first when the store does not hold it yet (comfysup.queue.assets ``mint_api_asset``, ``add_api_asset``). From
there it is an input like any other: the job links the content, and the runner uploads it to its server just
before the POST. The output must be in this machine's result store; one held only by another machine is refused
422 ``missing_asset`` with what to do; so is one in a bucket ([store] url), which a reference names by its
``info.url`` (the output's presigned ``url``, or its ``s3://`` location from a bucket ``[inputs] s3_buckets``
lists): fetched in a thread of its own, never by the queue's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from comfysup import assets as content
from comfysup import safefs
from comfysup.api import assets, references, remote, tenancy, views
from comfysup.api.errors import ApiError, not_found
from comfysup.api.replies import STATE_KEY, json_response, origin, send
from comfysup.errors import NotFound
from comfysup.queue.assets import ApiAsset
from comfysup.queue.base import JobRecord, NewAsset
from comfysup.queue.tenants import tenant_of
from comfysup.storage import s3

REDIRECT_TTL_SECONDS = 300
"""The content route's presigned URL when [store] url_ttl_seconds is 0 (no URL handed out): the route must still
lead to the bytes, and the redirect is followed at once."""
MAX_HASHED = 4096
"""Output ids whose content hash this process keeps (a stored output never changes)."""


def find(state: Any, asset_id: str) -> tuple[JobRecord, int] | None:
    """In the queue's thread: the done job whose output ``asset_id`` names, and the output's place; else None."""
    legacy = views.parse_output_id(asset_id)
    if legacy is None:
        return state.queue.reads.output_asset(asset_id) if references.is_id(asset_id) else None
    try:
        record = state.queue.reads.get(legacy[0])
    except NotFound:
        return None
    return (record, legacy[1]) if record.state == "done" and legacy[1] < len(record.outputs) else None


def _open(state: Any, record: JobRecord, index: int) -> int:
    """The output's file in this machine's result store, opened beneath it (OSError when it is not there)."""
    parts = [p for p in record.outputs[index].name.split("/") if p]
    root = safefs.open_root(state.store)
    try:
        with safefs.dir_beneath(root, [record.id, *parts[:-1]]) as folder:
            return safefs.open_file(folder, parts[-1])
    finally:
        os.close(root)


async def _output(request: web.Request) -> tuple[Any, tuple[JobRecord, int] | None]:
    """The state, and the output the route's id names (None: not an output's id, it may be an upload's)."""
    state = request.app[STATE_KEY]
    asset_id = request.match_info["id"]
    found = await state.call(find, state, asset_id)
    if found is None and views.parse_output_id(asset_id) is not None:
        raise not_found("asset")
    if found is not None:
        tenancy.owned(tenancy.tenant(request), found[0], "asset")
    return state, found


async def get_asset(request: web.Request) -> web.Response:
    """An output as the contract's ``Asset``; any other id is an upload's (comfysup.api.assets)."""
    state, found = await _output(request)
    if found is None:
        return await assets.get_asset(request)
    record, index = found
    item = views.outputs(record, origin(request), time.time(), state.links)[index]
    return json_response({"id": item["id"], "hash": None, "size_bytes": item["size_bytes"],
                          "content_type": item["content_type"], "file_path": record.outputs[index].name,
                          "created_at": views.iso(record.finished_at), "url": item["url"],
                          "url_expires_at": item["url_expires_at"], "job_id": record.id,
                          "expires_at": views.iso((record.finished_at or 0) + views.RETENTION_SECONDS),
                          "node_id": item["node_id"]})


async def content_of(request: web.Request) -> web.StreamResponse:
    """An output's bytes, with Range; any other id is an upload's (comfysup.api.assets)."""
    state, found = await _output(request)
    if found is None:
        return await assets.asset_content(request)
    record, index = found
    output = record.outputs[index]
    name = output.name
    if s3.split_uri(output.path) is not None:  # in a bucket: the client fetches it there, not through us
        link = state.links(output.path, state.config.store.url_ttl_seconds or REDIRECT_TTL_SECONDS)
        if "url" not in link:
            raise ApiError(503, "storage_unavailable", f"the output is at {output.path}, and this machine has no "
                           "credentials to presign a URL for it ([store] access keys, AWS_* or a profile)")
        raise web.HTTPFound(link["url"])  # the spec's 302: "Redirect to a fresh signed URL"
    try:
        fd = _open(state, record, index)
    except OSError:
        return await remote.stream(request, state, record.machine)
    with os.fdopen(fd, "rb") as f:
        async def read(at: int, n: int) -> bytes:
            f.seek(at)
            return f.read(n)

        return await send(request, os.fstat(f.fileno()).st_size, views.content_type(name), read, name=name)


async def delete_asset(request: web.Request) -> web.Response:
    """204: an upload's record is gone, its content too unless a job (or another record) needs it; an output is
    403 (removed with its job); another tenant's upload or output is 404, as an unknown id."""
    state = request.app[STATE_KEY]
    asset_id = request.match_info["id"]
    who = tenancy.tenant(request)
    found = await state.call(find, state, asset_id)
    if (found is not None and tenancy.sees(who, found[0])) or (found is None and views.parse_output_id(asset_id)):
        raise ApiError(403, "forbidden", "an output is removed with its job (comfysup prune), not by DELETE")
    upload = await state.call(state.queue.assets.api_asset, asset_id) if found is None and references.is_id(
        asset_id) else None
    if upload is None or not tenancy.sees(who, upload) or \
            not await state.call(state.queue.assets.delete_api_asset, asset_id):
        raise not_found("asset")
    return web.Response(status=204)


class Inputs:
    """The lookup of a submitted workflow's ``core/ASSET`` references (comfysup.api.assets ``references``): an
    upload's record, or an output made an upload over its content. Runs in the queue's thread."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self._hashed: dict[str, tuple[str, int]] = {}

    def __call__(self, asset_id: str, who: str = "") -> ApiAsset | None:
        """The record ``asset_id`` names, as the tenant ``who`` sees it (another tenant's: None, as unknown)."""
        upload = self.state.queue.assets.api_asset(asset_id)
        if upload is not None:
            return upload if tenancy.sees(who, upload) else None
        found = find(self.state, asset_id)
        if found is None or not tenancy.sees(who, found[0]):
            return None
        return self._staged(asset_id, *found, tenant_of(who))

    def _staged(self, asset_id: str, record: JobRecord, index: int, tenant: str) -> ApiAsset:
        state, output = self.state, record.outputs[index]
        name, kind = output.name.rsplit("/", 1)[-1], views.content_type(output.name)
        retention = float(state.config.api.upload_retention_hours) * 3600.0
        path = Path(state.store, record.id, output.name)
        known = self._hashed.get(asset_id)
        if known is not None:
            minted = state.queue.assets.mint_api_asset(known[0], name, kind, retention, tenant=tenant)
            if minted is not None:
                return minted[0]
        if s3.split_uri(output.path) is not None:  # uploaded to a bucket: no file here, and no download in
            # the queue's one thread (a bucket's object is an input by URL, fetched in a thread of its own)
            raise ApiError(422, "missing_asset", f"asset {asset_id} is an output of job {record.id} stored in a "
                           f"bucket at {output.path}; name it by info.url instead of info.id: the output's url "
                           f"(GET /api/v2/assets/{asset_id}), or {output.path} where [inputs] s3_buckets lists "
                           "its bucket")
        try:
            fd = _open(state, record, index)
        except OSError:
            raise ApiError(422, "missing_asset", f"asset {asset_id} is an output of job {record.id}, whose file is "
                           f"not in this machine's result store (held by {record.machine or 'another machine'}); "
                           "submit the job to that machine's API, share [store] dir, or upload the file") from None
        limit = state.config.assets.max_file_mb * (1 << 20)
        with os.fdopen(fd, "rb") as f:
            try:
                digest, size = content.hash_stream(f, limit)
            except ValueError:
                raise ApiError(413, "payload_too_large", f"output {asset_id} is larger than an input may be "
                               f"({state.config.assets.max_file_mb} MiB, [assets] max_file_mb)") from None
        if len(self._hashed) >= MAX_HASHED:
            self._hashed.clear()
        self._hashed[asset_id] = (digest, size)
        minted = state.queue.assets.mint_api_asset(digest, name, kind, retention, tenant=tenant)
        if minted is not None:
            return minted[0]
        staged, _new = state.queue.assets.add_api_asset(NewAsset(digest, size, name, str(path)), kind, retention,
                                                        tenant=tenant)
        return staged
