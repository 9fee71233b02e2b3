"""Reading the settings: config.toml, then COMFYSUP_* variables, then flags, into the schema's frozen tree.

Precedence is defaults < file < environment < command line. Every key is declared in comfysup.config.schema with
its type and its checks, so an unknown key, a wrong type or an impossible value is an error naming the file, the
key, the value and what was expected: a typo must never fall back silently to a default. The checks are asked by
comfysup.config.checks.
"""

from __future__ import annotations

import math
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from comfysup.config.checks import check
from comfysup.config.models import read_models
from comfysup.config.schema import SECTIONS, Config, ServerConfig
from comfysup.config.tenants import read_tenants
from comfysup.errors import ConfigError
from comfysup.records import fields

DEFAULT_PATHS = (Path("config.toml"), Path("/etc/comfysup/config.toml"))
"""Where a config is looked for when none is named: see ``config_paths`` (the user's own folder sits between)."""
ENV_PREFIX = "COMFYSUP_"
ENV_CONFIG = "COMFYSUP_CONFIG"
ENV_NOT_SETTINGS = frozenset({ENV_CONFIG, "COMFYSUP_HOSTNAME", "COMFYSUP_SKIP_POSTGRES", "COMFYSUP_TEST_POSTGRES",
                              "COMFYSUP_TEST_RABBITMQ", "COMFYSUP_LOG_FORMAT"})
"""COMFYSUP_* variables that are not COMFYSUP_<SECTION>_<KEY> settings (the machine's name in the queue, the
log format of a process, and switches of the test suite), so they are not refused as unknown settings."""


MAX_FILE_BYTES = 4 << 20
"""The largest config file read: a real one is a few KiB."""
MAX_DEPTH = 16
"""Tables and arrays nested at most this deep (a config is sections, [[servers]], and lists of numbers)."""


