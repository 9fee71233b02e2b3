"""Each job's own place in a server's output folder: the prefix rewrite, the adoption scan, the clean-up.

A ComfyUI server's /history dies with its process. A server killed after a job's files were written and
before its history was read used to make comfysup run the job again (measured on a real ComfyUI: a kill
within ~20 ms of the file landing). Where comfysup can see the server's output folder (servers that
``comfysup run`` launches), every output node's ``filename_prefix`` becomes ``comfysup/<job id>/<prefix>``,
so ComfyUI (folder_paths.get_save_image_path) saves the job's files under ``output/comfysup/<job id>/``.
Then:

- the result store keeps the original names: :func:`store_name` strips the per-job folder;
- catch-up, when the history is gone and the prompt is not queued, adopts the files of a job whose every
  rewritten node left a complete file (:func:`scan`), instead of running the job again;
- once the done is recorded the job's folder is removed (:func:`remove`), so the output folder, which
  ComfyUI lists on every save to find the next counter, does not keep growing.

Conservative on purpose: a file that may be partly written is never adopted. A PNG must end with its IEND
chunk; any other file must be non-empty, unchanged over a short look and not modified just now. A prefix
that cannot be placed in the job's folder as it is (a link from another node, an absolute path, ``..``,
a ``%`` variable other than ``%batch_num%``) is left alone, and such a job is never adopted from disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comfysup import safefs
from comfysup.jobs import BUILTIN_OUTPUT_NODES
from comfysup.runner.store import PNG_END, PNG_SIGNATURE

log = logging.getLogger("comfysup.runner")
FOLDER = "comfysup"
"""The folder of the server's output folder that holds one folder per job."""
PNG_MAGIC, IEND = PNG_SIGNATURE, PNG_END
MAX_PNG_CHUNKS = 1_000_000
QUIET_SECONDS = 1.0
"""A non-PNG file modified less than this long ago may still be written: not adopted."""
LOOK_SECONDS = 0.2
"""Between the two looks at a non-PNG file's size and time."""
READ_CHUNK = 1 << 20
PREVIEW_NODES = frozenset({"PreviewImage", "PreviewAudio", "Preview3D", "Preview3DAnimation", "PreviewAny",
                           "SaveImageWebsocket", "ETN_SendImageWebSocket"})
"""Output nodes that write nothing to the output folder (temp files or the socket): no file is expected."""
UNLISTED_SAVERS = frozenset({"CheckpointSave", "CLIPSave", "VAESave", "ModelSave", "LoraSave"})
"""Savers whose files the history does not name (models): comfysup never stores them, so they stay where
the user's prefix puts them (moved into the job's folder they would be removed with it); such a job is not
adopted from disk."""


def job_folder(job_id: str) -> str:
    return f"{FOLDER}/{job_id}"


@dataclass(frozen=True)
class Expected:
    """What one rewritten output node leaves: files named ``<stem>_NNNNN_.<ext>`` in ``subfolder`` (relative
    to the job's folder; "" for the folder itself)."""

    node: str
    subfolder: str
    pattern: str
    """A regular expression, compiled only when a folder is scanned: a plan is made for every POST, a scan
    only after a server died, and each job's prefix is new to re's cache (0.1 ms a compile)."""


@dataclass(frozen=True)
class Plan:
    """A workflow with its prefixes moved into the job's folder, and what adoption then expects."""

    workflow: dict[str, Any]
    expected: tuple[Expected, ...]
    adoptable: bool
    """Every output node that writes files was rewritten (and at least one was): the folder can tell."""


def _place(prefix: str) -> tuple[str, str] | None:
    """(subfolder, stem) of an original prefix, as ComfyUI splits it; None when it cannot be moved as is."""
    if not prefix or "\0" in prefix or "\\" in prefix or prefix.startswith(("/", "~")):
        return None
    if "%" in prefix.replace("%batch_num%", ""):
        return None  # %date:…%, %width%…: the name is only known once ComfyUI expands it
    normalized = os.path.normpath(prefix)
    if normalized.startswith("..") or any(p in ("..", ".") for p in normalized.split("/")):
        return None
    subfolder, stem = os.path.split(normalized)
    return (subfolder, stem) if stem else None


def _pattern(stem: str) -> str:
    body = re.escape(stem).replace(re.escape("%batch_num%"), r"\d+")
    return rf"{body}_\d{{5,}}_\.[A-Za-z0-9]+"


