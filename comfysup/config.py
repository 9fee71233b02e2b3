"""Settings: one frozen tree, read from config.toml, then COMFYSUP_* variables, then flags.

Precedence is defaults < file < environment < command line. Every key is declared here with its type,
so an unknown key, a wrong type or an impossible value is an error naming the file, the key, the value
and what was expected: a typo must never fall back silently to a default.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from comfysup.destinations import url_problem
from comfysup.errors import ConfigError
from comfysup.redact import display_url

DEFAULT_PATHS = (Path("config.toml"), Path("/etc/comfysup/config.toml"))
ENV_PREFIX = "COMFYSUP_"
ENV_CONFIG = "COMFYSUP_CONFIG"
ENV_NOT_SETTINGS = frozenset({ENV_CONFIG, "COMFYSUP_HOSTNAME", "COMFYSUP_SKIP_POSTGRES", "COMFYSUP_TEST_POSTGRES",
                              "COMFYSUP_LOG_FORMAT"})
"""COMFYSUP_* variables that are not COMFYSUP_<SECTION>_<KEY> settings (the machine's name in the queue, the
log format of a process, and switches of the test suite), so they are not refused as unknown settings."""


@dataclass(frozen=True)
class QueueConfig:
    path: str = "var/queue.db"
    url: str = ""
    busy_timeout_seconds: float = 30.0
    checkpoint_seconds: float = 30.0


@dataclass(frozen=True)
class StoreConfig:
    dir: str = "var/results"
    max_file_mb: int = 2048
    """The largest output file accepted from ComfyUI. 2 GiB holds minutes of high-bitrate video; no image
    comes near it, and a server that streams more is misbehaving (the job is dead-lettered)."""
    max_job_mb: int = 8192
    """All of one job's outputs together."""
    max_files_per_job: int = 2000
    """Output files of one job (a video saved as frames is hundreds); a history naming more is malformed."""


@dataclass(frozen=True)
class AssetsConfig:
    dir: str = ""
    """Where input files are stored, once per content. Empty: next to the queue (``<queue>.assets/``) on SQLite,
    and in the database itself (chunked) on PostgreSQL, so that machines share nothing but the database; set
    it on PostgreSQL to a folder every machine mounts."""
    max_file_mb: int = 100
    """The largest input file submit accepts: ComfyUI's own upload limit (/features max_upload_size) is 100 MiB
    for the whole request, so a larger file could never reach a server."""
    max_job_mb: int = 512
    """All input files of one job together."""
    server_cache_mb: int = 2048
    """Inputs kept in each server's input folder (least recently used removed first, never one that a queued or
    running job needs). Applies to servers that comfysup run launched, whose folders the runner can reach."""


@dataclass(frozen=True)
class ComfyUIConfig:
    main: str = "ComfyUI/main.py"
    python: str = ""
    listen: str = "127.0.0.1"
    private_network: bool = False
    base_port: int = 8188
    base_directory: str = "var/comfyui"
    extra_args: tuple[str, ...] = ()
    gpus: str | tuple[int, ...] = "auto"
    startup_seconds: float = 120.0
    extra_model_paths_config: str = ""


@dataclass(frozen=True)
class ServerConfig:
    name: str
    url: str


@dataclass(frozen=True)
class RunnerConfig:
    attempts: int = 4
    base_delay_seconds: float = 2.0
    max_delay_seconds: float = 60.0
    jitter: bool = True
    timeout_seconds: float = 600.0
    poll_seconds: float = 1.0
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 5.0
    max_queue: int = 1
    grace_seconds: float = 60.0
    http_timeout_seconds: float = 30.0
    leave_queue_seconds: float = 60.0
    """How long an interrupted prompt may take to leave its server's queue; after that it is stuck (a custom
    node that never checks the interrupt flag): comfysup run restarts that server, comfysup work takes it
    out of service until its queue is empty."""
    affinity_max_wait_seconds: float = 300.0
    """Model affinity's fairness bound: a runner prefers jobs of the model its server ran last, but no job
    waits longer than this beyond what strict priority order would have made it wait; 0: strict order."""
    queue_ahead: bool = False
    """Keep one more job waiting in the server's own queue behind the running prompt (claimed, leased, posted
    with its own id), so ComfyUI starts it the moment the running one ends: the GPU no longer idles between
    two prompts for the client's claim, POST and socket work (3-4 ms a prompt; bench/e2e.py: efficiency 0.977
    → 0.992 at 200 ms × 4 servers). Off by default for now (issue 19 is not finished): a job queued behind a
    prompt whose server dies before it starts is counted as an attempt, and graceful stops and stuck-prompt
    restarts were built and tested for one prompt per server. Its timeout starts when it starts executing;
    a cancel or a graceful stop takes it out of the server's queue."""


