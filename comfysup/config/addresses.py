"""The checks of the keys that hold an address: listens, URLs, hosts, origins and buckets.

Each is a key's own check (comfysup.config.checks): it takes the value and answers None or what would be
accepted. A URL that may carry credentials is named masked (comfysup.redact.display_url), never as written.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse, urlsplit

from comfysup.config.checks import Answer, Problem
from comfysup.destinations import is_http_url
from comfysup.redact import display_url
from comfysup.storage.s3 import MAX_TTL_SECONDS
from comfysup.storage.s3 import parse as parse_bucket


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``localhost`` or an IP address) is this machine only; ValueError for another name."""
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def split_listen(listen: str) -> tuple[str, str]:
    """(host, port) of a ``HOST:PORT`` listen, the brackets of an IPv6 host removed."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), port


def _not_host_port(listen: str) -> bool:
    host, _, port = listen.rpartition(":")
    return not host or not port.isdigit() or not 0 <= int(port) <= 65535


def ip_address(host: str) -> Answer:
    """``[comfyui] listen``: an IP address (or ``localhost``)."""
    try:
        is_loopback(host)
    except ValueError:
        return "expected an IP address"
    return None


def metrics_listen(listen: str) -> Answer:
    """``[metrics] listen``: HOST:PORT of an IP address, or empty."""
    if not listen:
        return None
    if _not_host_port(listen):
        return ("expected HOST:PORT, e.g. 127.0.0.1:9188 (port 0: any free port; an empty string: no "
                "endpoint)")
    host, _ = split_listen(listen)
    problem = ip_address(host)
    return None if problem is None else Problem(problem, about=f" = {host!r}")


def api_listen(listen: str) -> Answer:
    """``[api] listen``: HOST:PORT of an IP address, or empty."""
    if not listen:
        return None
    if _not_host_port(listen):
        return "expected HOST:PORT, e.g. 127.0.0.1:9189 (port 0: any free port; an empty string: no API)"
    return ip_address(split_listen(listen)[0])


def postgresql_url(url: str) -> Answer:
    """``[queue] url``: a PostgreSQL URL, or empty."""
    if url and not url.startswith(("postgresql://", "postgres://")):
        return "expected a postgresql://user@host/dbname URL"
    return None


def amqp_url(url: str) -> Answer:
    """``[rabbitmq] url``: an AMQP URL, or empty; its password is never shown."""
    if url and not url.startswith(("amqp://", "amqps://")):
        return Problem("expected amqp://user:password@host:5672/ or an empty string", about=f" = {display_url(url)!r}")
    return None


def webhook_url(url: str) -> Answer:
    """``[webhooks] url``: an http(s) URL, or empty."""
    if url and not is_http_url(url):
        return "expected an http:// or https:// URL, or an empty string"
    return None


def s3_endpoint_url(url: str) -> Answer:
    """``[inputs] s3_endpoint_url``: an http(s) URL, or empty."""
    if url and not is_http_url(url):
        return Problem("expected an http:// or https:// URL of an S3 service, or an empty string (AWS)",
                       about=f" = {display_url(url)!r}")
    return None


def bucket_name(bucket: str) -> Answer:
    """One entry of ``[inputs] s3_buckets``: a bucket's bare name."""
    if not bucket or "/" in bucket:
        return Problem("expected bucket names (no s3:// and no /)", about=f" = {bucket!r}")
    return None


def bucket_url(url: str) -> Answer:
    """``[store] url`` and ``[assets] url``: an ``s3://bucket/prefix``, or empty. Whether the bucket exists and the
    credentials work is asked of the service where a runner or a supervisor starts
    (comfysup.storage.s3.check_bucket)."""
    if not url:
        return None
    try:
        parse_bucket(url)
    except ValueError as exc:
        return Problem(f"{exc}, or an empty string", about=f" = {display_url(url)!r}")
    return None


def store_endpoint_url(url: str) -> Answer:
    """``[store] endpoint_url``: the S3 service's http(s) URL, or empty (AWS)."""
    if url and not is_http_url(url):
        shown = display_url(url) if "@" in url else url
        return Problem("expected http(s)://host:port of the S3 service, or an empty string for AWS",
                       about=f" = {shown!r}")
    return None


def url_ttl(seconds: int) -> Answer:
    """``[store] url_ttl_seconds``: no longer than S3 lets a presigned URL be valid."""
    if seconds > MAX_TTL_SECONDS:
        return Problem(f"at most {MAX_TTL_SECONDS} (7 days, the longest a presigned URL is valid); 0: no presigned "
                       "URL", about=f" = {seconds}")
    return None


def s3_part_size(megabytes: int) -> Answer:
    """``[store] multipart_threshold_mb``: no smaller than S3's smallest part."""
    return Problem("at least 5 (S3's smallest part)", about=f" = {megabytes}") if megabytes < 5 else None


def host_problem(entry: str) -> str:
    """What is wrong with an ``[api] allowed_hosts`` entry, or "" (the same parsing as the API's Host check)."""
    if not entry or any(ch in entry for ch in "/@?#\\ ") or not entry.isprintable():
        return "not a bare host name (no scheme, path, user or spaces)"
    try:
        parsed = urlsplit("//" + entry)
        port = parsed.port
    except ValueError:
        return "its port is not a number from 0 to 65535"
    if not parsed.hostname:
        return "no host name"
    return "the port must be from 1 to 65535" if port == 0 else ""


def allowed_host(entry: str) -> Answer:
    """One entry of ``[api] allowed_hosts``."""
    problem = host_problem(entry)
    if problem:
        return Problem(f"{problem}; expected a host name or address as clients write it in the Host header, like "
                       "api.example, api.example:8443 or [fd00::7]:9189", about=f": {entry!r}")
    return None


def path_root(root: str) -> Answer:
    """One entry of ``[api] path_roots``: a folder named, never an empty entry (the config file's folder)."""
    if not root.strip():
        return Problem("an empty entry would open the config file's whole folder to POST /api/v2/assets/from-path; "
                       "name each folder, like \"/srv/datasets\"", about="")
    return None


def allowed_origin(origin: str) -> Answer:
    """One entry of ``[api] allowed_origins``: scheme, host and port, no path."""
    parsed = urlparse(origin)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/"):
        return Problem("expected an origin like https://app.example", about=f": {origin!r}")
    return None


def public_url(url: str) -> Answer:
    """``[api] public_url``: where other machines reach this API, no path, query or credentials; or empty."""
    if not url:
        return None
    parsed = urlparse(url)
    shown = display_url(url) if "@" in parsed.netloc else url  # no password in a message
    about = f" = {shown!r}"
    if not _bare_http_origin(url):
        return Problem("expected the URL at which the other machines reach this API, like http://10.0.0.7:9189 or "
                       "https://gpu7.example (no path, query or credentials; /api/v2 is added); \"\": derived from "
                       "[api] listen", about=about)
    try:
        port = parsed.port
    except ValueError:
        port = 0
    if port == 0:
        return Problem("the port must be a number from 1 to 65535 (or none: 80 for http, 443 for https)", about=about)
    return None


def _bare_http_origin(url: str) -> bool:
    """Whether ``url`` is http(s)://host[:port] with at most a ``/`` after it: no path, query, fragment or user."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
        return False
    return not (parsed.query or parsed.fragment or parsed.username is not None or parsed.password is not None)
