"""comfysup.workflows.ui against ComfyUI's own frontend: every recorded case of tests/recorded/ui.

Each recording holds a UI workflow and what the frontend's ``app.graphToPrompt()`` made of it
(tests/ui_reference/record.py). The conversion must give the same nodes, each with the same ``class_type``
and the same values for every input the catalogue declares; inputs that only the frontend's extensions add
(a 3D preview's ``image``, LoadImageOutput's ``refresh``) are not reproduced (comfysup.workflows.ui).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from comfysup.workflows import catalogue
from comfysup.workflows.errors import UIWorkflowError
from comfysup.workflows.ui import to_prompt

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "ui"
OBJECT_INFO = json.loads((RECORDED / "object-info.json").read_text())
CASES = sorted(path for path in RECORDED.glob("*.json") if path.name != "object-info.json")
VERSION_SKEW = {
    # Saved by another version of the node: the frontend sends the values to the wrong inputs ("Seed": "PBR"),
    # which ComfyUI refuses at validation; comfysup refuses at conversion, naming the node.
    "template-api_rodin_gen2": "node 67",
    "template-api_moonvalley_video_to_video_motion_transfer": "node 38",
}


def first_choice(options):
    return options[0]


def declared(prompt: dict) -> dict:
    """Each node's class_type and the inputs its catalogue entry declares."""
    shown = {}
    for node_id, node in prompt.items():
        names = {name for name, _, _ in catalogue.ordered_inputs(OBJECT_INFO.get(node["class_type"], {}))}
        shown[node_id] = (node["class_type"], {k: v for k, v in node["inputs"].items() if k in names})
    return shown


@pytest.mark.parametrize("path", CASES, ids=lambda path: path.stem)
def test_conversion_is_what_the_frontend_queues(path: Path) -> None:
    recording = json.loads(path.read_text())
    if path.stem in VERSION_SKEW:
        with pytest.raises(UIWorkflowError, match=VERSION_SKEW[path.stem]):
            to_prompt(recording["workflow"], OBJECT_INFO, choose=first_choice)
        return
    mine = to_prompt(recording["workflow"], OBJECT_INFO, choose=first_choice)
    assert declared(mine) == declared(recording["prompt"])


def test_the_recordings_cover_the_templates_and_the_built_cases() -> None:
    names = {path.stem for path in CASES}
    assert len([name for name in names if name.startswith("template-")]) >= 150
