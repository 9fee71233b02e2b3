"""Files on the API's own machine: ``POST /api/v2/assets/from-path`` (a file already there, registered as an asset)
and model files placed in ComfyUI's model folders by an upload whose ``file_path`` is ``models/<folder>/<name>``.

Neither is in the spec's operations (comfy-api-proxy has both: ``asset_from_path`` and its model placement; the
spec's ``file_path`` names the ``models/checkpoints/x.safetensors`` form). Both reach the machine's disk, so both
are off until the operator names the folders, and both refuse with 403 ``forbidden`` saying which setting to set:

- ``[api] path_roots``: the folders from-path may read. The path (absolute, or relative to a root) is opened below
  its root component by component without following a symlink, only as a regular file (comfysup.safefs, as
  ``comfysup submit`` reads ``{"file": ...}`` inputs below ``[assets] input_roots``), hashed, and stored once in
  the asset store like an upload: 201 for content not held before, 200 for content already held. Outside every
  root: 403; not there or not a regular file: 404 ``blob_not_found`` (the proxy's answer to a missing file).
- ``[api] models_dir``: the folder ComfyUI's model paths name. An upload to ``models/<folder>/<path>.safetensors``,
  ``<folder>`` one of MODEL_FOLDERS (never ``configs`` or ``custom_nodes``: YAML and Python), is checked to be a
  safetensors file by its header (a length and a JSON object; never loaded) and placed there: written under a
  temporary name in the target folder and linked to its name, which fails rather than replace a file that is
  there (409 ``hash_mismatch``, as the proxy answers), every folder opened without following a symlink. A
  workflow names it as ComfyUI's loaders do, by the path below ``<folder>``; a ``core/ASSET`` reference to it is
  replaced by that name at submit. A server lists a new model in its node catalogue after its next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import struct
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from comfysup import assets, safefs
from comfysup.api import tenancy, views
from comfysup.api.errors import ApiError
from comfysup.api.replies import STATE_KEY, json_response, origin, read_json
from comfysup.queue.base import NewAsset
from comfysup.queue.tenants import tenant_of

MODEL_PREFIX = "models/"
MODEL_FOLDERS = frozenset({
    "checkpoints", "loras", "vae", "vae_approx", "text_encoders", "clip", "clip_vision", "diffusion_models", "unet",
    "controlnet", "t2i_adapter", "embeddings", "upscale_models", "hypernetworks", "style_models", "gligen",
    "photomaker", "diffusers", "classifiers", "model_patches", "audio_encoders"})
"""ComfyUI's model folders (its folder_paths) a model may be placed in."""
MODEL_SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 100 << 20
"""A safetensors header larger than this is not one (the format's own reader refuses such a length)."""
MAX_JSON_BYTES = 16 * 1024


def _forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def model_name(file_path: str) -> tuple[str, str] | None:
    """``(folder, path below it)`` of a model's ``file_path``; None when it is not ``models/...``; 400 when it is
    one that may not be placed."""
    if not file_path.replace("\\", "/").startswith(MODEL_PREFIX):
        return None
    parts = PurePosixPath(file_path.replace("\\", "/")).parts[1:]
    if len(parts) < 2 or parts[0] not in MODEL_FOLDERS or any(p in ("", ".", "..") for p in parts):
        raise ApiError(400, "invalid_request", f"file_path {file_path[:200]!r}: a model is placed at "
                       f"models/<folder>/<name>{MODEL_SUFFIX}, <folder> one of {', '.join(sorted(MODEL_FOLDERS))}, "
                       "with no . or .. parts")
    if not parts[-1].lower().endswith(MODEL_SUFFIX):
        raise ApiError(400, "invalid_request", f"file_path {file_path[:200]!r}: only {MODEL_SUFFIX} files are "
                       "placed in a model folder (a pickled model can run code when it is loaded)")
    return parts[0], "/".join(parts[1:])


