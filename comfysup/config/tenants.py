"""The config's ``[tenants.NAME]`` tables read into comfysup.config.schema.TenantConfig: each key's type and its
checks, each name's spelling, and tokens that two tenants cannot share."""

from __future__ import annotations

import re
from typing import Any

from comfysup.config.checks import check_keys
from comfysup.config.schema import TenantConfig
from comfysup.errors import ConfigError

TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A tenant's name: what a label, a header and a CSV column can carry as it is."""
KINDS: dict[str, tuple[type, ...]] = {"weight": (int, float), "max_running": (int,), "max_queued": (int,),
                                      "token_sha256": (str,)}
SAYS = {"weight": "a number", "max_running": "a whole number", "max_queued": "a whole number",
        "token_sha256": "a string of 64 hex digits"}


def read_tenants(body: Any, source: str) -> tuple[TenantConfig, ...]:
    """Every ``[tenants.NAME]`` table, by name; a ConfigError names the table and key that is wrong."""
    if body is None:
        return ()
    if not isinstance(body, dict):
        raise ConfigError(f"{source}: tenants = {body!r}: expected tables [tenants.NAME] with weight, max_running, "
                          "max_queued, token_sha256")
    out = [_tenant(name, entry, source) for name, entry in sorted(body.items())]
    tokens = [t.token_sha256.lower() for t in out if t.token_sha256]
    for t in out:
        if t.token_sha256 and tokens.count(t.token_sha256.lower()) > 1:
            raise ConfigError(f"{source}: [tenants.{t.name}] token_sha256: another tenant has the same token; each "
                              "tenant needs a token of its own")
    return tuple(out)


def _tenant(name: str, entry: Any, source: str) -> TenantConfig:
    where = f"{source}: [tenants.{name}]"
    if not TENANT_NAME.fullmatch(name):
        raise ConfigError(f"{where}: a tenant's name is 1 to 64 letters, digits, '_', '.' or '-', starting with a "
                          "letter or digit")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a table with weight, max_running, max_queued, token_sha256")
    for key, value in entry.items():
        if key not in KINDS:
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {', '.join(KINDS)}")
        if isinstance(value, bool) or not isinstance(value, KINDS[key]):
            raise ConfigError(f"{where} {key} = {value!r}: expected {SAYS[key]}")
    tenant = TenantConfig(**entry, name=name)
    check_keys(source, f"tenants.{name}", tenant)
    return tenant
