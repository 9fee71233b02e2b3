"""Fixed ports for the servers the tests start and restart (a supervisor's ComfyUI slots, an API killed and
started again, a fake_comfy and its successor): ports no outgoing connection can take.

A port taken from the OS (bind to port 0, close, hand the number on) lies in the range the OS also gives the
local ends of outgoing connections (/proc/sys/net/ipv4/ip_local_port_range): any connection opened before
the server binds it, or between two of its starts, can take it, and the start fails with EADDRINUSE (what met
.ci/run on a fresh machine). A server that must keep its port across restarts cannot be handed a bound socket,
so its port is chosen below (or above) that range, where only a listener bound on purpose can be, and checked
free when chosen. A server started once binds port 0 itself, or is handed the socket, instead.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000
"""No lower: below are the well-known ports of services a machine may run (and privileged ones)."""


def ephemeral_range() -> tuple[int, int]:
    """The OS's range for the local ends of outgoing connections (Linux's default when it cannot be read)."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def candidates(count: int = 1) -> list[range]:
    """The ranges of base ports whose ``count`` ports all lie outside the ephemeral range (none if it is wide)."""
    low, high = ephemeral_range()
    ranges = [range(LOWEST, low - count + 1), range(max(LOWEST, high + 1), 65536 - count + 1)]
    return [r for r in ranges if len(r) >= 100]


def bindable(port: int) -> bool:
    """Nobody holds ``port`` on loopback now (a socket in TIME_WAIT does not count: servers bind SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def server_port(count: int = 1) -> int:
    """A base port: ``count`` consecutive loopback ports, outside the ephemeral range, all free now."""
    ranges = candidates(count) or [range(LOWEST, 65536 - count + 1)]  # a wide range: the best left is a check
    for _ in range(500):
        base = random.choice(random.choice(ranges))
        if all(bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} free consecutive ports outside the ephemeral range {ephemeral_range()}")
