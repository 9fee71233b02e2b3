"""Who may call the API: a bearer token when one is configured, and no cross-site browser request.

As the contract's self-hosted defaults or stricter (comfy-api-proxy ``spec/openapi.yaml@37fbee21``, ``bearerAuth``:
"Self-hosted accepts unauthenticated requests by default and can be configured with a static bearer token"); stricter
in that an unauthenticated API is loopback only: comfysup.config refuses a non-loopback ``[api] listen`` without
``[api] token`` before anything starts. The token is compared in constant time (``hmac.compare_digest`` over
bytes) and is never logged: a refused request logs only that it was refused.

The origin check: a browser adds ``Origin`` to cross-site requests (and ``Sec-Fetch-Site``); a web page the
user visits could otherwise POST jobs to ``127.0.0.1:9189`` (a "simple" request needs no CORS preflight, and
loopback is reachable from the browser). A request whose Origin is neither the API's own address nor one of
``[api] allowed_origins`` is refused with 403 ``forbidden``; requests without an Origin (the SDK, curl) pass.

The Host check comes first, because the origin check alone does not stop DNS rebinding: a page at
``http://evil.example:9189`` whose name is then made to resolve to 127.0.0.1 sends ``Host: evil.example:9189`` and
``Origin: http://evil.example:9189``, which match each other. A request is answered only when its Host names this
API: the address it connected to (the listen address, or the machine's address on a wildcard listen, where the
machine's own names are accepted too), ``localhost`` and the loopback addresses when it came in on loopback,
``[api] public_url``'s name, and each ``[api] allowed_hosts`` entry (``name:port`` allows that port only).
Anything else is 421 ``misdirected_request``. A request without Host (HTTP/1.0) passes: a browser always sends
one. The port of those names is not checked: rebinding is a matter of names (the browser connects to the port
its page's URL names and says it), while a tunnel or a port forward (``ssh -L 8080:localhost:9189``) changes the
port a legitimate client writes.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from urllib.parse import urlsplit

from comfysup.api.errors import ApiError


def check_token(expected: str, header: str | None) -> None:
    """Raise 401 unless ``header`` is ``Bearer <expected>``; nothing to check when no token is configured."""
    if not expected:
        return
    given = ""
    if header and header[:7].lower() == "bearer ":
        given = header[7:].strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "unauthorized", "missing or invalid bearer token",
                       headers={"WWW-Authenticate": "Bearer"})


def check_origin(origin: str | None, fetch_site: str | None, host: str | None, allowed: tuple[str, ...]) -> None:
    """Raise 403 for a browser request from another site (see the module's docstring)."""
    if fetch_site == "cross-site" and not origin:
        raise ApiError(403, "forbidden", "cross-site browser requests are refused")
    if not origin:
        return
    if origin == "null":
        raise ApiError(403, "forbidden", "requests from an opaque origin are refused")
    if origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return
    if host and urlsplit(origin).netloc.lower() == host.lower():
        return
    raise ApiError(403, "forbidden", "this origin may not call the API; add it to [api] allowed_origins")


def _name_port(text: str, default_port: int) -> tuple[str, int] | None:
    """``name[:port]`` as (lower-case name without brackets, port); None when it is not one."""
    if not text or not text.isprintable() or any(ch in text for ch in "/@?#\\ "):
        return None
    try:
        parsed = urlsplit("//" + text)
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname:
        return None
    return parsed.hostname.rstrip("."), default_port if port is None else port


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return None


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


class HostCheck:
    """The Host names this API answers to (see the module's docstring); built once per process."""

    def __init__(self, listen_host: str, public_url: str, allowed: tuple[str, ...],
                 machine_names: tuple[str, ...] | None = None) -> None:
        self.pairs: set[tuple[str, int]] = set()
        self.names: set[str] = set()
        for entry in allowed:
            parsed = _name_port(entry, 0)
            if parsed is None:
                continue
            if ":" in entry.rsplit("]", 1)[-1]:
                self.pairs.add(parsed)
            else:
                self.names.add(parsed[0])
        if public_url and urlsplit(public_url).hostname:
            self.names.add(str(urlsplit(public_url).hostname).rstrip("."))
        self.local_names: set[str] = set()
        """The machine's names on a wildcard listen."""
        address = _address(listen_host.strip("[]"))
        if address is not None and address.is_unspecified:  # a wildcard: the machine's names, as advertised
            names = machine_names if machine_names is not None else (socket.getfqdn(), socket.gethostname())
            self.local_names |= {n.lower().rstrip(".") for n in names if n}

    def allows(self, header: str | None, local: tuple[str, int] | None) -> bool:
        """Whether a request with this Host reached this API; ``local``: the address and port it connected to."""
        if header is None:
            return True
        parsed = _name_port(header.strip(), 80)
        if parsed is None:
            return False
        name = parsed[0]
        if name in self.names or name in self.local_names or parsed in self.pairs:
            return True
        if local is None:
            return False
        reached = _address(local[0])
        if isinstance(reached, ipaddress.IPv6Address) and reached.ipv4_mapped is not None:
            reached = reached.ipv4_mapped  # an IPv4 client of a dual-stack socket
        if reached is None:
            return False
        if reached.is_loopback and name in LOOPBACK_NAMES:
            return True
        given = _address(name)
        if given is None:
            return False
        return given.is_loopback if reached.is_loopback else given == reached

    def check(self, header: str | None, local: tuple[str, int] | None) -> None:
        """Raise 421 ``misdirected_request`` unless ``allows``."""
        if not self.allows(header, local):
            shown = (header or "")[:100]
            raise ApiError(421, "misdirected_request", f"Host {shown!r} is not a name of this API; a client that "
                           "reaches it by another name adds that name to [api] allowed_hosts (or sets [api] "
                           "public_url)")
