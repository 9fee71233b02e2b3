"""The test suite's own COMFYSUP_* switches are not settings: a ``comfysup run`` that a test starts inherits the
environment, and must not refuse to start because CI pointed the tests at another broker or database."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.config import load_config


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name, value", [("COMFYSUP_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5673/%2F"),
                                         ("COMFYSUP_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5433/postgres"),
                                         ("COMFYSUP_SKIP_POSTGRES", "1")])
def test_the_suites_switches_are_not_refused_as_unknown_settings(tmp_path: Path, name: str, value: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text("")
    config = load_config(str(path), env={name: value})
    assert config.source == str(path)
