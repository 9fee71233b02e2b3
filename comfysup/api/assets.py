"""``/api/v2/assets``: inputs uploaded through the API into the asset store (the ``core/ASSET`` references that
name them in a submitted workflow: comfysup.api.references).

Paths, bodies and codes: comfy-api-proxy ``spec/openapi.yaml@37fbee21`` (``postAssets``, ``assetFromHash``,
``headAssetByHash``, ``getAsset``, ``getAssetContent``, ``AssetReference``) and comfy-sdk 0.5.0
``comfy_sdk/assets.py`` (``Asset.commit``: ``HEAD by-hash``, then ``from-hash`` on a hit, else the multipart
upload of ``comfy_low/transport.py`` ``post_assets``; ``delete_asset`` expects 204).

- ``POST /assets``: the multipart body is read part by part and the file streamed to a temporary file, hashed
  (BLAKE3) on the way and never held whole in memory; ``[api] max_upload_mb`` bounds the body (every byte of it,
  boundaries and part headers included, chunked or not) and ``[assets] max_file_mb`` the file (413
  ``payload_too_large``); at most MAX_PARTS parts, each text field once (``tags`` excepted); each wait for the
  client's next bytes at most ``[api] body_timeout_seconds`` (408); a client's ``expected_hash`` that differs is 409
  ``hash_mismatch`` and nothing is stored. The queue then stores the content once (a second upload of the same
  bytes adds only a record: ``created_new`` false, 200 instead of 201) and the record, durably, before the
  answer. ``Idempotency-Key`` is single-use, as the spec's shared parameter says: any second upload with a key is
  422 ``idempotency_key_reuse`` naming the first upload's record (``details.asset_id``), held by the queue's unique
  key, so two uploads with one key at once make one record.
- An asset's id is a random UUID (122 random bits), not its hash: knowing a content's hash does not give its
  record. It lives until ``expires_at`` (``[api] upload_retention_hours``); comfysup.queue.assets keeps its
  content from prune until then, and a job that references it keeps the content as long as the job exists.
- Output ids are served by comfysup.api.outputs; this module serves every other id.
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
from aiohttp import BodyPartReader, MultipartReader, web

from comfysup import assets
from comfysup.api import placement, tenancy, views
from comfysup.api.errors import ApiError, not_found
from comfysup.api.references import is_id
from comfysup.api.replies import STATE_KEY, json_response, origin, read_json, send, timed, too_large
from comfysup.queue.assets import CHUNK_BYTES, ApiAsset, UploadConflict
from comfysup.queue.base import NewAsset
from comfysup.queue.tenants import tenant_of

MIB = 1 << 20
READ_BYTES = 1 << 20
"""How much of an upload's file part is read, hashed and written at a time."""
MAX_FIELD_BYTES = 4096
"""A text field of the upload (content_type, file_path, expected_hash, a tag)."""
FIELDS = frozenset({"content_type", "file_path", "expected_hash", "tags"})
REPEATED = frozenset({"tags"})
MAX_PARTS = 64
"""Parts of one upload: the file, its few fields and some tags."""
MAX_JSON_BYTES = 64 * 1024
"""A from-hash body: a hash and a name."""
REQUIRED = ("content_type", "file_path")
CONTENT_TYPE = "multipart/form-data"


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


def _retention(state: Any) -> float:
    return float(state.config.api.upload_retention_hours) * 3600.0


@dataclass
class Received:
    """An upload read to its end: the file in a temporary file (removed by ``discard``), and the text fields."""

    path: Path | None = None
    digest: str = ""
    size: int = 0
    fields: dict[str, list[str]] = field(default_factory=dict)

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


