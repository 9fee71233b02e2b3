"""The model manifest: ``[[models]]`` entries of config.toml and of the models.toml it names, read and checked.

Each entry says which file a ComfyUI model folder must hold (``folder``, ``name``), where it comes from (``url``)
and what it must be (``sha256``). Everything is checked here, before anything is fetched: a folder ComfyUI has no
loader for (a typo such as ``checkpoint`` would fetch gigabytes no server ever lists), a name that could leave its
folder, a URL of a scheme nothing fetches, a hash that is not 64 hex digits, one file named twice. Each message
names the file, the entry and what to write instead.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from comfysup.config.schema import ModelFile
from comfysup.errors import ConfigError

FOLDERS = frozenset({
    "checkpoints", "configs", "loras", "vae", "text_encoders", "clip", "diffusion_models", "unet", "clip_vision",
    "style_models", "embeddings", "diffusers", "vae_approx", "controlnet", "t2i_adapter", "gligen", "upscale_models",
    "latent_upscale_models", "hypernetworks", "photomaker", "classifiers", "model_patches", "audio_encoders",
    "background_removal", "frame_interpolation", "geometry_estimation", "optical_flow", "detection",
})
"""ComfyUI's model folders (folder_paths.folder_names_and_paths of 0.3.64 to 0.38; ``clip`` and ``unet`` are its
legacy names of ``text_encoders`` and ``diffusion_models``). ``custom_nodes`` is not one: it holds code."""
KEYS = ("folder", "name", "url", "sha256")
SHA256 = re.compile(r"[0-9a-fA-F]{64}")
MAX_NAME = 255


def read_models(body: Any, source: str, manifest: str, root: str,
                read_toml: Callable[[Path], dict[str, Any]]) -> tuple[ModelFile, ...]:
    """The entries of ``[[models]]`` in the config (``body``, None when absent) and of ``manifest`` (a path
    relative to ``root``, "" for none; read by the loader's ``read_toml``), in that order; the same folder and
    name twice is an error."""
    entries = list(_entries(body, source, Path(root))) if body is not None else []
    if manifest:
        path = Path(manifest).expanduser()
        path = path if path.is_absolute() else Path(root) / path
        if not path.is_file():
            raise ConfigError(f"{source}: [comfyui] models_manifest = {manifest!r}: no such file ({path}); write "
                              "the [[models]] entries there, or leave models_manifest empty")
        raw = read_toml(path)
        unknown = sorted(set(raw) - {"models"})
        if unknown:
            raise ConfigError(f"{path}: unknown key or section {unknown[0]!r}; a models manifest holds only "
                              "[[models]] entries (folder, name, url, sha256); settings go in config.toml")
        entries += _entries(raw.get("models", []), str(path), path.resolve().parent)
    seen: dict[tuple[str, str], ModelFile] = {}
    for entry in entries:
        key = (canonical_folder(entry.folder), entry.name)
        if key in seen:
            raise ConfigError(f"{entry.where}: {entry.folder}/{entry.name} is already named by {seen[key].where}; "
                              "a file is named once (remove one of them)")
        seen[key] = entry
    for (folder, name), entry in seen.items():  # a/b and a: the link of one would be the folder of the other
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if (parent := seen.get((folder, "/".join(parts[:depth])))) is not None:
                raise ConfigError(f"{entry.where}: {entry.folder}/{entry.name} is inside "
                                  f"{parent.folder}/{parent.name}, named by {parent.where}: "
                                  f"{parent.folder}/{parent.name} is a file and a folder; rename one of them")
    return tuple(entries)


def canonical_folder(folder: str) -> str:
    """ComfyUI's name of a folder: its legacy names map to the current ones (``clip`` → ``text_encoders``)."""
    return {"clip": "text_encoders", "unet": "diffusion_models"}.get(folder, folder)


def _entries(body: Any, source: str, base: Path) -> list[ModelFile]:
    if not isinstance(body, list):
        raise ConfigError(f"{source}: models must be an array of tables: [[models]] folder = \"checkpoints\", "
                          "name = ..., url = ..., sha256 = ...")
    return [_entry(entry, f"{source}: [[models]] #{i + 1}", base) for i, entry in enumerate(body)]


def _entry(entry: Any, where: str, base: Path) -> ModelFile:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a table with {', '.join(KEYS)}")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(KEYS)}")
    for key in KEYS:
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: {key} = {value!r}: expected a non-empty string ({_EXPECTED[key]})")
        bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
        if bad is not None:
            raise ConfigError(f"{where}: {key} contains the control character {bad!r}; remove it")
    folder, name, url, sha256 = (entry[k] for k in KEYS)
    if folder not in FOLDERS:
        near = difflib.get_close_matches(folder, FOLDERS, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError(f"{where}: folder = {folder!r}: not a ComfyUI model folder; {hint}expected one of "
                          f"{', '.join(sorted(FOLDERS))}")
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"{where}: name = {name!r}: {problem}; expected the file's name as the loaders list it, "
                          "like v1-5-pruned-emaonly.safetensors or sd15/v1-5-pruned-emaonly.safetensors")
    if not SHA256.fullmatch(sha256):
        raise ConfigError(f"{where}: sha256 = {sha256!r}: expected 64 hex digits (sha256sum FILE prints them; "
                          "Hugging Face shows them as the file's SHA256)")
    return ModelFile(folder=folder, name=name, url=_url(url, where, base), sha256=sha256.lower(), where=where)


_EXPECTED = {"folder": "a ComfyUI model folder such as checkpoints or loras",
             "name": "the file's name in that folder", "url": "https://…, s3://bucket/key or a local path",
             "sha256": "the file's SHA-256 in hex"}


def name_problem(name: str) -> str:
    """What makes ``name`` unfit as a file below its folder, or "": relative, no ``..``, no hidden part."""
    if "\\" in name:
        return "contains a backslash; separate sub-folders with /"
    if len(name.encode()) > MAX_NAME:
        return f"longer than {MAX_NAME} bytes"
    path = PurePosixPath(name)
    if path.is_absolute() or name.endswith("/"):
        return "not a relative file name"
    if any(part in ("", ".", "..") or part.startswith(".") for part in name.split("/")):
        return "has an empty, hidden, . or .. part"
    return ""


def _url(url: str, where: str, base: Path) -> str:
    """The entry's source: an http(s) or s3 URL as written, or a local path made absolute against ``base``."""
    if "://" not in url:
        path = Path(url).expanduser()
        return str(path if path.is_absolute() else (base / path).absolute())
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigError(f"{where}: url = {shown_url(url)!r}: no host; expected https://HOST/PATH")
        return url
    if scheme == "s3":
        if not parts.netloc or not parts.path.strip("/"):
            raise ConfigError(f"{where}: url = {url!r}: expected s3://BUCKET/KEY")
        return url
    raise ConfigError(f"{where}: url = {shown_url(url)!r}: the scheme {scheme!r} cannot be fetched; expected "
                      "https://…, http://…, s3://BUCKET/KEY or a path on this machine (relative to the file it is "
                      "written in)")


def shown_url(url: str) -> str:
    """``url`` as messages and logs show it: scheme, host, port and path, never a user, password or query (a
    presigned URL's signature, a token); a local path as it is."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unreadable url)"
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"
