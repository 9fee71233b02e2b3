"""How a section of comfysup.config.schema is declared: a ``Section`` class whose annotated attributes are its keys,
each with its type, its default (``setting(default, *checks)`` where it has checks of its own) and a docstring under
it. The class reads its keys once, when it is defined; every section then shares one ``__init__`` (keyword or
positional arguments, a key without a default must be given), comparison and hash by value, a repr, and frozen
attributes. ``fields`` gives a section's keys in their order (what comfysup.config.loader reads types from, what
comfysup.config.checks asks), ``values`` its values by key and ``replace`` a copy with some keys changed.

A section is a plain record read by every command, so it is made without generating code per class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, dataclass_transform, get_origin

MISSING: Any = object()
"""The default of a key that has none: it must be given."""


class Setting:
    """What ``setting`` leaves in the class body, read (and replaced by the default) when the section is defined."""

    __slots__ = ("checks", "default")

    def __init__(self, default: Any, checks: tuple[Callable[[Any], Any], ...]) -> None:
        self.default = default
        self.checks = checks


def setting(default: Any, *checks: Callable[[Any], Any]) -> Any:
    """A key's default and its checks, in the order they are asked (the first that refuses is reported)."""
    return Setting(default, checks)


class Key:
    """One key of a section: its name, its type as annotated, its default (``MISSING``: it must be given) and its
    checks, in their order."""

    __slots__ = ("checks", "default", "name", "type")

    def __init__(self, name: str, kind: Any, default: Any, checks: tuple[Callable[[Any], Any], ...]) -> None:
        self.name = name
        self.type = kind
        self.default = default
        self.checks = checks

    def __repr__(self) -> str:
        return f"Key({self.name!r}, {self.type!r}, default={self.default!r})"


@dataclass_transform(eq_default=True, frozen_default=True, field_specifiers=(setting,))
class Section:
    """A frozen record of keys (see the module docstring); a subclass declares them as annotated attributes."""

    KEYS: ClassVar[tuple[Key, ...]] = ()
    NAMES: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        keys = []
        for name, kind in cls.__annotations__.items():  # its own: a class does not inherit them
            if isinstance(kind, str):
                raise TypeError(f"{cls.__name__}.{name}: a section's annotations are read as types (its module has no "
                                "'from __future__ import annotations')")
            if kind is ClassVar or get_origin(kind) is ClassVar:
                continue
            given = cls.__dict__.get(name, MISSING)
            declared = given if isinstance(given, Setting) else Setting(given, ())
            keys.append(Key(name, kind, declared.default, declared.checks))
            if declared.default is MISSING:
                continue
            setattr(cls, name, declared.default)
        cls.KEYS = tuple(keys)
        cls.NAMES = frozenset(key.name for key in keys)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(self.KEYS):
            raise TypeError(f"{type(self).__name__} takes {len(self.KEYS)} values, {len(args)} were given")
        given = dict(zip((key.name for key in self.KEYS), args, strict=False))
        unknown = [name for name in kwargs if name not in self.NAMES or name in given]
        if unknown:
            raise TypeError(f"{type(self).__name__} got an unknown or repeated key {unknown[0]!r}")
        given.update(kwargs)
        for key in self.KEYS:
            if key.name not in given:
                if key.default is MISSING:
                    raise TypeError(f"{type(self).__name__} needs {key.name!r}")
                given[key.name] = key.default
        self.__dict__.update(given)

    def _values(self) -> tuple[Any, ...]:
        return tuple(self.__dict__[key.name] for key in self.KEYS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{key.name}={self.__dict__[key.name]!r}" for key in self.KEYS)
        return f"{type(self).__name__}({inner})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r} (replace makes a changed copy)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")


def fields(section: Section | type[Section]) -> tuple[Key, ...]:
    """A section's keys (of the class or of one of its values), in the order they are declared."""
    return section.KEYS


def values(section: Section) -> dict[str, Any]:
    """A section's values by key, in the order the keys are declared."""
    return {key.name: getattr(section, key.name) for key in section.KEYS}


def replace(section: Section, **changes: Any) -> Any:
    """A copy of ``section`` with ``changes`` (key → value); TypeError for a key it does not have."""
    return type(section)(**{**values(section), **changes})


def is_section(value: object) -> bool:
    """Whether ``value`` is a section (or a table of the config such as a tenant's), not a list of them."""
    return isinstance(value, Section)
