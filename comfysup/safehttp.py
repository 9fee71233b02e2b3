"""A requests session that refuses to talk to a private address: resolve once, check, connect to what was checked.

Checking a webhook's host name before the POST is not enough: the name can resolve to a public address
when checked and to 127.0.0.1 a moment later (DNS rebinding). Checking the socket after it connected is
not enough either: the connection to a private port was already made, and whether it was refused or
accepted, and how fast, tells a submitter what listens there. So each connection here resolves the name
once (``socket.getaddrinfo``), refuses it when any of its addresses is not public (comfysup.destinations,
the same rules as at submit), and only then connects, to those checked addresses and no others: the HTTP
library never looks the name up a second time. The request keeps the name: the ``Host`` header is the
URL's, and for https the TLS server name (SNI) and the certificate check are the name's (urllib3 takes both
from the connection's ``host``, which stays the name; only the socket goes to the checked address).
"""

from __future__ import annotations

import socket
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family

from comfysup.destinations import address_problem


class PrivateDestination(Exception):
    """The destination's address is loopback, link-local, private or otherwise not public. Not an OSError:
    urllib3 would take that for a network fault and retry or wrap it."""


AddrInfo = tuple[Any, Any, int, str, Any]


def resolve_public(host: str, port: int) -> list[AddrInfo]:
    """The addresses of ``host``, looked up once; PrivateDestination when any of them is not public (a name
    that answers a public and a private address is refused too: which one a connection gets is the name's
    owner's choice)."""
    found = socket.getaddrinfo(host.strip("[]"), port, allowed_gai_family(), socket.SOCK_STREAM)
    if not found:
        raise socket.gaierror(f"{host} has no address")
    for *_, address in found:
        problem = address_problem(str(address[0]))
        if problem:
            raise PrivateDestination(f"refused to connect to {host}: {problem}")
    return found


def connect_checked(conn: HTTPConnection) -> socket.socket:
    """urllib3's ``_new_conn``, on addresses resolved and checked first: no look-up after the check."""
    try:
        found = resolve_public(conn.host, conn.port)
    except socket.gaierror as exc:
        raise NameResolutionError(conn.host, conn, exc) from exc
    error: OSError | None = None
    for family, kind, proto, _, address in found:
        sock = socket.socket(family, kind, proto)
        try:
            for option in conn.socket_options or ():
                sock.setsockopt(*option)
            if isinstance(conn.timeout, (int, float)):
                sock.settimeout(conn.timeout)
            if conn.source_address:
                sock.bind(conn.source_address)
            sock.connect(address)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    if isinstance(error, TimeoutError):
        raise ConnectTimeoutError(conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})")
    raise NewConnectionError(conn, f"Failed to establish a new connection: {error}")


class _CheckedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return connect_checked(self)


class _CheckedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return connect_checked(self)


class _CheckedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


class _PublicOnlyAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: object, **kwargs: object) -> None:
        super().init_poolmanager(*args, **kwargs)  # type: ignore[arg-type]
        self.poolmanager.pool_classes_by_scheme = {"http": _CheckedHTTPPool, "https": _CheckedHTTPSPool}


def public_only_session() -> requests.Session:
    """A session whose every connection goes only to a public address; no proxy from the environment (a
    proxy would be the one connected to, and the check would judge it instead of the destination)."""
    session = requests.Session()
    session.trust_env = False
    adapter = _PublicOnlyAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


__all__ = ["PrivateDestination", "connect_checked", "public_only_session", "resolve_public"]
