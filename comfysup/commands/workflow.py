"""``comfysup workflow convert|inspect FILE``: a workflow as a person has it (ComfyUI's Save, its API export, or an
image ComfyUI saved), shown as the API prompt a job runs, or as the list of what a job can ``set``.

A UI-format workflow is converted with a node catalogue (/object_info): the file given with ``--object-info``, or
else the catalogues the servers of the config's queue recorded (as ``comfysup submit`` converts it). An API prompt,
or an image that carries one, needs none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from comfysup.commands._common import config_from, queue_from
from comfysup.errors import ComfysupError, UsageError
from comfysup.jobs.graph import ObjectInfo
from comfysup.jobs.template import WorkflowCache
from comfysup.jobs.values import JobLineError
from comfysup.workflows.names import Parameter, settable

MAX_SHOWN_CHARS = 40
MAX_CHOICES_SHOWN = 6
COLUMNS = ("node", "title", "class", "input", "value", "type", "range or choices")
CATALOGUE_HELP = ("the node catalogue to convert a UI-format workflow with: ComfyUI's GET /object_info saved as "
                  "JSON (curl http://127.0.0.1:8188/object_info > object_info.json); without it, the catalogues "
                  "the servers of the config's queue recorded")


class WorkflowRefused(ComfysupError):
    """The workflow cannot be read or converted."""

    exit_code = 2


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("workflow", help="show a workflow as the API prompt a job runs, or what a "
                       "job can set", description="A workflow as you have it: the file ComfyUI's Save wrote (UI "
                       "format, subgraphs and all), its API export, or a PNG/WEBP that ComfyUI saved (which carries "
                       "its prompt and workflow). `convert` prints the API prompt a job runs; `inspect` lists every "
                       "input a jobs.jsonl line can set, with the keys to name it by.")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    convert = actions.add_parser("convert", parents=[common], help="print the API prompt ({node_id: {class_type, "
                                 "inputs, _meta}})", description="Print the API prompt of FILE, the bare object "
                                 "ComfyUI's /prompt takes as `prompt`, which is what comfysup submits for it. Dynamic "
                                 "prompts ({a|b}) show their first option; a job chooses seeded by its id.")
    inspect = actions.add_parser("inspect", parents=[common], help="list what a job can set", description="List "
                                 "every input of FILE's prompt that holds a value: node id, title, class, input, its "
                                 "value, type, and range or choices. A jobs.jsonl line sets one with "
                                 '"set": {"NODE.INPUT": value}, NODE being the id (3, or 57:12 inside a subgraph) or '
                                 "the title (\"Positive Prompt.text\") or a class one node alone has "
                                 '("KSampler.seed").')
    inspect.add_argument("--json", action="store_true", help="one JSON array of objects instead of the table")
    for action in (convert, inspect):
        action.add_argument("file", metavar="FILE", type=Path, help="a workflow .json (UI or API format) or a "
                            "PNG/WEBP image ComfyUI saved")
        action.add_argument("--object-info", metavar="FILE", type=Path, help=CATALOGUE_HELP)
    convert.set_defaults(func=run_convert)
    inspect.set_defaults(func=run_inspect)


def run_convert(args: argparse.Namespace) -> int:
    prompt, _info = _prompt(args)
    print(json.dumps(prompt, indent=2, ensure_ascii=False))
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    prompt, info = _prompt(args)
    found = settable(prompt, info)
    if args.json:
        print(json.dumps([_row(p) for p in found], indent=2, ensure_ascii=False))
        return 0
    rows = [COLUMNS, *([_text(v) for v in _row(p).values()] for p in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f'\n{len(found)} input(s); a jobs.jsonl line sets one with "set": {{"NODE.INPUT": value}}, NODE being the '
          "node id or its title")
    return 0


def _prompt(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """FILE's API prompt and the catalogue it was converted with."""
    path: Path = args.file
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    info = _catalogue(args)
    try:
        template = WorkflowCache(ObjectInfo(info)).template(path)
    except JobLineError as exc:
        for reason in exc.reasons:
            print(f"{path}: {reason}", file=sys.stderr)
        raise WorkflowRefused(f"{len(exc.reasons)} problem(s) in {path}") from None
    return template.brought.prompt, info


def _catalogue(args: argparse.Namespace) -> dict[str, Any]:
    """--object-info's catalogue, or the union of those the config's queue holds; empty when there is none."""
    if args.object_info is not None:
        try:
            info = json.loads(args.object_info.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--object-info {args.object_info}: {exc}") from None
        if not isinstance(info, dict):
            raise UsageError(f"--object-info {args.object_info}: not an /object_info object")
        return info
    try:
        queue = queue_from(config_from(args, required=False))
    except ComfysupError:
        return {}  # no queue here: an API prompt or an image's still converts
    try:
        return {name: spec for found in queue.fleet.catalogues() for name, spec in found.info.items()}
    finally:
        queue.close()


def _row(parameter: Parameter) -> dict[str, Any]:
    if parameter.choices is not None:
        limits: Any = list(parameter.choices)
    elif parameter.minimum is not None or parameter.maximum is not None:
        limits = {"min": parameter.minimum, "max": parameter.maximum, "step": parameter.step}
    else:
        limits = None
    return {"node": parameter.node_id, "title": parameter.title, "class": parameter.class_type,
            "input": parameter.input, "value": parameter.value, "type": parameter.type, "limits": limits}


def _text(value: Any) -> str:
    """A cell of the table: a value as JSON, choices as the first few, a range as min..max."""
    if isinstance(value, list):
        more = f", … ({len(value)})" if len(value) > MAX_CHOICES_SHOWN else ""
        return ", ".join(_text(v) for v in value[:MAX_CHOICES_SHOWN]) + more
    if isinstance(value, dict) and "min" in value:
        return f"{_text(value['min'])}..{_text(value['max'])}" + (
            f" step {_text(value['step'])}" if value.get("step") is not None else "")
    text = "-" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 1] + "…"