async def _receive(request: web.Request, body_limit: int, file_limit: int, folder: Path | None) -> Received:
    """Read the multipart body; the caller discards the file. 400 for a body that is not the contract's shape,
    413 past a limit (the file is discarded here then)."""
    limits = (f"{file_limit // MIB} MiB ([assets] max_file_mb)" if file_limit < body_limit else
              f"{body_limit // MIB} MiB with the other fields ([api] max_upload_mb)")
    if request.content_type != CONTENT_TYPE:
        raise _bad(f"the body must be {CONTENT_TYPE} with the fields file, content_type and file_path (as "
                   f"comfy-sdk's assets.from_file sends it), not {request.content_type or 'nothing'}")
    received = Received()
    fields = received.fields
    try:
        content = Bounded(request, body_limit, f"{body_limit // MIB} MiB ([api] max_upload_mb)")
        reader = MultipartReader(request.headers, content)  # type: ignore[arg-type]
        total = parts = 0
        while (part := await reader.next()) is not None:
            parts += 1
            if parts > MAX_PARTS:
                raise ApiError(400, "invalid_request", f"the body has more than {MAX_PARTS} parts; an upload has "
                               "one file and a few fields", close=True)
            if not isinstance(part, BodyPartReader):
                raise _bad("a nested multipart part is not an upload's field")
            if part.name in fields and part.name not in REPEATED:
                raise _bad(f"field {part.name!r} is given twice; once")
            if part.name == "file":
                if received.path is not None:
                    raise _bad("the body has two file parts; upload one file per request")
                await _file(part, received, min(file_limit, body_limit - total), folder, limits)
                total += received.size
            elif part.name in FIELDS:
                text = await _field(part)
                total += len(text)
                fields.setdefault(part.name, []).append(text)
            else:
                raise _bad(f"unknown field {part.name!r}; an upload has file, {', '.join(sorted(FIELDS))}")
    except (ValueError, RuntimeError) as exc:  # what aiohttp's reader raises for a malformed body
        received.discard()
        raise _bad(f"the body is not valid {CONTENT_TYPE}: {exc}") from None
    except BaseException:  # a refusal, a dropped connection: nothing of the upload is kept
        received.discard()
        raise
    if received.path is None:
        raise _bad("the body has no file part (the field named file holds the bytes)")
    return received


class Bounded:
    """A request's body as aiohttp's multipart reader reads it: every byte counted against ``limit`` (413 past
    it, boundaries and part headers included, chunked or not) and every wait bounded by ``[api]
    body_timeout_seconds`` (408)."""

    def __init__(self, request: web.Request, limit: int, what: str) -> None:
        self.request = request
        self.content = request.content
        self.limit = limit
        self.what = what
        self.total = 0

    def _count(self, data: bytes) -> bytes:
        self.total += len(data)
        if self.total > self.limit:
            raise too_large(self.limit, self.what)
        return data

    async def read(self, n: int = -1) -> bytes:
        return self._count(await timed(self.request, self.content.read(n)))

    async def readline(self, *args: Any, **kwargs: Any) -> bytes:
        return self._count(await timed(self.request, self.content.readline(*args, **kwargs)))

    async def readany(self) -> bytes:
        return self._count(await timed(self.request, self.content.readany()))

    async def readexactly(self, n: int) -> bytes:
        return self._count(await timed(self.request, self.content.readexactly(n)))

    def at_eof(self) -> bool:
        return self.content.at_eof()

    def unread_data(self, data: bytes) -> None:
        self.total -= len(data)
        self.content.unread_data(data)


async def _file(part: BodyPartReader, received: Received, limit: int, folder: Path | None, limits: str) -> None:
    loop = asyncio.get_running_loop()
    fd, name = await loop.run_in_executor(None, _temporary, folder)
    received.path = Path(name)
    hasher = blake3.blake3()
    with os.fdopen(fd, "wb") as out:
        while chunk := await part.read_chunk(READ_BYTES):
            received.size += len(chunk)
            if received.size > limit:
                raise ApiError(413, "payload_too_large", f"the file is larger than {limits}; nothing was stored")
            hasher.update(chunk)
            await loop.run_in_executor(None, out.write, chunk)
    received.digest = assets.HASH_PREFIX + hasher.hexdigest()


def _temporary(folder: Path | None) -> tuple[int, str]:
    """A temporary file in the asset folder (the store copies it beside) or the system's temporary folder."""
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return tempfile.mkstemp(dir=folder, prefix=".api-upload-")