def is_safetensors(path: Path) -> bool:
    """The file starts as a safetensors file does: an 8-byte little-endian length, then that much JSON object."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return False
        (length,) = struct.unpack("<Q", head)
        if not 2 <= length <= min(MAX_HEADER_BYTES, os.fstat(f.fileno()).st_size - 8):
            return False
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError):
            return False
    return isinstance(header, dict)


def place_model(models_dir: str, received: Path, file_path: str) -> str:
    """Place the uploaded file (``received``) in ``models_dir`` (blocking: run it off the event loop); the name a
    workflow gives it. 403 when no ``[api] models_dir`` is set, 400 when it is no safetensors file, 409 when
    another file holds the name."""
    folder, below = model_name(file_path) or ("", "")
    if not models_dir:
        raise _forbidden(f"file_path {file_path[:200]!r} is a model file; this API places models only when [api] "
                         "models_dir names ComfyUI's model folder, and it is not set")
    if not is_safetensors(received):
        raise ApiError(400, "invalid_request", f"{file_path[:200]!r} is not a safetensors file (its header does "
                       "not parse); only safetensors models are placed")
    parts = [folder, *below.split("/")]
    root = safefs.open_root(Path(models_dir), create=True)
    try:
        with safefs.dir_beneath(root, parts[:-1], create=True, where=f"{MODEL_PREFIX}{'/'.join(parts[:-1])}") as at:
            temporary = f".placing-{uuid.uuid4().hex}"
            fd = safefs.open_file(at, temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as out, open(received, "rb") as source:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                os.link(temporary, parts[-1], src_dir_fd=at, dst_dir_fd=at, follow_symlinks=False)
            except FileExistsError:
                raise ApiError(409, "hash_mismatch", f"{file_path[:200]!r} exists in [api] models_dir already; "
                               "a placed model is never replaced: upload it under another name") from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=at)
    except safefs.Escapes as exc:
        raise _forbidden(f"{file_path[:200]!r}: {exc.strerror}") from None
    finally:
        os.close(root)
    return below


def placed(models_dir: str, file_path: str) -> str | None:
    """The name a workflow gives a placed model (the path below its folder), when ``file_path`` names one that is
    in ``models_dir``; None otherwise (an ordinary input file)."""
    if not models_dir or not file_path.startswith(MODEL_PREFIX):
        return None
    try:
        folder, below = model_name(file_path) or ("", "")
        os.close(safefs.open_beneath(Path(models_dir), f"{folder}/{below}"))
    except (ApiError, OSError):
        return None
    return below


def _below(root: Path, path: str) -> str | None:
    """``path`` relative to ``root`` (a relative ``path`` is taken as relative to it), or None when it is not below."""
    given = PurePosixPath(path.replace("\\", "/"))
    if not given.is_absolute():
        return str(given)
    try:
        return str(given.relative_to(PurePosixPath(root.absolute())))
    except ValueError:
        return None


def _open(roots: list[Path], path: str) -> tuple[int, Path, str]:
    """The file ``path`` names below one of ``roots``, opened through no symlink (comfysup.safefs)."""
    for root in roots:
        relative = _below(root, path)
        if relative is None:
            continue
        try:
            return safefs.open_beneath(root, relative), root, relative
        except FileNotFoundError:
            continue
        except safefs.Escapes as exc:
            if exc.errno == errno.EINVAL and "regular file" in str(exc.strerror):
                raise ApiError(404, "blob_not_found", f"{path[:200]} is not a regular file") from None
            raise _forbidden(f"{path[:200]}: {exc.strerror}; from-path reads only regular files below [api] "
                             "path_roots, reached through no symlink") from None
        except (NotADirectoryError, IsADirectoryError):
            raise ApiError(404, "blob_not_found", f"{path[:200]} is not a file") from None
        except PermissionError:
            raise _forbidden(f"{path[:200]} cannot be read (permission denied)") from None
    if any(_below(root, path) is not None for root in roots):
        raise ApiError(404, "blob_not_found", f"no such file {path[:200]} below [api] path_roots")
    raise _forbidden(f"{path[:200]} is not below [api] path_roots ({', '.join(str(r) for r in roots)})")


def _hash(roots: list[Path], path: str, limit: int) -> tuple[str, int, str]:
    """Blocking: (hash, size, the file's path) of the file; 413 past ``limit`` bytes."""
    fd, root, relative = _open(roots, path)
    with os.fdopen(fd, "rb") as f:
        try:
            digest, size = assets.hash_stream(f, limit)
        except ValueError:
            raise ApiError(413, "payload_too_large", f"{path[:200]} is larger than {limit // (1 << 20)} MiB "
                           "([assets] max_file_mb)") from None
    return digest, size, str(root / relative)


async def from_path(request: Any) -> Any:
    """``POST /api/v2/assets/from-path`` ``{"path", "file_path"?, "content_type"?}``: the Asset, 201 or 200."""
    state = request.app[STATE_KEY]
    api = state.config.api
    if not api.path_roots:
        raise _forbidden("POST /api/v2/assets/from-path reads files on this machine only below [api] path_roots, "
                         "and none is set; upload the file (POST /api/v2/assets) instead")
    body = await read_json(request, MAX_JSON_BYTES, f"{MAX_JSON_BYTES // 1024} KiB (a path and a name)")
    if not isinstance(body, dict) or not isinstance(body.get("path"), str) or not body["path"]:
        raise ApiError(400, "invalid_request", "the body is {\"path\": \"<a file below [api] path_roots>\"} with "
                       "an optional file_path and content_type")
    unknown = set(body) - {"path", "file_path", "content_type"}
    if unknown:
        raise ApiError(400, "invalid_request", f"unknown field {sorted(unknown)[0]!r}")
    for name in ("file_path", "content_type"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or not value.isprintable() or len(value) > 4096):
            raise ApiError(400, "invalid_request", f"{name} must be a name of printable characters")
    roots = [state.config.resolve(r) for r in api.path_roots]
    limit = state.config.assets.max_file_mb << 20
    digest, size, where = await asyncio.get_running_loop().run_in_executor(None, _hash, roots, body["path"], limit)
    name = body.get("file_path") or PurePosixPath(where).name
    content_type = body.get("content_type") or views.content_type(name)
    add = functools.partial(state.queue.assets.add_api_asset, tenant=tenant_of(tenancy.tenant(request)))
    record, created_new = await state.call(add, NewAsset(digest, size, name, where), content_type,
                                           float(api.upload_retention_hours) * 3600.0, None)
    return json_response(views.uploaded(record, origin(request), time.time(), created_new),
                         status=201 if created_new else 200)
