"""The rules of keys that must agree with other keys: each takes the whole config and answers None or what the
key would need (comfysup.config.checks). comfysup.config.schema declares each beside the section whose key it
names, in ``RULES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from comfysup.config.addresses import is_loopback, split_listen
from comfysup.config.checks import Answer, Problem
from comfysup.destinations import url_problem
from comfysup.redact import display_url

if TYPE_CHECKING:
    from comfysup.config.schema import Config

UNAUTHENTICATED_COMFYUI = ("not a loopback address. ComfyUI has no authentication; set [comfyui] private_network = "
                           "true only if every host that can reach this address is trusted")


def path_or_url(c: Config) -> Answer:
    """[queue]: a SQLite file or a PostgreSQL URL."""
    if not c.queue.path and not c.queue.url:
        return "set path (SQLite file) or url (postgresql://...)"
    return None


def heartbeat_within_lease(c: Config) -> Answer:
    """[runner]: a live runner renews its lease before it expires."""
    r = c.runner
    if r.heartbeat_seconds >= r.lease_seconds:
        return (f"must be shorter than [runner] lease_seconds ({r.lease_seconds:g}), or a live runner loses its lease "
                "between two heartbeats")
    return None


def runner_delays(c: Config) -> Answer:
    """[runner]: the first retry's delay is no longer than the longest."""
    return _base_within_max("runner", c.runner.base_delay_seconds, c.runner.max_delay_seconds)


def webhook_delays(c: Config) -> Answer:
    """[webhooks]: the first retry's delay is no longer than the longest."""
    return _base_within_max("webhooks", c.webhooks.base_delay_seconds, c.webhooks.max_delay_seconds)


def upload_delays(c: Config) -> Answer:
    """[store]: the uploader's first wait is no longer than its longest."""
    return _base_within_max("store", c.store.upload_base_delay_seconds, c.store.upload_max_delay_seconds,
                            "upload_max_delay_seconds")


def _base_within_max(section: str, base: float, longest: float, name: str = "max_delay_seconds") -> Answer:
    return f"must not exceed [{section}] {name} ({longest:g})" if base > longest else None


def comfyui_on_loopback(c: Config) -> Answer:
    """[comfyui] listen: ComfyUI has no authentication, so only loopback unless the network is private."""
    if c.comfyui.private_network or is_loopback(c.comfyui.listen):
        return None
    return UNAUTHENTICATED_COMFYUI


def metrics_on_loopback(c: Config) -> Answer:
    """[metrics] listen: the status page shows the servers' addresses; as ComfyUI's own, loopback unless private."""
    if not c.metrics.listen or c.comfyui.private_network:
        return None
    host, _ = split_listen(c.metrics.listen)
    return None if is_loopback(host) else Problem(UNAUTHENTICATED_COMFYUI, about=f" = {host!r}")


def api_token_beyond_loopback(c: Config) -> Answer:
    """[api] listen: a token before anything beyond loopback (the API submits jobs, so a listen that other hosts
    reach without a token would let any of them use the GPUs). The token itself is never shown."""
    a = c.api
    if not a.listen or a.token or is_loopback(split_listen(a.listen)[0]):
        return None
    return ("not a loopback address, and [api] token is not set. The API runs jobs on your GPUs: set a token (every "
            "request then carries Authorization: Bearer <token>) or listen on 127.0.0.1")


def connections_beyond_streams(c: Config) -> Answer:
    """[api] max_connections: room for requests besides the event streams."""
    a = c.api
    if a.max_connections <= a.max_event_streams:
        return (f"must be more than [api] max_event_streams ({a.max_event_streams}), or open event streams would "
                "leave no connection for any other request")
    return None


def webhook_destination(c: Config) -> Answer:
    """[webhooks] url: not inside this network unless allowed; its path and query are never shown."""
    w = c.webhooks
    problem = url_problem(w.url) if w.url and not w.allow_private else None
    if problem:
        return Problem(f"{problem}; set [webhooks] allow_private = true to send webhooks inside this network",
                       about=f" = {display_url(w.url)!r}")
    return None
