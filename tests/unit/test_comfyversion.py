"""What comfysup does per ComfyUI version (comfysup.comfyversion, describe_rejection, the command line, views)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from comfysup import comfyversion
from comfysup.comfy import describe_rejection
from comfysup.commands.health import Health, render
from comfysup.commands.status import render_slots
from comfysup.supervisor.versions import VersionWatch


@pytest.mark.parametrize(("version", "tested", "jobs"), [
    ("0.3.64", True, False), ("0.3.63", False, False), ("0.38.1", True, True), ("0.38", True, True),
    ("0.39.0", False, True), (None, True, False), ("nightly", True, False)])
def test_tested_range_and_jobs_api(version: str | None, tested: bool, jobs: bool) -> None:
    assert comfyversion.in_tested_range(version) is tested
    assert comfyversion.has_jobs_api(version) is jobs


def test_removed_flags_are_dropped_only_for_the_version_that_removed_them(tmp_path: Path) -> None:
    args = ["--normalvram", "--preview-method", "auto", "--disable-ipex-optimize"]
    assert comfyversion.accepted_args("0.38.1", args) == (["--preview-method", "auto"],
                                                          ["--normalvram", "--disable-ipex-optimize"])
    assert comfyversion.accepted_args("0.3.64", args) == (args, [])
    assert comfyversion.accepted_args(None, args) == (args, [])
    (tmp_path / "main.py").write_text("")
    assert comfyversion.read_version_file(tmp_path / "main.py") is None
    (tmp_path / "comfyui_version.py").write_text('__version__ = "0.38.1"\n')
    assert comfyversion.read_version_file(tmp_path / "main.py") == "0.38.1"


def test_new_rejections_read_as_reasons() -> None:
    missing = {"error": {"type": "missing_node_type", "message": "Node 'X' not found.", "details": "Node ID '#2'",
                         "extra_info": {"node_id": "2", "class_type": "NoSuchNode", "node_title": "X"}},
               "node_errors": {}}
    assert "node class 'NoSuchNode' is not installed on this server (node 2)" in describe_rejection(missing)
    cycle = {"error": {"type": "prompt_outputs_failed_validation", "details": "Dependency cycle detected: 1 -> 2"},
             "node_errors": {"1": {"class_type": "ImageInvert", "errors": [
                 {"type": "dependency_cycle", "message": "Dependency cycle detected", "details": "1 -> 2 -> 1"}]}}}
    reason = describe_rejection(cycle)
    assert "node 1 (ImageInvert): dependency_cycle: the workflow's links form a loop" in reason


def test_status_and_health_show_the_version() -> None:
    state = {"pid": 0, "updated_at": 0, "state": "stopped", "slots": [
        {"name": "gpu0", "device": "cpu", "state": "running", "comfyui_version": "0.38.1"}]}
    assert "0.38.1" in render_slots(state, 0.0) and "comfyui" in render_slots(state, 0.0)
    text = render([Health(name="gpu0", url="u", state="running", comfyui_version="0.3.64", healthy=True)], "n")
    assert "0.3.64" in text


def test_an_untested_version_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    watch = VersionWatch()
    with caplog.at_level(logging.WARNING):
        for name in ("gpu0", "gpu1"):
            watch.check(name, "0.40.0")
        watch.check("gpu0", "0.38.1")
    assert [r.getMessage() for r in caplog.records] == [comfyversion.untested_warning("gpu0", "0.40.0")]
