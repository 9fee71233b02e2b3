"""A requests session that refuses to talk to a private address, judged on the socket it connected.

Checking a webhook's host name before the POST is not enough: the name can resolve to a public address
when checked and to 127.0.0.1 a moment later (DNS rebinding). Here the check runs on the peer address of
the connection that was actually made, before a byte is sent, so what is checked is what is used.
"""

from __future__ import annotations

import socket

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from comfysup.destinations import address_problem


class PrivateDestination(Exception):
    """The destination's address is loopback, link-local, private or otherwise not public. Not an OSError:
    urllib3 would take that for a network fault and retry or wrap it."""


def _checked(sock: socket.socket, host: str) -> socket.socket:
    peer = sock.getpeername()[0]
    problem = address_problem(peer)
    if problem:
        sock.close()
        raise PrivateDestination(f"refused to send to {host}: {problem} ([webhooks] allow_private = true "
                                 "allows it)")
    return sock


class _CheckedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _checked(super()._new_conn(), self.host)


class _CheckedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _checked(super()._new_conn(), self.host)


class _CheckedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


class _PublicOnlyAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: object, **kwargs: object) -> None:
        super().init_poolmanager(*args, **kwargs)  # type: ignore[arg-type]
        self.poolmanager.pool_classes_by_scheme = {"http": _CheckedHTTPPool, "https": _CheckedHTTPSPool}


def public_only_session() -> requests.Session:
    """A session whose every connection must reach a public address; no proxy from the environment (a
    proxy would be the peer, and the check would judge it instead of the destination)."""
    session = requests.Session()
    session.trust_env = False
    adapter = _PublicOnlyAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


__all__ = ["PrivateDestination", "public_only_session"]
