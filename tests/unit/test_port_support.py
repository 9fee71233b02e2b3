"""The fixed ports the tests give servers that start later or restart (a supervisor's slots, an API killed and
started again) lie outside the range the OS hands to outgoing connections: no connection opened meanwhile can
take one (what failed .ci/run on a fresh machine: a slot's port was some connection's local end)."""

from __future__ import annotations

import socket

import pytest
from port_support import candidates, ephemeral_range, server_port
from supervisor_support import free_base_port


@pytest.mark.timeout(20)
def test_server_ports_lie_outside_the_range_of_outgoing_connections() -> None:
    low, high = ephemeral_range()
    if not candidates(2):
        pytest.skip(f"this machine gives outgoing connections nearly every port ({low}-{high})")
    bases = [free_base_port(2) for _ in range(100)] + [server_port() for _ in range(100)]
    inside = [b for b in bases if b + 1 >= low and b <= high]
    assert not inside, f"ports in the ephemeral range {low}-{high}: {inside[:10]}"
    base = free_base_port(2)
    for port in (base, base + 1):
        with socket.create_server(("127.0.0.1", port)):  # free when chosen
            pass
