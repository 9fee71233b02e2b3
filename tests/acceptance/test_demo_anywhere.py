"""`comfysup demo` from any directory: its examples ship in the package, its work folder
is the user's cache folder, never the current directory or the checkout, and a second run starts as clean as
the first (an earlier demo's queue would otherwise make it finish at once, having run nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from supervisor_support import REPO, demo_from_elsewhere, processes_under


def git_status() -> str | None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    return subprocess.run(["git", "status", "--porcelain", "--ignored=no"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_the_demo_runs_twice_from_another_directory_and_leaves_the_checkout_clean(tmp_path: Path) -> None:
    elsewhere, cache = tmp_path / "elsewhere", tmp_path / "cache"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
    env.update(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(cache))
    before = git_status()
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "comfysup", "demo"], cwd=elsewhere, env=env,
                                capture_output=True, text=True, timeout=80)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "10 of 10 job(s) done" in result.stdout
        assert f"demo in {cache / 'comfysup' / 'demo'}" in result.stderr
        # The second run queued and ran the ten jobs again: an earlier demo's queue is not reused.
        assert "submitted 10 job(s), 0 already submitted" in result.stdout
    assert list(elsewhere.iterdir()) == [], "nothing is written in the current directory"
    assert len(list((cache / "comfysup" / "demo" / "var" / "results").iterdir())) == 10
    assert git_status() == before, "the demo left something in the checkout"
    assert not processes_under(tmp_path)


def test_the_demo_refuses_a_folder_that_is_not_an_earlier_demos(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    result = subprocess.run([sys.executable, "-m", "comfysup", "demo", "--dir", str(tmp_path)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2, result.stderr
    assert "not empty and not an earlier demo's folder" in result.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_image_to_image_example_is_one_command_from_any_directory(tmp_path: Path) -> None:
    """The README's image-to-image batch: ``comfysup demo --example image-to-image``, run away from the checkout,
    finds its workflow and input images in the package, and every output pixel is its input's inverse."""
    from input_images import expected_inverse

    from comfysup.commands.demo import EXAMPLES
    from fake_comfy.uploads import decode_png

    result, lines, results = demo_from_elsewhere(tmp_path, "image-to-image")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(lines)} of {len(lines)} job(s) done" in result.stdout
    for line in lines:
        (output,) = (results / line["id"]).glob("*.png")
        _w, _h, _c, inverted = decode_png(output.read_bytes())
        source = next(v["file"] for v in line["set"].values() if isinstance(v, dict) and "file" in v)
        _w, _h, _c, original = decode_png((EXAMPLES / source).read_bytes())
        assert list(inverted) == [expected_inverse(v) for v in original]
    assert list((tmp_path / "elsewhere").iterdir()) == []  # the demo wrote nothing where it ran
    assert not processes_under(tmp_path)