@dataclass(frozen=True)
class SupervisorConfig:
    runner_timeout_seconds: float = 45.0
    recycle_after_jobs: int = 0
    recycle_rss_mb: int = 0
    max_quick_failures: int = 5
    quick_failure_seconds: float = 30.0
    restart_max_delay_seconds: float = 60.0
    log_max_mb: int = 50


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = "127.0.0.1:9188"
    """HOST:PORT of /metrics and the status page; port 0 takes any free port; empty: no endpoint."""
    refresh_seconds: float = 2.0
    """How often the status page reloads itself."""
    max_workflow_labels: int = 50
    """Distinct workflow label values in the metrics (the workflow file's name or meta.kind); past this a new
    one is counted as "other", so freely chosen kinds cannot grow the metrics without bound."""


@dataclass(frozen=True)
class WebhooksConfig:
    url: str = ""
    """Where every terminal job's record is POSTed when its line has no callback_url; empty: nowhere."""
    secret: str = ""
    """The HMAC-SHA256 key of the X-Comfysup-Signature header; empty: deliveries are not signed."""
    attempts: int = 8
    base_delay_seconds: float = 5.0
    max_delay_seconds: float = 600.0
    timeout_seconds: float = 10.0
    allow_private: bool = False
    """Allow webhooks to loopback, link-local and private addresses and to cloud metadata names; off, a job
    cannot make comfysup POST inside its own network (comfysup.destinations)."""


@dataclass(frozen=True)
class ApiConfig:
    listen: str = "127.0.0.1:9189"
    """HOST:PORT of the Comfy API v2 (/api/v2/jobs, /api/v2/assets) that ``comfysup run`` serves and ``comfysup
    api`` serves alone; port 0 takes any free port; empty: ``comfysup run`` serves none. The port is
    comfy-api-proxy's own default, so an SDK configured for the proxy finds comfysup in its place."""
    token: str = ""
    """The bearer token every request must carry (``Authorization: Bearer <token>``); empty: none is asked for,
    and then only a loopback address may be listened on. Never logged or shown."""
    max_queued: int = 0
    """Jobs not yet ended above which POST /api/v2/jobs answers 429 queue_full with Retry-After; 0: no bound."""
    max_upload_mb: int = 100
    """The largest body the API accepts (an asset upload; a job's JSON is bounded by the workflow limit)."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (``https://app.example``) allowed besides the API's own; any other Origin is refused, so
    a web page cannot make a visitor's browser submit jobs."""


@dataclass(frozen=True)
class RabbitMQConfig:
    url: str = ""
    """amqp://user:password@host:port/vhost of the broker; empty: no consumer, no broker results."""
    queue: str = "renders"
    """Where jobs arrive, one jobs.jsonl line per message; declared a durable quorum queue when missing."""
    prefetch: int = 50
    """Unacknowledged messages the consumer holds at once (basic_qos): each batch is one insert."""
    workflows_dir: str = "workflows"
    """A message's workflow path is read below this folder (relative to the config file); no .. or /."""
    done_exchange: str = "comfysup.done"
    """Where a done job's record is published (a durable fanout exchange when comfysup declares it)."""
    dead_exchange: str = "comfysup.dead"
    """Where a dead or cancelled job's record is published."""
    invalid_queue: str = "renders.invalid"
    """Where a message that fails validation goes, with its reason in the x-comfysup-reason header and body."""
    reconnect_max_delay_seconds: float = 30.0
    """Reconnection waits random(0, min(this, 0.5 × 2^(n-1))) after the n-th failure in a row."""


