"""How many recorded cases comfy-cli's converter gets identical to the frontend, beside comfysup's count.

Run with a Python that has comfy-cli 1.23 installed (a scratch virtual environment, never a dependency), from
the repository root: ``/tmp/venv/bin/python -m tests.ui_reference.compare_comfy_cli``. comfy-cli is run as its
users run it: ``comfy_cli.workflow_to_api.convert_ui_to_api(workflow, object_info)``. A case counts as
identical when every node has the frontend's class_type and inputs; "declared" compares only the inputs the
catalogue declares (the frontend's extensions add others).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from comfy_cli.workflow_to_api import convert_ui_to_api  # optional: the scratch environment's comfy-cli

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from comfysup.workflows import catalogue
from comfysup.workflows.ui import to_prompt

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"


def shown(prompt: dict, object_info: dict, declared_only: bool) -> dict:
    out = {}
    for node_id, node in prompt.items():
        names = {name for name, _, _ in catalogue.ordered_inputs(object_info.get(node["class_type"], {}))}
        inputs = {k: v for k, v in node["inputs"].items() if k in names or not declared_only}
        out[str(node_id)] = (node["class_type"], inputs)
    return out


def score(convert, cases, object_info) -> tuple[int, int, int]:
    identical = declared = failed = 0
    for workflow, reference in cases:
        try:
            mine = convert(workflow)
        except Exception:  # a refusal or a crash counts as a miss either way
            failed += 1
            continue
        identical += shown(mine, object_info, False) == shown(reference, object_info, False)
        declared += shown(mine, object_info, True) == shown(reference, object_info, True)
    return identical, declared, failed


def main() -> int:
    object_info = json.loads((RECORDED / "object-info.json").read_text())
    cases = []
    for path in sorted(RECORDED.glob("*.json")):
        if path.name != "object-info.json":
            recording = json.loads(path.read_text())
            cases.append((recording["workflow"], recording["prompt"]))
    rows = {
        "comfysup": lambda wf: to_prompt(wf, object_info, choose=lambda options: options[0]),
        "comfy-cli 1.23": lambda wf: convert_ui_to_api(json.loads(json.dumps(wf)), object_info),
    }
    print(f"{len(cases)} recorded cases: identical / identical on declared inputs / refused or failed")
    for name, convert in rows.items():
        identical, declared, failed = score(convert, cases, object_info)
        print(f"{name:15} {identical:4} {declared:4} {failed:4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