def plan(workflow: dict[str, Any], job_id: str) -> Plan:
    """The workflow with every output node's string ``filename_prefix`` under ``comfysup/<job id>/``.

    A node is taken as one that saves files when it has a ``filename_prefix`` input (SaveImage and its
    friends, custom savers); a changed prefix changes the prompt, which only keeps ComfyUI's cache from
    serving one job's files as another's. The original workflow is not changed."""
    out: dict[str, Any] = {}
    expected: list[Expected] = []
    adoptable = True
    for node_id, node in workflow.items():
        inputs = node.get("inputs") if isinstance(node, dict) else None
        if not isinstance(inputs, dict) or "filename_prefix" not in inputs:
            out[node_id] = node
            if isinstance(node, dict) and _writes_without_prefix(str(node.get("class_type", ""))):
                adoptable = False
            continue
        prefix = inputs["filename_prefix"]
        place = _place(prefix) if isinstance(prefix, str) and node.get("class_type") not in UNLISTED_SAVERS else None
        if place is None:
            out[node_id] = node
            adoptable = False  # its files land outside the job's folder: the folder cannot vouch for them
            continue
        out[node_id] = {**node, "inputs": {**inputs, "filename_prefix": f"{job_folder(job_id)}/{prefix}"}}
        expected.append(Expected(str(node_id), place[0], _pattern(place[1])))
    return Plan(out, tuple(expected), adoptable and bool(expected))


def _writes_without_prefix(class_type: str) -> bool:
    """A known output node that saves files but has no filename_prefix input here (left linked, say)."""
    return class_type in BUILTIN_OUTPUT_NODES and class_type not in PREVIEW_NODES


def in_job_folder(subfolder: str, job_id: str) -> str | None:
    """A history entry's subfolder relative to the job's own folder ("" for the folder itself), or None when
    the file is not in the job's folder (a prefix that could not be moved there, another node's file)."""
    own = job_folder(job_id)
    if subfolder == own:
        return ""
    return subfolder[len(own) + 1:] if subfolder.startswith(own + "/") else None


def store_name(subfolder: str, job_id: str) -> str:
    """The subfolder a stored file keeps: the history's, without the per-job folder comfysup added."""
    within = in_job_folder(subfolder, job_id)
    return subfolder if within is None else within


# -- completeness --------------------------------------------------------------------------------------


def complete_png(fd: int) -> bool:
    """A whole PNG: the signature, chunk lengths that add up, and IEND as the very last bytes of the file."""
    size = os.fstat(fd).st_size
    if size < len(PNG_MAGIC) + len(IEND) or os.pread(fd, len(PNG_MAGIC), 0) != PNG_MAGIC:
        return False
    at = len(PNG_MAGIC)
    for _ in range(MAX_PNG_CHUNKS):
        head = os.pread(fd, 8, at)
        if len(head) < 8:
            return False
        (length,) = struct.unpack(">I", head[:4])
        end = at + 12 + length
        if end > size:
            return False
        if head[4:8] == b"IEND":
            return end == size and os.pread(fd, 12, at) == IEND
        at = end
    return False


