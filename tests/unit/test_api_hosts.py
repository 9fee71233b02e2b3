"""The API's Host check (comfysup.api.security.HostCheck) on each kind of listen, and the config's checks of the
new [api] and [metrics] settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.api.security import HostCheck
from comfysup.errors import ConfigError
from tests.api_support import api_config


def test_a_wildcard_listen_answers_the_address_reached_and_the_machines_names() -> None:
    check = HostCheck("0.0.0.0", "", (), machine_names=("gpu7.lab.example", "gpu7"))
    reached = ("10.0.0.7", 9189)
    for host in ("10.0.0.7:9189", "gpu7.lab.example:9189", "GPU7:9189", "10.0.0.7"):
        assert check.allows(host, reached), host
    for host in ("10.0.0.8:9189", "evil.example:9189", "localhost:9189", "", "a b", "x@10.0.0.7"):
        assert not check.allows(host, reached), host
    assert check.allows("localhost:9189", ("127.0.0.1", 9189))  # the same wildcard, reached on loopback
    assert check.allows("10.0.0.7:9189", ("::ffff:10.0.0.7", 9189))  # an IPv4 client of a dual-stack socket


def test_a_loopback_listen_answers_loopback_names_and_the_configured_ones() -> None:
    check = HostCheck("127.0.0.1", "https://front.example", ("api.example", "[fd00::7]:8443"))
    reached = ("127.0.0.1", 9189)
    for host in ("localhost:9189", "127.0.0.1:9189", "[::1]:9189", "127.0.0.2", "front.example", "api.example:1",
                 "[fd00::7]:8443", None):
        assert check.allows(host, reached), host
    for host in ("evil.example", "[fd00::7]:8444", "fd00::7", "localhost.evil.example", "10.0.0.7:9189"):
        assert not check.allows(host, reached), host


@pytest.mark.parametrize(("settings", "words"), [
    ({"allowed_hosts": ["http://api.example"]}, "allowed_hosts"),
    ({"allowed_hosts": ["api.example:99999"]}, "port"),
    ({"max_connections": 10, "max_event_streams": 10}, "max_connections"),
    ({"header_timeout_seconds": 0}, "header_timeout_seconds"),
    ({"body_timeout_seconds": -1.0}, "body_timeout_seconds"),
])
def test_bad_api_settings_are_refused_with_their_name(tmp_path: Path, settings: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        api_config(tmp_path, **settings)


def test_bad_metrics_settings_are_refused_with_their_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_connections"):
        api_config(tmp_path, sections={"metrics": {"max_connections": 0}})
    with pytest.raises(ConfigError, match="header_timeout_seconds"):
        api_config(tmp_path, sections={"metrics": {"header_timeout_seconds": 0}})
