"""Frozen records declared by their annotations: a ``Record`` subclass's annotated attributes are its keys, each with
its type, its default (none: it must be given; ``new(dict)`` for a fresh mutable one each time; ``key(default,
*checks)`` for a default with checks) and a docstring under it. The class reads its keys once, when it is defined;
every record then shares one ``__init__`` (keyword or positional arguments), comparison and hash by value (a record
holding a dict is not hashable), a repr, and frozen attributes. ``fields`` gives a record's keys in their order,
``values`` its values by key and ``replace`` a copy with some keys changed.

For the records that every command defines at import (the config's sections, the queue's and the jobs file's): a
dataclass generates and ``exec``s each method of each class, and imports ``inspect`` to do it; a record does
neither. A key's type is its annotation as the module has it: a string where annotations are postponed (``from
__future__ import annotations``), which comfysup.config.schema does not do, so that comfysup.config.loader reads
each key's type as a type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, dataclass_transform, get_origin

R = TypeVar("R", bound="Record")
MISSING: Any = object()
"""The default of a key that has none: it must be given."""


class Declared:
    """What ``key`` leaves in the class body, read (and replaced by the default) when the record is defined."""

    __slots__ = ("checks", "default", "factory")

    def __init__(self, default: Any, factory: Callable[[], Any] | None, checks: tuple[Callable[[Any], Any], ...]):
        self.default = default
        self.factory = factory
        self.checks = checks


def key(default: Any, *checks: Callable[[Any], Any]) -> Any:
    """A key's default and its checks, in the order they are asked (comfysup.config.checks asks a config key's)."""
    return Declared(default, None, checks)


def new(factory: Callable[[], Any]) -> Any:
    """A key whose default is made afresh for each record by ``factory`` (``dict``, ``list``): never one value
    shared by every record."""
    return Declared(MISSING, factory, ())


class Key:
    """One key of a record: its name, its type as annotated, its default (``MISSING``: it must be given, or comes
    from ``factory``) and its checks, in their order."""

    __slots__ = ("checks", "default", "factory", "name", "type")

    def __init__(self, name: str, kind: Any, declared: Declared) -> None:
        self.name = name
        self.type = kind
        self.default = declared.default
        self.factory = declared.factory
        self.checks = declared.checks

    def __repr__(self) -> str:
        return f"Key({self.name!r}, {self.type!r}, default={self.default!r})"


@dataclass_transform(eq_default=True, frozen_default=True, field_specifiers=(key, new))
class Record:
    """A frozen record of keys (see the module docstring); a subclass declares them as annotated attributes."""

    KEYS: ClassVar[tuple[Key, ...]] = ()
    NAMES: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        keys = []
        for name, kind in cls.__annotations__.items():  # its own: a class does not inherit them
            if _class_var(kind):
                continue
            given = vars(cls).get(name, MISSING)
            keys.append(Key(name, kind, given if isinstance(given, Declared) else Declared(given, None, ())))
            if keys[-1].default is not MISSING:
                setattr(cls, name, keys[-1].default)
            elif name in vars(cls):
                delattr(cls, name)
        cls.KEYS = tuple(keys)
        cls.NAMES = frozenset(k.name for k in keys)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(self.KEYS):
            raise TypeError(f"{type(self).__name__} takes {len(self.KEYS)} values, {len(args)} were given")
        given = dict(zip((k.name for k in self.KEYS), args, strict=False))
        unknown = [name for name in kwargs if name not in self.NAMES or name in given]
        if unknown:
            raise TypeError(f"{type(self).__name__} got an unknown or repeated key {unknown[0]!r}")
        given.update(kwargs)
        for k in self.KEYS:
            if k.name in given:
                continue
            if k.factory is not None:
                given[k.name] = k.factory()
            elif k.default is MISSING:
                raise TypeError(f"{type(self).__name__} needs {k.name!r}")
            else:
                given[k.name] = k.default
        self.__dict__.update(given)

    def _values(self) -> tuple[Any, ...]:
        return tuple(self.__dict__[k.name] for k in self.KEYS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k.name}={self.__dict__[k.name]!r}" for k in self.KEYS)
        return f"{type(self).__name__}({inner})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r} (replace makes a changed copy)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")


def _class_var(kind: Any) -> bool:
    """Whether an annotation declares a class attribute, not a key (as written, where annotations are postponed)."""
    if isinstance(kind, str):
        return kind.startswith(("ClassVar", "typing.ClassVar"))
    return kind is ClassVar or get_origin(kind) is ClassVar


def fields(record: Record | type[Record]) -> tuple[Key, ...]:
    """A record's keys (of the class or of one of its values), in the order they are declared."""
    return record.KEYS


def values(record: Record) -> dict[str, Any]:
    """A record's values by key, in the order the keys are declared."""
    return {k.name: getattr(record, k.name) for k in record.KEYS}


def replace(record: R, **changes: Any) -> R:
    """A copy of ``record`` with ``changes`` (key → value); TypeError for a key it does not have."""
    return type(record)(**{**values(record), **changes})