async def _field(part: BodyPartReader) -> str:
    data = b""
    while chunk := await part.read_chunk(MAX_FIELD_BYTES + 1):
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            raise _bad(f"field {part.name!r} is longer than {MAX_FIELD_BYTES} bytes")
    text = data.decode("utf-8")
    if not text.isprintable():
        raise _bad(f"field {part.name!r} holds control characters")
    return text


def _one(fields: Mapping[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise _bad(f"field {name!r} is given {len(values)} times; once")
    return values[0]


def _check_name(file_path: str) -> None:
    """``file_path`` is a name in the spec's "global-namespace-root form" (``photo.png``,
    ``models/checkpoints/x.safetensors``): 400 for an absolute path or a ``..`` part, which name no such place."""
    parts = file_path.replace("\\", "/").split("/")
    if file_path.startswith(("/", "\\")) or ".." in parts:
        raise _bad(f"file_path {file_path[:200]!r}: a name relative to the asset namespace's root (photo.png, "
                   "models/checkpoints/x.safetensors), with no .. and no leading /")


async def post_asset(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body_limit = state.config.api.max_upload_mb * MIB
    file_limit = min(body_limit, state.config.assets.max_file_mb * MIB)
    key = _check_headers(request, state, body_limit)
    received = await _receive(request, body_limit, file_limit, state.queue.assets.assets_dir)
    try:
        content_type, file_path = _checked_fields(received)
        model = placement.model_name(file_path)
        if model is not None and not state.config.api.models_dir:
            placement.place_model("", received.path, file_path)  # the refusal that says what to set
        record, created_new = await _store(state, received, content_type, file_path, key, tenancy.tenant(request))
        if model is not None:
            await _place_model(state, record, received, file_path)
    finally:
        await asyncio.get_running_loop().run_in_executor(None, received.discard)
    return json_response(views.uploaded(record, origin(request), time.time(), created_new),
                         status=201 if created_new else 200)


def _check_headers(request: web.Request, state: Any, body_limit: int) -> str | None:
    """The upload's ``Idempotency-Key``, once its headers are known to be acceptable: 413 for a body declared
    larger than ``[api] max_upload_mb``, 400 for a key that is not 1 to 255 printable ASCII characters."""
    if request.content_length is not None and request.content_length > body_limit:
        raise ApiError(413, "payload_too_large", f"the body is {request.content_length:,} bytes, larger than "
                       f"{state.config.api.max_upload_mb} MiB ([api] max_upload_mb)")
    key = request.headers.get("Idempotency-Key")
    if key is not None and not (0 < len(key) <= 255 and key.isascii() and key.isprintable()):
        raise _bad("Idempotency-Key must be 1 to 255 printable ASCII characters")
    return key


def _checked_fields(received: Received) -> tuple[str, str]:
    """``content_type`` and ``file_path`` of the upload: 400 without them or for a name outside the namespace,
    409 when the client's ``expected_hash`` is not the hash of the bytes received."""
    assert received.path is not None
    content_type, file_path = (_one(received.fields, name) for name in REQUIRED)
    if not content_type or not file_path:
        missing = [n for n, v in zip(REQUIRED, (content_type, file_path), strict=True) if not v]
        raise _bad(f"the upload has no {' and no '.join(missing)} field (required by the contract)")
    _check_name(file_path)
    expected = _one(received.fields, "expected_hash")
    if expected is not None and expected != received.digest:
        raise ApiError(409, "hash_mismatch", f"expected_hash is {expected}, the bytes received hash to "
                       f"{received.digest}; nothing was stored")
    return content_type, file_path


async def _store(state: Any, received: Received, content_type: str, file_path: str,
                 key: str | None, who: str) -> tuple[ApiAsset, bool]:
    """The content and its record in the queue, durably, as the tenant ``who``'s: the record and whether it is new
    (a key used before is 422 ``idempotency_key_reuse``)."""
    asset = NewAsset(received.digest, received.size, file_path, str(received.path))
    add = functools.partial(state.queue.assets.add_api_asset, tenant=tenant_of(who))
    try:
        return await state.call(add, asset, content_type, _retention(state), tenancy.upload_key(key, who))
    except UploadConflict as exc:
        raise ApiError(422, "idempotency_key_reuse", f"{exc}; keys are single-use: GET that asset instead of "
                       "uploading again, or send a new key", details={"asset_id": exc.asset_id}) from None


async def _place_model(state: Any, record: ApiAsset, received: Received, file_path: str) -> None:
    """A model's file linked where ComfyUI's loaders look (``[api] models_dir``); not placed, the record goes too."""
    try:
        models_dir = str(state.config.resolve(state.config.api.models_dir))
        await asyncio.get_running_loop().run_in_executor(None, placement.place_model, models_dir,
                                                         received.path, file_path)
    except BaseException:  # not placed: the record goes too
        await state.call(state.queue.assets.delete_api_asset, record.id)
        raise


async def from_hash(request: web.Request) -> web.Response:
    """A record over content the store holds (the SDK's dedup fast path): 201 minted, 200 a live record of the
    same content and name answered again, 404 ``blob_not_found``."""
    state = request.app[STATE_KEY]
    body = await read_json(request, MAX_JSON_BYTES, f"{MAX_JSON_BYTES // 1024} KiB (a hash and a name)")
    if not isinstance(body, dict) or not assets.is_hash(body.get("hash")):
        raise _bad("hash must be \"blake3:<64 hex digits>\"")
    file_path = body.get("file_path") or ""
    if not isinstance(file_path, str) or len(file_path) > MAX_FIELD_BYTES or not file_path.isprintable():
        raise _bad("file_path must be a name of printable characters")
    _check_name(file_path)
    mint = functools.partial(state.queue.assets.mint_api_asset, tenant=tenant_of(tenancy.tenant(request)))
    minted = await state.call(mint, body["hash"], file_path, views.content_type(file_path), _retention(state))
    if minted is None:
        raise ApiError(404, "blob_not_found", f"no stored content has the hash {body['hash']}; upload the file")
    record, new = minted
    return json_response(views.uploaded(record, origin(request), time.time(), created_new=False),
                         status=201 if new else 200)


async def by_hash(request: web.Request) -> web.Response:
    """200 when the store holds this content (from-hash can mint over it), 404 otherwise; no body."""
    state = request.app[STATE_KEY]
    digest = request.match_info["hash"]
    held = assets.is_hash(digest) and await state.call(state.queue.assets.has_asset, digest)
    return web.Response(status=200 if held else 404)


async def _record(request: web.Request) -> tuple[Any, ApiAsset]:
    state = request.app[STATE_KEY]
    asset_id = request.match_info["id"]
    record = await state.call(state.queue.assets.api_asset, asset_id) if is_id(asset_id) else None
    if record is None or record.expires_at <= time.time() or not tenancy.sees(tenancy.tenant(request), record):
        raise not_found("asset")
    return state, record


async def get_asset(request: web.Request) -> web.Response:
    _state, record = await _record(request)
    return json_response(views.uploaded(record, origin(request), time.time()))


async def asset_content(request: web.Request) -> web.StreamResponse:
    """The bytes, with Range: from the asset file (SQLite, or ``[assets] dir``) or the database's chunks."""
    state, record = await _record(request)
    path = state.queue.assets.asset_file(record.hash)
    if path is None:
        return await send(request, record.size, record.content_type, _chunks(state, record.hash),
                          name=record.file_path)
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, after the answer is sent)
    except FileNotFoundError:
        raise ApiError(404, "not_found", f"the asset's content is missing from the asset store ({path})") from None
    with f:
        async def read(at: int, n: int) -> bytes:
            f.seek(at)
            return f.read(n)

        return await send(request, record.size, record.content_type, read, name=record.file_path)


def _chunks(state: Any, digest: str) -> Callable[[int, int], Any]:
    """``read(offset, n)`` over the database's chunks of ``digest`` (CHUNK_BYTES each but the last), each fetched
    once in the queue's worker thread."""
    held: dict[int, bytes] = {}

    async def read(at: int, n: int) -> bytes:
        index, offset = divmod(at, CHUNK_BYTES)
        if index not in held:
            held.clear()
            held[index] = await state.call(state.queue.assets.asset_chunk, digest, index)
        return held[index][offset:offset + n]

    return read
