"""Record what ComfyUI's frontend makes of UI workflows: ``python -m tests.ui_reference.record``.

For every case (the template workflows of ``comfyui-workflow-templates`` whose nodes the recorded catalogue
knows, and the built cases of ``tests/ui_reference/cases.py``) it loads the workflow into the frontend with
``app.loadGraphData`` and writes ``{"workflow", "prompt"}`` (``prompt``: ``app.graphToPrompt()``'s output)
to ``tests/recorded/ui/<name>.json``. The unit tests compare comfysup's conversion with these files, so the
ordinary suite needs no browser. The catalogue is ``tests/recorded/ui/object-info.json``: GET /object_info
of a CPU-only ComfyUI 0.3.64 (frontend 1.27.10, templates 0.1.95) without torchaudio, so its audio nodes are
absent and the templates that use them are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.ui_reference import cases, frontend

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
CATALOGUE = RECORDED / "object-info.json"
VIRTUAL = {"Note", "MarkdownNote", "PrimitiveNode", "Reroute"}


def templates_root() -> Path:
    import comfyui_workflow_templates  # optional: recording tooling only

    return Path(comfyui_workflow_templates.__file__).parent / "templates"


def node_types(workflow: dict[str, Any]) -> set[str]:
    graphs = [workflow, *workflow.get("definitions", {}).get("subgraphs", [])]
    found = {node["type"] for graph in graphs for node in graph.get("nodes", [])}
    subgraphs = {graph["id"] for graph in graphs[1:]}
    return found - subgraphs - VIRTUAL


def templates(catalogue: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The template workflows whose nodes ``catalogue`` knows, as (case name, workflow); the rest are reported."""
    for path in sorted(templates_root().glob("*.json")):
        workflow = json.loads(path.read_text())
        if not isinstance(workflow, dict) or "nodes" not in workflow:
            continue
        missing = node_types(workflow) - set(catalogue)
        if missing:
            print(f"left out {path.name}: the catalogue lacks {', '.join(sorted(missing))}", file=sys.stderr)
            continue
        yield f"template-{path.stem}", workflow


def all_cases(catalogue: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from templates(catalogue)
    yield from cases.built(templates_root())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="record only these cases (default: all)")
    args = parser.parse_args(argv)
    catalogue = json.loads(CATALOGUE.read_text())
    kept = [(name, wf) for name, wf in all_cases(catalogue) if not args.names or name in args.names]
    with frontend.frontend(catalogue) as page:
        for name, workflow in kept:
            prompt = page.prompt(workflow)
            recording = {"workflow": workflow, "prompt": prompt}
            (RECORDED / f"{name}.json").write_text(json.dumps(recording, indent=1) + "\n")
            print(f"recorded {name}: {len(prompt)} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