def complete(fd: int, name: str, *, now: Callable[[], float] = time.time,
             sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether the open file ``name`` is whole: a PNG by its structure, anything else by being non-empty,
    not modified for QUIET_SECONDS and unchanged over a second look."""
    if name.lower().endswith(".png"):
        return complete_png(fd)
    first = os.fstat(fd)
    if first.st_size == 0 or now() - first.st_mtime < QUIET_SECONDS:
        return False
    sleep(LOOK_SECONDS)
    second = os.fstat(fd)
    return (second.st_size, second.st_mtime_ns) == (first.st_size, first.st_mtime_ns)


# -- the job's folder on disk --------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """A complete file of the job's folder: its subfolder below the folder (as the store keeps it) and name."""

    subfolder: str
    filename: str
    node: str = ""
    """The output node that wrote it, when only one node writes files of its pattern (else "")."""

    @property
    def relative(self) -> str:
        return f"{self.subfolder}/{self.filename}" if self.subfolder else self.filename


def scan(output_dir: Path, job_id: str, expected: tuple[Expected, ...]) -> list[Found] | None:
    """The job's files when every expected node left at least one complete file, else None.

    Nodes with the same subfolder and pattern share files, so as many files as such nodes are needed. Any
    file that matches a node's pattern and is not complete makes the whole folder untrustworthy: None.
    Nothing is read through a symlink."""
    if not expected:
        return None
    groups: dict[tuple[str, str], list[str]] = {}
    for e in expected:
        groups.setdefault((e.subfolder, e.pattern), []).append(e.node)
    found: list[Found] = []
    try:
        with _job_fd(output_dir, job_id) as job:
            for (subfolder, pattern), nodes in groups.items():
                names = _matching(job, subfolder, re.compile(pattern))
                if names is None or len(names) < len(nodes):
                    return None
                found += [Found(subfolder, n, nodes[0] if len(nodes) == 1 else "") for n in names]
    except (OSError, ValueError):
        return None
    return found


def _matching(job: int, subfolder: str, pattern: re.Pattern[str]) -> list[str] | None:
    parts = [p for p in subfolder.split("/") if p]
    with safefs.dir_beneath(job, parts) as folder:
        names = sorted(n for n in os.listdir(folder) if pattern.fullmatch(n))
        for name in names:
            fd = safefs.open_file(folder, name)
            try:
                if not complete(fd, name):
                    return None
            finally:
                os.close(fd)
    return names


def adopt(output_dirs: dict[str, Path], servers: list[str], workflow: dict[str, Any],
          job_id: str, *, discard_unadoptable: bool = True) -> tuple[str, list[Found]] | None:
    """The first of ``servers`` (each answered, with neither the prompt nor its history: restarted) whose
    output folder holds a whole run of the job, and its files. A folder that cannot vouch for a whole run
    is emptied on the way: the job runs again, and its leftovers must not mix with the new run's files."""
    job_plan = plan(workflow, job_id)
    for server in servers:
        if server not in output_dirs:
            continue
        found = scan(output_dirs[server], job_id, job_plan.expected) if job_plan.adoptable else None
        if found:
            return server, found
        if discard_unadoptable:
            discard(output_dirs, server, job_id)
    return None


def discard(output_dirs: dict[str, Path], server: str, job_id: str) -> None:
    """Best-effort :func:`remove` of the job's folder on ``server`` (a folder that stays costs only space)."""
    try:
        remove(output_dirs[server], job_id)
    except (OSError, ValueError, KeyError) as exc:
        log.debug("job %s: could not remove its folder in %s's output folder: %s", job_id, server, exc)


def read(output_dir: Path, job_id: str, relative: str) -> Iterator[bytes]:
    """The bytes of one file of the job's folder, in chunks, never through a symlink."""
    yield from _chunks(_open(output_dir, job_id, relative))


_FELL_BACK: set[Path] = set()
"""Output folders a local read fell back to /view from (warned once each)."""


def read_or(output_dir: Path, job_id: str, relative: str, otherwise: Callable[[], Iterable[bytes]]) -> Iterator[bytes]:
    """The bytes of one file of the job's folder, or ``otherwise``'s (its download through /view) when the file
    cannot be opened there: an output folder configured for another server, a file written elsewhere. Only
    the open falls back; a read that fails after it raises, as a download cut short does."""
    try:
        opened = _open(output_dir, job_id, relative)
    except (OSError, ValueError) as exc:
        if output_dir not in _FELL_BACK:  # once a folder: an output_dir that is not the server's says so
            _FELL_BACK.add(output_dir)
            log.warning("job %s: %s is not in %s (%s), downloaded through /view instead; if that folder is not "
                        "the server's output folder, its output_dir is wrong", job_id, relative, output_dir, exc)
        yield from otherwise()
        return
    yield from _chunks(opened)


def _chunks(fd: int) -> Iterator[bytes]:
    """The file's bytes read from its descriptor as they come (a buffered file object would add an fstat, an
    ioctl and an lseek to its open, and a third read at the end, for nothing), closed at the end."""
    try:
        while chunk := os.read(fd, READ_CHUNK):
            yield chunk
    finally:
        os.close(fd)


def _open(output_dir: Path, job_id: str, relative: str) -> int:
    *parts, name = relative.split("/")
    with _job_fd(output_dir, job_id) as job, safefs.dir_beneath(job, parts) as folder:
        return safefs.open_file(folder, name)


def remove(output_dir: Path, job_id: str) -> None:
    """Remove ``output/comfysup/<job id>/`` and all below it; a symlink is removed as a link, never followed.
    Raises OSError; callers treat it as best-effort."""
    if "/" in job_id or job_id in ("", ".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    try:
        parent = safefs.open_below(output_dir, FOLDER)
    except FileNotFoundError:
        return
    try:
        safefs.remove_tree(parent, job_id)
    finally:
        os.close(parent)


@contextlib.contextmanager
def _job_fd(output_dir: Path, job_id: str) -> Iterator[int]:
    if "/" in job_id or job_id in ("", ".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    parent = safefs.open_below(output_dir, FOLDER)
    try:
        with safefs.dir_beneath(parent, [job_id]) as fd:  # a folder: opened with O_DIRECTORY
            yield fd
    finally:
        os.close(parent)