@dataclass(frozen=True)
class Config:
    queue: QueueConfig = field(default_factory=QueueConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    comfyui: ComfyUIConfig = field(default_factory=ComfyUIConfig)
    servers: tuple[ServerConfig, ...] = ()
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    webhooks: WebhooksConfig = field(default_factory=WebhooksConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    rabbitmq: RabbitMQConfig = field(default_factory=RabbitMQConfig)
    source: str = "<defaults>"
    """Where the file values came from, for messages."""
    root: str = "."
    """Directory that relative paths in the file are resolved against (the file's own directory)."""

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the config file's directory."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.root) / p


SECTIONS: dict[str, type] = {
    "queue": QueueConfig,
    "store": StoreConfig,
    "assets": AssetsConfig,
    "comfyui": ComfyUIConfig,
    "runner": RunnerConfig,
    "supervisor": SupervisorConfig,
    "metrics": MetricsConfig,
    "webhooks": WebhooksConfig,
    "api": ApiConfig,
    "rabbitmq": RabbitMQConfig,
}


def find_config_file(explicit: str | None) -> Path | None:
    """The file to read: --config, else $COMFYSUP_CONFIG, else ./config.toml, else /etc/comfysup."""
    chosen = explicit or os.environ.get(ENV_CONFIG)
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file (given by --config or ${ENV_CONFIG})")
        return path
    for candidate in DEFAULT_PATHS:
        if candidate.is_file():
            return candidate
    return None


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Read the settings: defaults < file < ``COMFYSUP_SECTION_KEY`` variables < ``overrides``.

    ``overrides`` maps ``"section.key"`` to a value (what command-line flags set).
    """
    file = find_config_file(path)
    raw: dict[str, Any] = {}
    source = "<defaults>"
    root = Path.cwd()
    if file is not None:
        source = str(file)
        root = file.resolve().parent
        try:
            with open(file, "rb") as f:
                raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc.strerror}") from exc
    return build_config(raw, source=source, root=str(root), env=os.environ if env is None else env,
                        overrides=overrides or {})


def build_config(
    raw: Mapping[str, Any],
    *,
    source: str = "<defaults>",
    root: str = ".",
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build and validate the tree from a parsed TOML document plus the environment and overrides."""
    values: dict[str, dict[str, tuple[Any, str]]] = {name: {} for name in SECTIONS}
    servers: tuple[ServerConfig, ...] = ()
    for section, body in raw.items():
        if section == "servers":
            servers = _servers(body, source)
            continue
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section [{section}]; expected one of "
                              f"{', '.join(sorted([*SECTIONS, 'servers']))}")
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: {section} = {body!r}: expected a table [{section}]")
        for key, value in body.items():
            values[section][key] = (value, source)
    for name, text in (env or {}).items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        section, key = _env_key(name)
        values[section][key] = (_parse_env(name, text, _field_type(section, key, name)), f"${name}")
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        values[section][key] = (value, "command line")
    sections = {name: _section(name, cls, values[name]) for name, cls in SECTIONS.items()}
    config = Config(**sections, servers=servers, source=source, root=root)
    _check(config)
    return config


def _env_key(name: str) -> tuple[str, str]:
    rest = name[len(ENV_PREFIX):].lower()
    for section in SECTIONS:
        if rest.startswith(section + "_"):
            key = rest[len(section) + 1:]
            _field_type(section, key, f"${name}")
            return section, key
    raise ConfigError(f"${name}: unknown setting; expected COMFYSUP_<SECTION>_<KEY> with a section of "
                      f"{', '.join(SECTIONS)} (for example COMFYSUP_RUNNER_ATTEMPTS=3)")


def _field_type(section: str, key: str, where: str) -> Any:
    hints = typing.get_type_hints(SECTIONS[section])
    if key not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(SECTIONS[section]))
        raise ConfigError(f"{where}: unknown key {key!r} in [{section}]; known keys: {known}")
    return hints[key]


def _parse_env(name: str, text: str, kind: Any) -> Any:
    """Environment values are strings; read them as TOML values when the key is not a plain string."""
    if kind is str:
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # reported by the type check with the key's expected type


