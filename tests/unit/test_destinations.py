"""comfysup.destinations.address_problem on the IPv6 forms that carry an IPv4 address inside them."""

from __future__ import annotations

import pytest

from comfysup.destinations import address_problem


@pytest.mark.parametrize(("address", "why"), [
    ("::ffff:127.0.0.1", "127.0.0.1 is a loopback address"),  # IPv4-mapped
    ("2002:7f00:1::", "127.0.0.1 is a loopback address"),  # 6to4 of 127.0.0.1: a 6to4 relay may route it there
    ("2002:a9fe:a9fe::1", "169.254.169.254 is a link-local address"),  # 6to4 of the metadata service
    ("2002:0a00:0001::", "10.0.0.1 is a private address"),
    ("64:ff9b::a9fe:a9fe", "is a reserved address"),  # NAT64 of the metadata service
])
def test_an_embedded_private_ipv4_is_refused(address: str, why: str) -> None:
    assert why in (address_problem(address) or ""), address_problem(address)


@pytest.mark.parametrize("address", ["2002:0808:0808::", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(address) is None
