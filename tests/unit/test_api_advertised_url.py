"""comfysup.api.remote's pure parts: which URL an API advertises to the other machines, and which advertisement is
fresh enough to stream from."""

from __future__ import annotations

import pytest

from comfysup.api.remote import FRESH_SECONDS, advertised_url, fresh
from comfysup.queue.base import ApiEndpoint


def _no_name() -> str:
    raise AssertionError("the host name is asked for only when listen is a wildcard")


@pytest.mark.parametrize(("public_url", "listen", "bound", "expected"), [
    ("https://gpu7.example/", "127.0.0.1:9189", 9189, "https://gpu7.example"),  # set: as written, no trailing /
    ("http://10.0.0.7:9300", "10.0.0.7:0", 41234, "http://10.0.0.7:9300"),
    ("", "10.0.0.7:9189", 9189, "http://10.0.0.7:9189"),
    ("", "10.0.0.7:0", 41234, "http://10.0.0.7:41234"),  # port 0: the port it was given
    ("", "[fd00::7]:9189", 9189, "http://[fd00::7]:9189"),
    ("", "127.0.0.1:9189", 9189, ""),  # loopback: other machines cannot reach it, nothing is advertised
    ("", "127.0.0.2:9189", 9189, ""),
    ("", "localhost:9189", 9189, ""),
    ("", "[::1]:9189", 9189, ""),
])
def test_the_advertised_url(public_url: str, listen: str, bound: int, expected: str) -> None:
    assert advertised_url(public_url, listen, bound, _no_name) == expected


@pytest.mark.parametrize("listen", ["0.0.0.0:9189", "[::]:9189"])
def test_a_wildcard_listen_is_advertised_by_the_machines_name(listen: str) -> None:
    assert advertised_url("", listen, 9189, lambda: "gpu7.farm.example") == "http://gpu7.farm.example:9189"


@pytest.mark.parametrize(("age", "expected"), [(0.0, True), (FRESH_SECONDS - 0.5, True), (FRESH_SECONDS, False),
                                               (FRESH_SECONDS * 10, False)])
def test_an_advertisement_is_fresh_while_its_heartbeat_is_young(age: float, expected: bool) -> None:
    assert fresh(ApiEndpoint("machine-b", "http://10.0.0.8:9189", age)) is expected


def test_no_advertisement_is_not_fresh() -> None:
    assert fresh(None) is False