def _section(name: str, cls: type, given: dict[str, tuple[Any, str]]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, (value, where) in given.items():
        if key not in hints:
            known = ", ".join(f.name for f in dataclasses.fields(cls))
            raise ConfigError(f"{where}: unknown key {key!r} in [{name}]; known keys: {known}")
        kwargs[key] = _coerce(value, hints[key], f"{where}: [{name}] {key} = {value!r}")
    return cls(**kwargs)


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """Check ``value`` against a field's type; ints are accepted for floats, nothing else is converted."""
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        for option in typing.get_args(kind):
            try:
                return _coerce(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {_describe(kind)}")
    if origin is tuple:
        item = typing.get_args(kind)[0]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected {_describe(kind)}")
        return tuple(_coerce(v, item, where) for v in value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected a whole number")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string")
        return value
    raise AssertionError(f"unhandled config type {kind!r}")


def _describe(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(k) for k in typing.get_args(kind))
    if origin is tuple:
        item = typing.get_args(kind)[0]
        return "a list of " + {float: "numbers", int: "whole numbers", bool: "true/false values",
                               str: "strings"}[item]
    return {float: "a number", int: "a whole number", bool: "true or false", str: "a string"}[kind]


def _servers(body: Any, source: str) -> tuple[ServerConfig, ...]:
    if not isinstance(body, list):
        raise ConfigError(f"{source}: servers must be an array of tables: [[servers]] name = ..., url = ...")
    out = []
    for i, entry in enumerate(body):
        where = f"{source}: [[servers]] #{i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table with name and url")
        unknown = set(entry) - {"name", "url"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; known keys: name, url")
        for key in ("name", "url"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where}: {key} = {entry.get(key)!r}: expected a non-empty string")
        parsed = urlparse(entry["url"])
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"{where}: url = {entry['url']!r}: expected http://HOST:PORT")
        out.append(ServerConfig(name=entry["name"], url=entry["url"].rstrip("/")))
    names = [s.name for s in out]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{source}: [[servers]] name = {name!r} appears twice; names must be unique")
    return tuple(out)


def _check(c: Config) -> None:
    """Impossible values: each message says which key, which value, and what would be accepted."""
    r, q, u, s = c.runner, c.queue, c.comfyui, c.supervisor

    def bad(section: str, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{c.source}: [{section}] {key} = {value!r}: {expected}")

    positive = [("runner", r, k) for k in ("base_delay_seconds", "max_delay_seconds", "timeout_seconds",
                                             "poll_seconds", "lease_seconds", "heartbeat_seconds",
                                             "http_timeout_seconds", "leave_queue_seconds")]
    positive += [("queue", q, "busy_timeout_seconds"), ("queue", q, "checkpoint_seconds"),
                 ("comfyui", u, "startup_seconds"), ("supervisor", s, "runner_timeout_seconds"),
                 ("supervisor", s, "quick_failure_seconds"), ("supervisor", s, "restart_max_delay_seconds")]
    for section, obj, key in positive:
        if getattr(obj, key) <= 0:
            raise bad(section, key, getattr(obj, key), "must be greater than 0")
    for key in ("grace_seconds", "affinity_max_wait_seconds"):
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
    if w.url:
        parsed = urlparse(w.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise bad("webhooks", "url", w.url, "expected an http:// or https:// URL, or an empty string")
        if w.url and not w.allow_private and (problem := url_problem(w.url)):
            raise bad("webhooks", "url", display_url(w.url), f"{problem}; set [webhooks] allow_private = true "
                      "to send webhooks inside this network")
    for key in ("base_delay_seconds", "max_delay_seconds", "timeout_seconds"):
        if getattr(w, key) <= 0:
            raise bad("webhooks", key, getattr(w, key), "must be greater than 0")
    if w.attempts < 1:
        raise bad("webhooks", "attempts", w.attempts, "must be at least 1")
    b = c.rabbitmq
    if b.url and not b.url.startswith(("amqp://", "amqps://")):
        raise bad("rabbitmq", "url", display_url(b.url), "expected amqp://user:password@host:5672/ or an empty string")
    if b.prefetch < 1:
        raise bad("rabbitmq", "prefetch", b.prefetch, "must be at least 1")
    if b.reconnect_max_delay_seconds <= 0:
        raise bad("rabbitmq", "reconnect_max_delay_seconds", b.reconnect_max_delay_seconds, "must be greater than 0")
    if w.base_delay_seconds > w.max_delay_seconds:
        raise bad("webhooks", "base_delay_seconds", w.base_delay_seconds,
                  f"must not exceed [webhooks] max_delay_seconds ({w.max_delay_seconds:g})")


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
    if a.max_upload_mb < 1:
        raise ConfigError(f"{c.source}: [api] max_upload_mb = {a.max_upload_mb!r}: must be at least 1")
    for origin in a.allowed_origins:
        parsed = urlparse(origin)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/"):
            raise ConfigError(f"{c.source}: [api] allowed_origins: {origin!r}: expected an origin like "
                              "https://app.example")


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
