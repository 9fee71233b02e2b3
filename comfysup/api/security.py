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
Anything else is 421 ``misdirected_request``.

CORS (``Cors``): a page of an ``[api] allowed_origins`` origin may call the API from a browser. Its preflight
(``OPTIONS`` with ``Access-Control-Request-Method``) is answered 204 without the bearer token (a browser never sends
credentials with a preflight; the real request still needs it), with exactly that origin in
``Access-Control-Allow-Origin`` (never ``*``), the route's methods, the headers the SDK sends (``Authorization``,
``Content-Type``, ``Idempotency-Key``, ``Range``) and ``Vary: Origin``; every answer to that origin, errors
included, carries the same headers so its script can read them (``Retry-After``, ``Content-Range``, ``Location``
exposed). A preflight from any other origin is 403 ``forbidden`` with no CORS header, so the browser sends nothing.
As comfy-api-proxy's ``--enable-cors-header`` (its ``middleware.py``), whose ``forbidden_origin`` code is the
spec's ``forbidden`` here. A request without Host (HTTP/1.0) passes: a browser always sends
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
    if normal_origin(origin) in {normal_origin(a) for a in allowed}:
        return
    if host and urlsplit(origin).netloc.lower() == host.lower():
        return
    raise ApiError(403, "forbidden", "this origin may not call the API; add it to [api] allowed_origins")


def normal_origin(origin: str) -> str:
    """``scheme://host[:port]`` as a browser writes it in Origin: lower case, no default port, no trailing /."""
    try:
        parsed = urlsplit(origin.strip().rstrip("/"))
        port = parsed.port
    except ValueError:
        return origin
    if not parsed.hostname:
        return origin
    scheme = parsed.scheme.lower()
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" + ("" if port is None or port == default else f":{port}")


CORS_ALLOW_HEADERS = "Authorization, Content-Type, Idempotency-Key, Range"
CORS_EXPOSE_HEADERS = "Retry-After, Content-Range, Accept-Ranges, Content-Length, Location, WWW-Authenticate"
CORS_MAX_AGE_SECONDS = 600
CORS_METHODS = "DELETE, GET, HEAD, OPTIONS, POST"
"""Every method the API serves (a preflight names its route's own)."""


class Cors:
    """The ``[api] allowed_origins`` a browser page may call the API from (see the module's docstring)."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = frozenset(normal_origin(a) for a in allowed)

    def allows(self, origin: str | None) -> bool:
        return bool(origin) and normal_origin(str(origin)) in self.allowed

    @staticmethod
    def headers(origin: str, methods: str = CORS_METHODS) -> dict[str, str]:
        """What an answer to an allowed ``origin`` carries (every answer, as comfy-api-proxy sends them);
        ``methods``: a preflight's route's methods."""
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
                "Access-Control-Expose-Headers": CORS_EXPOSE_HEADERS, "Access-Control-Allow-Methods": methods,
                "Access-Control-Allow-Headers": CORS_ALLOW_HEADERS,
                "Access-Control-Max-Age": str(CORS_MAX_AGE_SECONDS)}

    def preflight(self, origin: str | None, methods: set[str]) -> dict[str, str]:
        """The headers of a 204 answer to ``OPTIONS`` on a route of ``methods``; 403 for an origin not allowed.
        Without Origin it is no preflight (curl, a probe): the route's methods in ``Allow``."""
        listed = ", ".join(sorted(methods | {"OPTIONS"}))
        if not origin:
            return {"Allow": listed}
        if not self.allows(origin):
            raise ApiError(403, "forbidden", f"origin {origin[:100]!r} may not call the API; add it to [api] "
                           "allowed_origins")
        return {"Allow": listed, **self.headers(origin, listed)}


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
