"""Where comfysup may send a job's record: never, unless allowed, to this machine or a private network.

A webhook URL comes from whoever submits a job. Without this check, a job could make comfysup POST to the
cloud's metadata service, to ComfyUI's own unauthenticated port on 127.0.0.1, or to any host of a private
network (server-side request forgery). Two checks, because a name can change its address:
- at submit (and for ``[webhooks] url`` at start-up), :func:`url_problem` refuses credentials in the URL,
  literal private addresses and the well-known metadata names, without a DNS look-up;
- at delivery, the name is resolved once and :func:`address_problem` is asked about every address it gives,
  before any connection; the connection then goes to those checked addresses only
  (comfysup.safehttp), so a name that resolved to a public address at submit and to 127.0.0.1
  now (DNS rebinding) is refused, and no private port is ever touched (nothing to time).
``[webhooks] allow_private = true`` turns both off, for a receiver on the same machine or network.

A base module: it imports nothing of comfysup.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

METADATA_NAMES = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.com", "instance-data",
    "instance-data.ec2.internal", "metadata.packet.net", "metadata.platformequinix.com",
})
"""Names of cloud metadata services (their addresses, 169.254.169.254 and fd00:ec2::254, are private)."""
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain")


def address_problem(address: str) -> str | None:
    """Why ``address`` (an IP, as a socket's peer name gives it) is not a public destination, or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and (inner := ip.ipv4_mapped or ip.sixtofour) is not None:
        ip = inner  # ::ffff:a.b.c.d, or 2002:AABB:CCDD:: (6to4), which a relay may route to a.b.c.d itself
    for test, what in ((ip.is_loopback, "a loopback address"), (ip.is_link_local, "a link-local address"),
                       (ip.is_unspecified, "the unspecified address"), (ip.is_multicast, "a multicast address"),
                       (ip.is_reserved, "a reserved address"), (ip.is_private, "a private address"),
                       (not ip.is_global, "not a public address")):
        if test:
            return f"{ip} is {what}"
    return None


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http:// or https:// URL with a host (a webhook, an input, a service's endpoint)."""
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def url_problem(url: str) -> str | None:
    """Why ``url`` may not be a webhook destination, judged without a DNS look-up; None when it may."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".").lower()
    except ValueError:
        return "the URL cannot be read"
    if parts.username is not None or parts.password is not None:
        return "the URL carries credentials (user:password@); put a secret in [webhooks] secret instead"
    if not host:
        return "the URL has no host"
    if host == "localhost" or host.endswith(LOCAL_SUFFIXES):
        return f"{host} names this machine or a local network"
    if host in METADATA_NAMES:
        return f"{host} is a cloud metadata service"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: its address is checked when the webhook connects
    return address_problem(host)
