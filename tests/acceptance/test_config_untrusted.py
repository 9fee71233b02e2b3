"""The config is untrusted input too: a file that is not UTF-8, nested thousands deep, a
duration that is NaN, infinite or negative, a path with a NUL byte — each is one line naming the file, the key and
what to do, exit 2, never a traceback. Through the CLI, as a user meets it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli


def refused(tmp_path: Path, content: bytes | str, env: dict[str, str] | None = None) -> str:
    """``comfysup status --config`` of ``content``: exit 2, one line on stderr (returned), no traceback."""
    path = tmp_path / "config.toml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    done = run_cli("status", "--config", str(path), cwd=tmp_path, env=env)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0] or "$COMFYSUP" in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(60)
def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    line = refused(tmp_path, b'[queue]\npath = "q\xff.db"\n')
    assert "not UTF-8" in line and "byte 17" in line


@pytest.mark.timeout(60)
def test_a_config_nested_thousands_deep_is_one_line(tmp_path: Path) -> None:
    line = refused(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested" in line and "deep" in line


@pytest.mark.timeout(60)
def test_a_config_nested_past_the_bound_but_parsable_is_refused(tmp_path: Path) -> None:
    line = refused(tmp_path, "[runner]\nattempts = " + "[" * 40 + "1" + "]" * 40 + "\n")
    assert "nested more than" in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_duration_that_is_nan_or_infinite_is_refused(tmp_path: Path, value: str) -> None:
    line = refused(tmp_path, f"[runner]\ntimeout_seconds = {value}\n")
    assert "[runner] timeout_seconds" in line and "finite" in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("section", "key"), [("runner", "timeout_seconds"), ("store", "max_file_mb"),
                                              ("api", "max_upload_mb"), ("api", "upload_retention_hours"),
                                              ("rabbitmq", "prefetch"), ("metrics", "max_workflow_labels")])
def test_a_negative_duration_or_size_is_refused(tmp_path: Path, section: str, key: str) -> None:
    line = refused(tmp_path, f"[{section}]\n{key} = -5\n")  # the key's own rule where it has one
    assert f"[{section}] {key} = -5" in line
    assert any(rule in line for rule in ("0 or more", "greater than 0", "more than 0", "at least 1")), line


@pytest.mark.timeout(60)
def test_a_nul_byte_in_a_path_is_refused(tmp_path: Path) -> None:
    line = refused(tmp_path, '[store]\ndir = "results\\u0000/etc"\n')
    assert "[store] dir" in line and "control character" in line


@pytest.mark.timeout(60)
def test_a_nan_from_the_environment_is_refused(tmp_path: Path) -> None:
    line = refused(tmp_path, "[runner]\nattempts = 3\n", env={"COMFYSUP_RUNNER_POLL_SECONDS": "nan"})
    assert "$COMFYSUP_RUNNER_POLL_SECONDS" in line and "finite" in line
