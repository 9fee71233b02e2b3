"""A workflow as a person brings it made into the API prompt a job runs: an API-format prompt as it is, a UI-format
("litegraph") workflow converted with the node catalogue the servers recorded, and an image ComfyUI saved read
for the prompt it carries (or, where it carries only its workflow, that converted).

Every door (jobs.jsonl, the Comfy API, broker messages, ``comfysup demo --jobs``) reads a workflow through here,
so each accepts the three. A UI workflow is carried along (``Brought.ui``) for the job's
``extra_data.extra_pnginfo.workflow``, as ComfyUI's frontend posts it, so the images the job saves open in
ComfyUI with their graph.

A widget with dynamic prompts (``{a|b}``) is where the frontend chooses at random each time it queues. A job
chooses seeded by its id (``Brought.for_job``): the same line submitted again, or a retry, runs the same text,
and each job of a batch has its own choice.

A line without an id is named by the workflow as it was given (the UI file's content), not by the converted
prompt: the id is known before the conversion that it seeds, and the same line stays the same job when a
server's catalogue changes what the conversion gives.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from comfysup.jobs.line import Line
from comfysup.jobs.values import JobLineError
from comfysup.workflows import canonical, content_hash, image
from comfysup.workflows.errors import UIWorkflowError
from comfysup.workflows.names import ParameterNameError, find_node
from comfysup.workflows.ui import is_ui_workflow, to_prompt

IMAGE_HEADS = (b"\x89PNG\r\n\x1a\n", b"RIFF")
NO_CATALOGUE = ("converting it needs the node catalogue (/object_info) that a server records in the queue when it "
                "starts: start a server once (comfysup run or comfysup work), or convert it here with "
                "`comfysup workflow convert FILE --object-info object_info.json` and submit the API prompt")
_ID = re.compile(r"[0-9:]+")
"""A node id or id path: a set key naming one that the workflow lacks is refused as apply_set refuses it."""


class Brought(NamedTuple):
    """A workflow brought: its API ``prompt``; the UI workflow it came from, or that an image carried beside its
    prompt (None for an API prompt); the address of the UI workflow converted (what a line's derived id takes;
    empty where the prompt was given, whose own address it takes); and whether its conversion chose among the
    options of a dynamic prompt (then each job converts it again, ``for_job``)."""

    prompt: dict[str, Any]
    ui: dict[str, Any] | None = None
    source_hash: str = ""
    dynamic: bool = False
    object_info: Mapping[str, Any] | None = None
    catalogue_name: str = "the node catalogue"

    def for_job(self, job_id: str) -> dict[str, Any]:
        """The prompt job ``job_id`` runs: the dynamic prompts' options chosen by a generator seeded by its id."""
        if not self.dynamic or self.ui is None:
            return self.prompt
        return to_prompt(self.ui, self.object_info or {}, catalogue_name=self.catalogue_name,
                         choose=random.Random(job_id).choice)


class _FirstChoice:
    """The first option of every dynamic prompt, remembering that there was one."""

    def __init__(self) -> None:
        self.used = False

    def __call__(self, options: Sequence[str]) -> str:
        self.used = True
        return options[0]


def is_image(data: bytes) -> bool:
    """Whether a file's first bytes are a PNG's or a RIFF (WEBP) container's."""
    return any(data.startswith(head) for head in IMAGE_HEADS)


def bring_image(path: Path, object_info: Mapping[str, Any], where: str,
                catalogue_name: str = "the node catalogue") -> Brought:
    """The workflow a PNG or WEBP that ComfyUI saved carries: its API prompt, with its UI workflow riding along; or
    where it has no prompt, its UI workflow converted like any other."""
    try:
        found = image.read(path)
    except (UIWorkflowError, OSError) as exc:
        raise JobLineError(f"{where}: {exc}") from None
    if found.prompt is not None:
        return Brought(found.prompt, found.workflow)
    if found.workflow is None:
        raise JobLineError(f"{where} is an image without a workflow (ComfyUI writes 'prompt' and 'workflow' into "
                           "the images it saves; this one has neither)")
    return bring(found.workflow, object_info, where, catalogue_name)


def bring(value: dict[str, Any], object_info: Mapping[str, Any], where: str,
          catalogue_name: str = "the node catalogue") -> Brought:
    """The API prompt of ``value`` (an API prompt or a UI workflow); JobLineError with every problem of a UI
    workflow that does not convert, each prefixed with ``where``."""
    if not is_ui_workflow(value):
        return Brought(value)
    if not object_info:
        raise JobLineError(f"{where} is in ComfyUI's UI format; {NO_CATALOGUE}")
    chooser = _FirstChoice()
    try:
        prompt = to_prompt(value, object_info, catalogue_name=catalogue_name, choose=chooser)
    except UIWorkflowError as exc:
        raise JobLineError(*(f"{where}: {problem}" for problem in exc.problems)) from None
    return Brought(prompt, value, content_hash(canonical(value)), chooser.used, object_info, catalogue_name)


def by_id(prompt: Mapping[str, Any], params: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """``params`` with each key's node named by its id in ``prompt``: a key may name it by title, by a subgraph id
    path, or by a class name one node alone has (comfysup.workflows.names). A name that matches no node or several
    is added to ``problems`` with the candidates, and its key left out."""
    found: dict[str, Any] = {}
    for key, value in params.items():
        node, dot, name = key.rpartition(".")
        if not dot or not node or node in prompt or _ID.fullmatch(node):
            found[key] = value  # as written: apply_set judges it
            continue
        try:
            found[f"{find_node(prompt, node)}.{name}"] = value
        except ParameterNameError as exc:
            problems += [f"set key {key!r}: {problem}" for problem in exc.problems]
    return found


def name_by_id(prompt: Mapping[str, Any], line: Line) -> None:
    """The line's ``set`` keys with their nodes named by id, which is what the queue stores and a runner applies;
    the line's problems gain each name that matches no node or several."""
    if all(key.rpartition(".")[0] in prompt for key in line.params):
        return
    params = by_id(prompt, line.params, line.reasons)
    line.named = params if line.named is line.params else by_id(prompt, line.named, [])
    line.params = params
