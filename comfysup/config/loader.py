"""Reading the settings: config.toml, then COMFYSUP_* variables, then flags, into the schema's frozen tree.

Precedence is defaults < file < environment < command line. Every key is declared in comfysup.config.schema with
its type, so an unknown key, a wrong type or an impossible value is an error naming the file, the key, the value
and what was expected: a typo must never fall back silently to a default. The checks of impossible values are in
comfysup.config.checks.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from comfysup.config.checks import check
from comfysup.config.schema import SECTIONS, Config, ServerConfig
from comfysup.errors import ConfigError

DEFAULT_PATHS = (Path("config.toml"), Path("/etc/comfysup/config.toml"))
ENV_PREFIX = "COMFYSUP_"
ENV_CONFIG = "COMFYSUP_CONFIG"
ENV_NOT_SETTINGS = frozenset({ENV_CONFIG, "COMFYSUP_HOSTNAME", "COMFYSUP_SKIP_POSTGRES", "COMFYSUP_TEST_POSTGRES",
                              "COMFYSUP_LOG_FORMAT"})
"""COMFYSUP_* variables that are not COMFYSUP_<SECTION>_<KEY> settings (the machine's name in the queue, the
log format of a process, and switches of the test suite), so they are not refused as unknown settings."""


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
    check(config)
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
        unknown = set(entry) - {"name", "url", "output_dir"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; known keys: name, url, output_dir")
        for key in ("name", "url"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where}: {key} = {entry.get(key)!r}: expected a non-empty string")
        parsed = urlparse(entry["url"])
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"{where}: url = {entry['url']!r}: expected http://HOST:PORT")
        output_dir = entry.get("output_dir", "")
        if not isinstance(output_dir, str):
            raise ConfigError(f"{where}: output_dir = {output_dir!r}: expected the path of the server's output "
                              "folder on this machine (ComfyUI's output), or no output_dir for a server elsewhere")
        out.append(ServerConfig(name=entry["name"], url=entry["url"].rstrip("/"), output_dir=output_dir))
    names = [s.name for s in out]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{source}: [[servers]] name = {name!r} appears twice; names must be unique")
    return tuple(out)
