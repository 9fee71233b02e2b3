"""A section of config.toml (comfysup.config.schema): a frozen record (comfysup.records) whose keys are declared
with ``setting(default, *checks)`` where they have checks of their own (comfysup.config.checks asks them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from comfysup.records import Record, key


def setting(default: Any, *checks: Callable[[Any], Any]) -> Any:
    """A key's default and its checks, in the order they are asked (the first that refuses is reported)."""
    return key(default, *checks)


class Section(Record):
    """A section of config.toml, or a table of it (``[[servers]]``, ``[[models]]``, ``[tenants.NAME]``), or the
    whole config. Its keys' types are types (the loader checks values against them), never postponed strings."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        postponed = [k.name for k in cls.KEYS if isinstance(k.type, str)]
        if postponed:
            raise TypeError(f"{cls.__name__}.{postponed[0]}: a section's annotations are read as types (its module "
                            "has no 'from __future__ import annotations')")


def is_section(value: object) -> bool:
    """Whether ``value`` is a section (or a table of the config such as a tenant's), not a list of them."""
    return isinstance(value, Section)
