"""systemd's notify protocol without a systemd library: one datagram per message to ``$NOTIFY_SOCKET``.

``READY=1`` once the servers answer, ``WATCHDOG=1`` from the main loop (so a stuck loop gets the
service restarted), ``STATUS=`` a one-line summary for ``systemctl status``, ``STOPPING=1`` when the
shutdown begins. A socket name starting with ``@`` is in the abstract namespace. Outside systemd
(no variable) every call does nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""Meant for the supervisor alone: removed from the environment of its children."""


def send(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send one notification; False when not under systemd or the socket is gone (never raises)."""
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(target)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


class Notifier:
    """What the supervisor tells systemd, at most once each for READY and STOPPING."""

    def __init__(self, env: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.watchdog_seconds = _watchdog_seconds(self.env, os.getpid() if pid is None else pid)
        self.next_watchdog = 0.0
        self.ready_sent = False
        self.stopping_sent = False
        self.last_status = ""

    @property
    def enabled(self) -> bool:
        return bool(self.env.get("NOTIFY_SOCKET"))

    def ready(self, status: str) -> None:
        if not self.ready_sent:
            self.ready_sent = True
            self.last_status = status
            send(f"READY=1\nSTATUS={status}", self.env)

    def status(self, status: str) -> None:
        if status != self.last_status:
            self.last_status = status
            send(f"STATUS={status}", self.env)

    def watchdog(self, now: float) -> None:
        """Called every loop tick; pings at half the interval systemd asked for, as sd_watchdog_enabled
        advises."""
        if self.watchdog_seconds and now >= self.next_watchdog:
            self.next_watchdog = now + self.watchdog_seconds / 2
            send("WATCHDOG=1", self.env)

    def stopping(self, status: str = "stopping") -> None:
        if not self.stopping_sent:
            self.stopping_sent = True
            send(f"STOPPING=1\nSTATUS={status}", self.env)


def _watchdog_seconds(env: Mapping[str, str], pid: int) -> float:
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return 0.0
    owner = env.get("WATCHDOG_PID", "")
    if owner.isdigit() and int(owner) != pid:
        return 0.0  # meant for another process (e.g. a parent shell under systemd-run)
    return int(usec) / 1e6


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment without systemd's notify variables: children must not speak for the service."""
    return {k: v for k, v in env.items() if k not in NOTIFY_VARIABLES}