def config_paths(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where a config is looked for, in order, when none is named: ./config.toml (where ``comfysup init`` writes
    it), $XDG_CONFIG_HOME/comfysup/config.toml (~/.config without it), /etc/comfysup/config.toml (the service's)."""
    env = os.environ if env is None else env
    user = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "comfysup" / "config.toml"
    return [DEFAULT_PATHS[0], user, DEFAULT_PATHS[1]]


def find_config_file(explicit: str | None) -> Path | None:
    """The file to read: --config, else $COMFYSUP_CONFIG, else the first of ``config_paths`` that exists."""
    chosen = explicit or os.environ.get(ENV_CONFIG)
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file (given by --config or ${ENV_CONFIG})")
        return path
    for candidate in config_paths():
        if candidate.is_file():
            return candidate
    return None


def no_config_found(command: str) -> ConfigError:
    """What a command that needs a config says when it finds none (and no COMFYSUP_* setting stands for one)."""
    looked = ", ".join(str(p) for p in config_paths())
    return ConfigError(f"no config.toml found (looked in {looked}, and ${ENV_CONFIG} is not set); run "
                       f"`comfysup init` to write one here, or pass --config PATH to {command}")


def has_env_settings(env: Mapping[str, str]) -> bool:
    """Whether some COMFYSUP_<SECTION>_<KEY> variable gives a setting (a container configured by variables)."""
    return any(name.startswith(ENV_PREFIX) and name not in ENV_NOT_SETTINGS for name in env)


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
        raw = read_toml(file)
    return build_config(raw, source=source, root=str(root), env=os.environ if env is None else env,
                        overrides=overrides or {})


def read_toml(file: Path) -> dict[str, Any]:
    """The parsed file, or a one-line ConfigError: the file is untrusted input like any other (a config that is not
    UTF-8, huge, or nested thousands deep must never end in a traceback)."""
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{file}: larger than {MAX_FILE_BYTES >> 20} MiB; a config.toml is a few KiB: is this the "
                          "right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); save it as "
                          "UTF-8") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{file}: nested too deep to read; a config has at most {MAX_DEPTH} levels") from None
    if _depth(raw) > MAX_DEPTH:
        raise ConfigError(f"{file}: nested more than {MAX_DEPTH} levels deep; a config has sections, keys and "
                          "short lists")
    return raw


def _depth(value: Any) -> int:
    """How many levels of tables and arrays ``value`` holds (iterative: a deep value cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


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
    servers = _file_values(raw, source, values)
    _env_values(env or {}, values)
    for dotted, value in (overrides or {}).items():
        if value is not None:  # None: the flag was not given
            section, _, key = dotted.partition(".")
            values[section][key] = (value, "command line")
    sections = {name: _section(name, cls, values[name]) for name, cls in SECTIONS.items()}
    models = read_models(raw.get("models"), source, sections["comfyui"].models_manifest, root, read_toml)
    tenants = read_tenants(raw.get("tenants"), source)
    config = Config(**sections, servers=servers, models=models, tenants=tenants, source=source, root=root)
    check(config)
    return config


def _file_values(raw: Mapping[str, Any], source: str,
                 values: dict[str, dict[str, tuple[Any, str]]]) -> tuple[ServerConfig, ...]:
    """The file's keys of every section into ``values``, and its [[servers]]; [[models]] is read once [comfyui]
    models_manifest is known."""
    servers: tuple[ServerConfig, ...] = ()
    for section, body in raw.items():
        if section == "servers":
            servers = _servers(body, source)
            continue
        if section in ("models", "tenants"):
            continue
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section [{section}]; expected one of "
                              f"{', '.join(sorted([*SECTIONS, 'servers', 'models', 'tenants']))}")
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: {section} = {body!r}: expected a table [{section}]")
        for key, value in body.items():
            values[section][key] = (value, source)
    return servers


def _env_values(env: Mapping[str, str], values: dict[str, dict[str, tuple[Any, str]]]) -> None:
    """Each COMFYSUP_<SECTION>_<KEY> variable into ``values``, read as its key's type."""
    for name, text in env.items():
        if name.startswith(ENV_PREFIX) and name not in ENV_NOT_SETTINGS:
            section, key = _env_key(name)
            values[section][key] = (_parse_env(name, text, _field_type(section, key, name)), f"${name}")


def _env_key(name: str) -> tuple[str, str]:
    rest = name[len(ENV_PREFIX):].lower()
    for section in SECTIONS:
        if rest.startswith(section + "_"):
            key = rest[len(section) + 1:]
            _field_type(section, key, f"${name}")
            return section, key
    raise ConfigError(f"${name}: unknown setting; expected COMFYSUP_<SECTION>_<KEY> with a section of "
                      f"{', '.join(SECTIONS)} (for example COMFYSUP_RUNNER_ATTEMPTS=3)")


def _key_types(cls: type) -> dict[str, Any]:
    """A section's keys and their types (evaluated in comfysup.config.schema, so read as they are)."""
    return {f.name: f.type for f in fields(cls)}


def _field_type(section: str, key: str, where: str) -> Any:
    types_of = _key_types(SECTIONS[section])
    if key not in types_of:
        raise ConfigError(f"{where}: unknown key {key!r} in [{section}]; known keys: {', '.join(types_of)}")
    return types_of[key]


def _parse_env(name: str, text: str, kind: Any) -> Any:
    """Environment values are strings; read them as TOML values when the key is not a plain string."""
    if kind is str:
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text  # reported by the type check with the key's expected type


def _section(name: str, cls: type, given: dict[str, tuple[Any, str]]) -> Any:
    types_of = _key_types(cls)
    kwargs = {}
    for key, (value, where) in given.items():
        if key not in types_of:
            raise ConfigError(f"{where}: unknown key {key!r} in [{name}]; known keys: {', '.join(types_of)}")
        kwargs[key] = _coerce(value, types_of[key], f"{where}: [{name}] {key} = {value!r}")
    return cls(**kwargs)


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """Check ``value`` against a key's type; ints are accepted for floats, nothing else is converted."""
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return _coerce_union(value, kind, where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected {_describe(kind)}")
        item = typing.get_args(kind)[0]
        return tuple(_coerce(v, item, where) for v in value)
    return _SCALARS[kind](value, where)


def _coerce_union(value: Any, kind: Any, where: str) -> Any:
    """The value as the first of the union's types that takes it."""
    for option in typing.get_args(kind):
        try:
            return _coerce(value, option, where)
        except ConfigError:
            continue
    raise ConfigError(f"{where}: expected {_describe(kind)}")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number")
    if not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number (a duration or a size is never NaN or infinite)")
    return float(value)


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected a whole number")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string")
    return plain_text(value, where)


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {float: _number, int: _whole, bool: _flag, str: _text}
"""How a value of each scalar type of the schema is checked (and a whole number made a float)."""


def plain_text(value: str, where: str) -> str:
    """A string setting without control characters: a NUL cuts a path short in the OS, a newline forges log lines
    and headers; no setting (a path, a URL, a name, a token) has a use for them."""
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ConfigError(f"{where}: contains the control character {bad!r}; remove it")
    return value


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
        unknown = set(entry) - {"name", "url", "output_dir"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; known keys: name, url, output_dir")
        for key in ("name", "url"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where}: {key} = {entry.get(key)!r}: expected a non-empty string")
            plain_text(entry[key], f"{where}: {key} = {entry[key]!r}")
        parsed = urlparse(entry["url"])
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"{where}: url = {entry['url']!r}: expected http://HOST:PORT")
        output_dir = entry.get("output_dir", "")
        if not isinstance(output_dir, str):
            raise ConfigError(f"{where}: output_dir = {output_dir!r}: expected the path of the server's output "
                              "folder on this machine (ComfyUI's output), or no output_dir for a server elsewhere")
        plain_text(output_dir, f"{where}: output_dir = {output_dir!r}")
        out.append(ServerConfig(name=entry["name"], url=entry["url"].rstrip("/"), output_dir=output_dir))
    names = [s.name for s in out]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{source}: [[servers]] name = {name!r} appears twice; names must be unique")
    return tuple(out)
