"""The browser tier: ComfyUI's frontend converts the recorded cases again, live, and comfysup must agree.

It re-records every case of tests/recorded/ui with the frontend (tests/ui_reference) and compares each node's
class_type and declared inputs with comfysup.workflows.ui; the recordings themselves must still be what the
frontend gives. Skipped, saying why, where chromium, chromedriver, selenium or the frontend package is absent.
"""

from __future__ import annotations

import json

import pytest

from comfysup.workflows.ui import to_prompt
from tests.ui_reference import frontend
from tests.unit.test_workflows_ui import CASES, OBJECT_INFO, VERSION_SKEW, declared, first_choice

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WHY_NOT = frontend.available()


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no frontend to drive: {WHY_NOT}")
@pytest.mark.timeout(900)
def test_the_frontend_live_agrees_with_the_recordings_and_the_conversion() -> None:
    disagreements = []
    with frontend.frontend(OBJECT_INFO) as page:
        for path in CASES:
            recording = json.loads(path.read_text())
            live = page.prompt(recording["workflow"])
            if declared(live) != declared(recording["prompt"]):
                disagreements.append(f"{path.stem}: the frontend now gives another prompt than recorded")
            if path.stem not in VERSION_SKEW and declared(live) != declared(
                    to_prompt(recording["workflow"], OBJECT_INFO, choose=first_choice)):
                disagreements.append(f"{path.stem}: comfysup's conversion differs from the frontend's")
    assert not disagreements
