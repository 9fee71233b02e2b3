"""The checks of a loaded config: impossible values, unsafe listens, and what only ``comfysup run`` needs.

Each message says which key, which value, and what would be accepted. ``check`` runs on every config
(comfysup.config.build_config calls it); ``check_supervisor`` only where a supervisor starts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse, urlsplit

from comfysup.destinations import is_http_url, url_problem
from comfysup.errors import ConfigError
from comfysup.redact import display_url

if TYPE_CHECKING:
    from comfysup.config.schema import Config


def check(c: Config) -> None:
    """Impossible values: each message says which key, which value, and what would be accepted."""
    r, q, u, s = c.runner, c.queue, c.comfyui, c.supervisor

    def bad(section: str, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{c.source}: [{section}] {key} = {value!r}: {expected}")

    positive = [("runner", r, k) for k in ("base_delay_seconds", "max_delay_seconds", "timeout_seconds",
                                             "poll_seconds", "lease_seconds", "heartbeat_seconds",
                                             "http_timeout_seconds", "leave_queue_seconds")]
    positive += [("queue", q, "busy_timeout_seconds"), ("queue", q, "checkpoint_seconds"),
                 ("comfyui", u, "startup_seconds"), ("comfyui", u, "warmup_timeout_seconds"),
                 ("supervisor", s, "runner_timeout_seconds"),
                 ("supervisor", s, "quick_failure_seconds"), ("supervisor", s, "restart_max_delay_seconds")]
    for section, obj, key in positive:
        if getattr(obj, key) <= 0:
            raise bad(section, key, getattr(obj, key), "must be greater than 0")
    for key in ("grace_seconds", "affinity_max_wait_seconds", "preview_seconds"):
        if getattr(r, key) < 0:
            raise bad("runner", key, getattr(r, key), "must be 0 or more")
    if r.attempts < 1:
        raise bad("runner", "attempts", r.attempts, "must be at least 1")
    if r.max_queue < 1:
        raise bad("runner", "max_queue", r.max_queue, "must be at least 1 (a runner claims a job only while "
                  "its server holds fewer than max_queue prompts of other clients)")
    if r.heartbeat_seconds >= r.lease_seconds:
        raise bad("runner", "heartbeat_seconds", r.heartbeat_seconds,
                  f"must be shorter than [runner] lease_seconds ({r.lease_seconds:g}), or a live runner "
                  "loses its lease between two heartbeats")
    if r.base_delay_seconds > r.max_delay_seconds:
        raise bad("runner", "base_delay_seconds", r.base_delay_seconds,
                  f"must not exceed [runner] max_delay_seconds ({r.max_delay_seconds:g})")
    if not 1 <= u.base_port <= 65535:
        raise bad("comfyui", "base_port", u.base_port, "expected a TCP port between 1 and 65535")
    if s.max_quick_failures < 1:
        raise bad("supervisor", "max_quick_failures", s.max_quick_failures, "must be at least 1")
    for key in ("recycle_after_jobs", "recycle_rss_mb"):
        if getattr(s, key) < 0:
            raise bad("supervisor", key, getattr(s, key), "must be 0 (off) or more")
    if s.log_max_mb < 1:
        raise bad("supervisor", "log_max_mb", s.log_max_mb, "must be at least 1")
    if u.idle_vram_free_mb < 0:
        raise bad("comfyui", "idle_vram_free_mb", u.idle_vram_free_mb, "must be 0 (off) or more")
    if c.api.ready_max_queue_per_slot < 0:
        raise bad("api", "ready_max_queue_per_slot", c.api.ready_max_queue_per_slot, "must be 0 (no bound) or more")
    for key in ("max_file_mb", "max_job_mb", "max_files_per_job"):
        if getattr(c.store, key) < 1:
            raise bad("store", key, getattr(c.store, key), "must be at least 1")
    for key in ("max_file_mb", "max_job_mb", "server_cache_mb"):
        if getattr(c.assets, key) < 1:
            raise bad("assets", key, getattr(c.assets, key), "must be at least 1")
    if not q.path and not q.url:
        raise bad("queue", "path", q.path, "set path (SQLite file) or url (postgresql://...)")
    if q.url and not q.url.startswith(("postgresql://", "postgres://")):
        raise bad("queue", "url", q.url, "expected a postgresql://user@host/dbname URL")
    parse_gpus(u.gpus, c.source)
    _check_listen(c.source, "comfyui", "listen", u.listen, u.private_network)
    m, w = c.metrics, c.webhooks
    if m.listen:
        host, _, port = m.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise bad("metrics", "listen", m.listen, "expected HOST:PORT, e.g. 127.0.0.1:9188 (port 0: any free "
                      "port; an empty string: no endpoint)")
        _check_listen(c.source, "metrics", "listen", host.strip("[]"), u.private_network)
    _check_api(c)
    if m.refresh_seconds <= 0:
        raise bad("metrics", "refresh_seconds", m.refresh_seconds, "must be greater than 0")
    if m.max_workflow_labels < 1:
        raise bad("metrics", "max_workflow_labels", m.max_workflow_labels, "must be at least 1")
    if m.max_connections < 1:
        raise bad("metrics", "max_connections", m.max_connections, "must be at least 1")
    for key in ("header_timeout_seconds", "body_timeout_seconds"):
        if not getattr(m, key) > 0:
            raise bad("metrics", key, getattr(m, key), "must be a number of seconds greater than 0")
    if w.url:
        if not is_http_url(w.url):
            raise bad("webhooks", "url", w.url, "expected an http:// or https:// URL, or an empty string")
        if w.url and not w.allow_private and (problem := url_problem(w.url)):
            raise bad("webhooks", "url", display_url(w.url), f"{problem}; set [webhooks] allow_private = true "
                      "to send webhooks inside this network")
    for key in ("base_delay_seconds", "max_delay_seconds", "timeout_seconds"):
        if getattr(w, key) <= 0:
            raise bad("webhooks", key, getattr(w, key), "must be greater than 0")
    if w.attempts < 1:
        raise bad("webhooks", "attempts", w.attempts, "must be at least 1")
    _check_inputs(c, bad)
    b = c.rabbitmq
    if b.url and not b.url.startswith(("amqp://", "amqps://")):
        raise bad("rabbitmq", "url", display_url(b.url), "expected amqp://user:password@host:5672/ or an empty string")
    if b.prefetch < 1:
        raise bad("rabbitmq", "prefetch", b.prefetch, "must be at least 1")
    if not 0 <= b.delivery_limit <= 1000:
        raise bad("rabbitmq", "delivery_limit", b.delivery_limit, "must be between 0 and 1000 (redeliveries of a "
                  "message that stops the consumer before it goes to invalid_queue)")
    if b.reconnect_max_delay_seconds <= 0:
        raise bad("rabbitmq", "reconnect_max_delay_seconds", b.reconnect_max_delay_seconds, "must be greater than 0")
    if w.base_delay_seconds > w.max_delay_seconds:
        raise bad("webhooks", "base_delay_seconds", w.base_delay_seconds,
                  f"must not exceed [webhooks] max_delay_seconds ({w.max_delay_seconds:g})")
    _check_buckets(c)
    _no_negative_numbers(c)


def _check_inputs(c: Config, bad: Callable[[str, str, Any, str], ConfigError]) -> None:
    i = c.inputs
    for key in ("timeout_seconds", "max_seconds"):
        if not getattr(i, key) > 0:
            raise bad("inputs", key, getattr(i, key), "must be a number of seconds greater than 0")
    if not 0 <= i.max_redirects <= 20:
        raise bad("inputs", "max_redirects", i.max_redirects, "must be between 0 and 20")
    if i.s3_endpoint_url and not is_http_url(i.s3_endpoint_url):
        raise bad("inputs", "s3_endpoint_url", display_url(i.s3_endpoint_url), "expected an http:// or https:// "
                  "URL of an S3 service, or an empty string (AWS)")
    for bucket in i.s3_buckets:
        if not bucket or "/" in bucket:
            raise bad("inputs", "s3_buckets", bucket, "expected bucket names (no s3:// and no /)")


def _s3_max_ttl() -> int:
    """S3's bound on a presigned URL, from comfysup.storage.s3: imported only for a config that needs it (a
    bucket, a TTL past a day), not by every command that reads the config."""
    from comfysup.storage.s3 import MAX_TTL_SECONDS

    return MAX_TTL_SECONDS


def _check_buckets(c: Config) -> None:
    """[store] url and [assets] url (issue 33): an ``s3://bucket/prefix``, or empty. Whether the bucket exists and
    the credentials work is asked of the service where a runner or a supervisor starts (comfysup.storage.check)."""
    for section, url in (("store", c.store.url), ("assets", c.assets.url)):
        if url:
            from comfysup.storage.s3 import parse  # here, as below: a config without a bucket never needs it

            try:
                parse(url)  # the bucket itself is asked about where a runner starts
            except ValueError as exc:
                raise ConfigError(f"{c.source}: [{section}] url = {display_url(url)!r}: {exc}, or an empty "
                                  "string") from None
    if c.store.endpoint_url and not is_http_url(c.store.endpoint_url):
        shown = display_url(c.store.endpoint_url) if "@" in c.store.endpoint_url else c.store.endpoint_url
        raise ConfigError(f"{c.source}: [store] endpoint_url = {shown!r}: expected http(s)://host:port of the S3 "
                          "service, or an empty string for AWS")
    if c.store.url_ttl_seconds > 86400 and c.store.url_ttl_seconds > _s3_max_ttl():  # a day never reaches it
        raise ConfigError(f"{c.source}: [store] url_ttl_seconds = {c.store.url_ttl_seconds}: at most "
                          f"{_s3_max_ttl()} (7 days, the longest a presigned URL is valid); 0: no presigned URL")
    if c.store.multipart_threshold_mb < 5:
        raise ConfigError(f"{c.source}: [store] multipart_threshold_mb = {c.store.multipart_threshold_mb}: at "
                          "least 5 (S3's smallest part)")


def _no_negative_numbers(c: Config) -> None:
    """Every number of the config is a duration, a size, a count or a port: none means anything below 0. Checked
    last, so a key with a rule of its own (``must be greater than 0``) says that rule first."""
    for section in ("queue", "store", "assets", "inputs", "comfyui", "runner", "supervisor", "metrics", "webhooks",
                    "api", "rabbitmq"):
        values = getattr(c, section)
        for f in fields(values):
            value = getattr(values, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(f"{c.source}: [{section}] {f.name} = {value!r}: must be 0 or more (a duration, a "
                                  "size or a count is never negative)")


def _check_api(c: Config) -> None:
    """[api]: HOST:PORT, and a token before anything beyond loopback (the API submits jobs, so a listen that
    other hosts reach without a token would let any of them use the GPUs). The token itself is never shown."""
    a = c.api
    if a.listen:
        host, _, port = a.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{c.source}: [api] listen = {a.listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9189 "
                              "(port 0: any free port; an empty string: no API)")
        host = host.strip("[]")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError as exc:
            raise ConfigError(f"{c.source}: [api] listen = {a.listen!r}: expected an IP address") from exc
        if not loopback and not a.token:
            raise ConfigError(f"{c.source}: [api] listen = {a.listen!r}: not a loopback address, and [api] token "
                              "is not set. The API runs jobs on your GPUs: set a token (every request then "
                              "carries Authorization: Bearer <token>) or listen on 127.0.0.1")
    if a.max_queued < 0:
        raise ConfigError(f"{c.source}: [api] max_queued = {a.max_queued!r}: must be 0 (no bound) or more")
    if a.max_event_streams < 1:
        raise ConfigError(f"{c.source}: [api] max_event_streams = {a.max_event_streams!r}: must be at least 1 "
                          "(GET /api/v2/jobs/{id}/events; polling GET /api/v2/jobs/{id} needs no stream)")
    if a.max_upload_mb < 1:
        raise ConfigError(f"{c.source}: [api] max_upload_mb = {a.max_upload_mb!r}: must be at least 1")
    if not a.upload_retention_hours > 0:
        raise ConfigError(f"{c.source}: [api] upload_retention_hours = {a.upload_retention_hours!r}: must be more "
                          "than 0 (an upload must outlive the moment its job is submitted)")
    if a.max_connections <= a.max_event_streams:
        raise ConfigError(f"{c.source}: [api] max_connections = {a.max_connections!r}: must be more than [api] "
                          f"max_event_streams ({a.max_event_streams}), or open event streams would leave no "
                          "connection for any other request")
    for key in ("header_timeout_seconds", "body_timeout_seconds"):
        if not getattr(a, key) > 0:
            raise ConfigError(f"{c.source}: [api] {key} = {getattr(a, key)!r}: must be a number of seconds "
                              "greater than 0")
    for entry in a.allowed_hosts:
        if host_problem(entry):
            raise ConfigError(f"{c.source}: [api] allowed_hosts: {entry!r}: {host_problem(entry)}; expected a "
                              "host name or address as clients write it in the Host header, like api.example, "
                              "api.example:8443 or [fd00::7]:9189")
    for root in a.path_roots:
        if not root.strip():
            raise ConfigError(f"{c.source}: [api] path_roots: an empty entry would open the config file's whole "
                              "folder to POST /api/v2/assets/from-path; name each folder, like \"/srv/datasets\"")
    for origin in a.allowed_origins:
        parsed = urlparse(origin)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/"):
            raise ConfigError(f"{c.source}: [api] allowed_origins: {origin!r}: expected an origin like "
                              "https://app.example")
    if a.public_url:
        parsed = urlparse(a.public_url)
        shown = display_url(a.public_url) if "@" in parsed.netloc else a.public_url  # no password in a message
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/") \
                or parsed.query or parsed.fragment or parsed.username is not None or parsed.password is not None:
            raise ConfigError(f"{c.source}: [api] public_url = {shown!r}: expected the URL at which the "
                              "other machines reach this API, like http://10.0.0.7:9189 or https://gpu7.example "
                              "(no path, query or credentials; /api/v2 is added); \"\": derived from [api] listen")
        try:
            port = parsed.port
        except ValueError:
            port = 0
        if port == 0:
            raise ConfigError(f"{c.source}: [api] public_url = {shown!r}: the port must be a number from 1 "
                              "to 65535 (or none: 80 for http, 443 for https)")


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


def check_supervisor(c: Config) -> None:
    """What only ``comfysup run`` needs: a stalled runner must be killed (and its claim released) before
    its lease could expire and hand the job to another runner while the stalled one may still act on it.

    Not part of ``_check``: ``comfysup work`` and tools that never start a supervisor may use a short
    lease with the default runner timeout.
    """
    r, s = c.runner, c.supervisor
    if s.runner_timeout_seconds + r.heartbeat_seconds >= r.lease_seconds:
        raise ConfigError(
            f"{c.source}: [supervisor] runner_timeout_seconds = {s.runner_timeout_seconds:g}: must be shorter "
            f"than [runner] lease_seconds ({r.lease_seconds:g}) minus heartbeat_seconds "
            f"({r.heartbeat_seconds:g}), so a runner that stops answering is killed and its job released "
            "before its lease could hand the job to another runner; lower it, or raise lease_seconds")
    if s.runner_timeout_seconds <= r.http_timeout_seconds:
        raise ConfigError(
            f"{c.source}: [supervisor] runner_timeout_seconds = {s.runner_timeout_seconds:g}: must be longer "
            f"than [runner] http_timeout_seconds ({r.http_timeout_seconds:g}), or a runner waiting on one slow "
            "answer from ComfyUI is killed as if it had hung")


def _check_listen(source: str, section: str, key: str, host: str, private_network: bool) -> None:
    """ComfyUI has no authentication: refuse to listen beyond loopback unless told the network is private."""
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError as exc:
        raise ConfigError(f"{source}: [{section}] {key} = {host!r}: expected an IP address") from exc
    if not loopback and not private_network:
        raise ConfigError(
            f"{source}: [{section}] {key} = {host!r}: not a loopback address. ComfyUI has no "
            "authentication; set [comfyui] private_network = true only if every host that can reach "
            "this address is trusted")


@dataclass(frozen=True)
class GpuSpec:
    """What ``gpus`` asks for: ``auto`` (NVML), explicit CUDA indices, or ``cpu`` slots."""

    mode: str  # "auto" | "list" | "cpu" | "none" (launch nothing: supervise only the [[servers]])
    indices: tuple[int, ...] = ()
    cpu_slots: int = 0


def parse_gpus(value: str | tuple[int, ...], source: str = "<config>") -> GpuSpec:
    where = f"{source}: [comfyui] gpus = {value!r}"
    if isinstance(value, tuple):
        if not value:
            raise ConfigError(f"{where}: the list is empty; give CUDA indices like [0, 2], \"auto\", or \"none\" "
                              "to launch no ComfyUI server and supervise only the [[servers]]")
        if any(i < 0 for i in value) or len(set(value)) != len(value):
            raise ConfigError(f"{where}: expected distinct CUDA device indices (0 or more)")
        return GpuSpec("list", indices=tuple(value))
    if value == "auto":
        return GpuSpec("auto")
    if value == "none":
        return GpuSpec("none")
    if value.startswith("cpu:") and value[4:].isdigit() and int(value[4:]) >= 1:
        return GpuSpec("cpu", cpu_slots=int(value[4:]))
    raise ConfigError(f"{where}: expected \"auto\", a list of CUDA indices like [0, 2], or \"cpu:N\" "
                      "(N ComfyUI servers on the CPU); or \"none\" to launch none and use only the [[servers]]")
