"""Input files in a line's ``set``: ``{"file": "photos/cat.png"}`` or an API v2 ``core/ASSET`` reference.

A file comes from a place the operator chose (``InputFiles.roots``): for ``comfysup submit`` the jobs file's
folder and ``[assets] input_roots``, for the broker ``[rabbitmq] inputs_dir`` (none when unset), for the API
none. It is named relative to one of them, never absolute and never with ``..``, reached through no symlink,
and only a regular file is read (opened non-blocking and checked with ``fstat`` first: a FIFO cannot hang
submit or the consumer), its size bounded.

Each file is read and hashed (BLAKE3) once per submit however many lines name it, checked against the size
limits, and replaced in ``set`` by the reference the job stores (comfysup.assets). The reference carries the
hash, so the job's spec hash covers the file's content: the same id submitted again with a changed file is a
changed job, refused like one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from comfysup import assets, safefs
from comfysup.jobs.values import JobLineError, check_text
from comfysup.queue.base import NewAsset

MIB = 1024 * 1024


@dataclass
class InputFiles:
    """Resolves the file values of every line of one jobs file (relative to ``base_dir``)."""

    base_dir: Path
    roots: tuple[Path, ...] | None = None
    """The folders an input file may come from (the first that has it); None: ``base_dir`` alone. Empty: none,
    file inputs are refused (``where`` says why)."""
    where: str = "the jobs file's folder"
    """The roots as a person reads them, for messages."""
    max_file_bytes: int = 100 * MIB
    max_job_bytes: int = 512 * MIB
    _seen: dict[tuple[str, int, int, int], NewAsset] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.roots is None:
            self.roots = (self.base_dir,)

    def resolve(self, params: dict[str, Any]) -> tuple[dict[str, Any], tuple[NewAsset, ...]]:
        """``params`` with each file value replaced by its reference, and the assets they name."""
        if not any(isinstance(v, dict) for v in params.values()):
            return params, ()
        out, found, total = dict(params), {}, 0
        for key, value in params.items():
            if not isinstance(value, dict):
                continue
            if set(value) == {"file"}:
                asset = self._file(key, value["file"])
            elif value.get("__type") == assets.ASSET_TYPE:
                asset = self._reference(key, value)
            else:
                continue  # another object value: ComfyUI's own business (checked as any value)
            out[key] = assets.reference(asset.hash, asset.name, asset.size)
            if asset.hash not in found:
                found[asset.hash] = asset
                total += asset.size
        if total > self.max_job_bytes:
            raise JobLineError(f"the job's input files are {total:,} bytes together; at most "
                               f"{self.max_job_bytes:,} ([assets] max_job_mb)")
        return out, tuple(found.values())

    def _file(self, key: str, value: Any) -> NewAsset:
        if not isinstance(value, str) or not value:
            raise JobLineError(f"set {key!r}: \"file\" must be a path relative to {self.where}")
        check_text(value, f"set {key!r}: file")
        if not self.roots:
            raise JobLineError(f"set {key!r}: file {value!r}: {self.where}; send the file some other way "
                               "(a core/ASSET reference to an upload)")
        relative = value.replace("\\", "/")
        if PurePosixPath(relative).is_absolute() or ".." in PurePosixPath(relative).parts:
            raise JobLineError(f"set {key!r}: file {value!r}: an input file is named relative to {self.where}, "
                               "with no .. and no absolute path")
        relative = "/".join(p for p in PurePosixPath(relative).parts if p != ".")
        fd, root = self._open(key, value, relative)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            ident = (str(root / relative), st.st_dev, st.st_ino, st.st_mtime_ns)
            known = self._seen.get(ident)
            if known is not None and known.size == st.st_size:
                return known
            if st.st_size > self.max_file_bytes:
                raise JobLineError(self._too_large(key, value, st.st_size))
            try:
                digest, size = assets.hash_stream(f, self.max_file_bytes)
            except ValueError:
                raise JobLineError(self._too_large(key, value, st.st_size)) from None
            except OSError as exc:
                raise JobLineError(f"set {key!r}: {value} cannot be read ({exc.strerror})") from None
        asset = self._seen[ident] = NewAsset(digest, size, PurePosixPath(relative).name, str(root / relative))
        return asset

    def _open(self, key: str, value: str, relative: str) -> tuple[int, Path]:
        """The file below the first root that has it, opened (see comfysup.safefs.open_beneath), and that root."""
        for root in self.roots:
            try:
                return safefs.open_beneath(root, relative), root
            except FileNotFoundError:
                continue
            except safefs.Escapes as exc:
                raise JobLineError(f"set {key!r}: file {value!r}: {exc.strerror}; an input file is a regular "
                                   f"file below {self.where}, reached through no symlink") from None
            except NotADirectoryError:
                raise JobLineError(f"set {key!r}: no such file {value} (a part of it is a file, not a folder)") \
                    from None
            except IsADirectoryError:
                raise JobLineError(f"set {key!r}: {value} is a folder, not a file") from None
            except PermissionError:
                raise JobLineError(f"set {key!r}: {value} cannot be read (permission denied)") from None
        raise JobLineError(f"set {key!r}: no such file {value} (relative to {self.where})")

    def _too_large(self, key: str, value: str, size: int) -> str:
        return (f"set {key!r}: {value} is {size:,} bytes; an input file may have at most {self.max_file_bytes:,} bytes "
                "([assets] max_file_mb)")

    def _reference(self, key: str, value: dict[str, Any]) -> NewAsset:
        info = value.get("info")
        digest = info.get("hash") if isinstance(info, dict) else None
        if not assets.is_hash(digest):
            raise JobLineError(f"set {key!r}: a core/ASSET reference needs info.hash \"blake3:<64 hex digits>\"")
        name = info.get("file_path") or info.get("name") or ""
        if not isinstance(name, str):
            raise JobLineError(f"set {key!r}: info.file_path must be a string")
        size = info.get("size", 0)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            size = 0
        return NewAsset(str(digest), size, PurePosixPath(check_text(name, "file_path").replace("\\", "/")).name)
