"""A clone anywhere is complete: no test, fake or module reads a file outside the project (the
recordings are the project's own copy in tests/recorded), and the copy holds what the tests read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIBLING = "sha" + "red"  # the workspace's folder beside a checkout, which a clone elsewhere does not have
OUTSIDE = re.compile(rf"""["']/work/{SIBLING}|parents\[\d+\]\s*/\s*["']{SIBLING}["']|["']\.\./{SIBLING}/""")


def test_no_code_reads_a_file_outside_the_project() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("tests", "fake_comfy", "comfysup", "bench")
             for p in sorted((ROOT / folder).rglob("*.py")) if p != Path(__file__)
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert found == []


def test_the_pattern_finds_a_path_outside_the_project() -> None:
    assert OUTSIDE.search(f'RECORDED = Path(__file__).resolve().parents[3] / "{SIBLING}" / "recorded"')
    assert OUTSIDE.search(f'Path("/work/{SIBLING}/recorded")') and not OUTSIDE.search('ROOT / "tests" / "recorded"')


def test_the_recordings_the_tests_read_are_in_the_project() -> None:
    recorded = ROOT / "tests" / "recorded"
    for name in ("success.json", "uploads.json", "execution-error.json", "object-info-t2i.json", "README.md",
                 "workflows/trivial.json", "workflows/t2i_sd15.json"):
        assert (recorded / name).is_file(), name
