"""How a config's values are checked: the checks a key declares beside itself in comfysup.config.schema, the
rules a section declares for keys that must agree with other keys, and what only ``comfysup run`` needs.

A key's check takes its value and answers None (fine) or what would be accepted; a rule takes the whole config
and answers the same for one key. Either may answer a ``Problem`` to name the value otherwise than as it is
written (a masked URL, one entry of a list). Each message says which file, which key, which value, and what
would be accepted. ``check`` runs on every config (comfysup.config.build_config calls it); ``check_supervisor``
only where a supervisor starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from comfysup.config.sections import is_section
from comfysup.errors import ConfigError
from comfysup.records import fields

if TYPE_CHECKING:
    from comfysup.config.schema import Config


class Problem(NamedTuple):
    """What is wrong with a value: ``text`` says what would be accepted; ``about`` is how the message names the
    value after ``[section] key`` (`` = 'value'`` when None)."""

    text: str
    about: str | None = None


Answer = str | Problem | None
"""What a check or a rule answers: None when the value is fine, else what would be accepted."""
Check = Callable[[Any], Answer]
"""A key's own check: its value alone decides."""


class Rule(NamedTuple):
    """A check of ``key`` that needs other keys too (of its section or another): ``check`` takes the config."""

    key: str
    check: Callable[[Config], Answer]


def positive(text: str) -> Check:
    """A number above 0; ``text`` says so in the key's words."""
    return lambda value: text if not value > 0 else None


greater_than_zero = positive("must be greater than 0")
seconds_greater_than_zero = positive("must be a number of seconds greater than 0")


def at_least(least: int, why: str = "") -> Check:
    """``must be at least <least>``, with ``why`` (a parenthesis) after it when given."""
    text = f"must be at least {least}" + (f" {why}" if why else "")
    return lambda value: text if value < least else None


def zero_or_more(meaning: str = "") -> Check:
    """``must be 0 or more``, with what 0 means (``(off)``, ``(no bound)``) when given."""
    text = f"must be 0 {meaning} or more" if meaning else "must be 0 or more"
    return lambda value: text if value < 0 else None


def hex_sha256(value: str) -> Answer:
    """Empty, or 64 hex digits: a SHA-256 as ``sha256sum`` prints it."""
    if value and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return "must be 64 hex digits, the SHA-256 of the token (printf %s TOKEN | sha256sum), never the token itself"
    return None


def between(low: int, high: int, text: str) -> Check:
    """A number from ``low`` to ``high``, both included; ``text`` says so in the key's words."""
    return lambda value: text if not low <= value <= high else None


def each(check: Check) -> Check:
    """A list key's check of every entry: the first entry refused is the answer."""
    def check_each(values: tuple[Any, ...]) -> Answer:
        return next((answer for answer in map(check, values) if answer is not None), None)

    return check_each


def check(c: Config) -> None:
    """Impossible values: every key's own checks, section by section, then every section's rules, then the one
    rule of every number (``no_negative_numbers``)."""
    for name, values in _sections(c):
        check_keys(c.source, name, values)
    for name, values in _sections(c):
        for rule in getattr(values, "RULES", ()):
            _refuse(c.source, name, rule.key, getattr(values, rule.key), rule.check(c))
    no_negative_numbers(c)


def check_keys(source: str, name: str, values: Any) -> None:
    """Every key's own checks of one section (or one ``[tenants.NAME]`` table), in their order."""
    for f in fields(values):
        value = getattr(values, f.name)
        for key_check in f.checks:
            _refuse(source, name, f.name, value, key_check(value))


def _sections(c: Config) -> list[tuple[str, Any]]:
    """The config's sections (``[queue]`` to ``[rabbitmq]``, not its [[servers]] or [[models]]) by name."""
    return [(f.name, getattr(c, f.name)) for f in fields(c) if is_section(getattr(c, f.name))]


def _refuse(source: str, section: str, key: str, value: Any, answer: Answer) -> None:
    """The ConfigError of a check's or a rule's answer, when it refused the value."""
    if answer is None:
        return
    problem = answer if isinstance(answer, Problem) else Problem(answer)
    about = f" = {value!r}" if problem.about is None else problem.about
    raise ConfigError(f"{source}: [{section}] {key}{about}: {problem.text}")


def no_negative_numbers(c: Config) -> None:
    """Every number of the config is a duration, a size, a count or a port: none means anything below 0. Checked
    last, so a key with a check of its own (``must be greater than 0``) says that first."""
    for name, values in _sections(c):
        for f in fields(values):
            value = getattr(values, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(f"{c.source}: [{name}] {f.name} = {value!r}: must be 0 or more (a duration, a size "
                                  "or a count is never negative)")


def check_supervisor(c: Config) -> None:
    """What only ``comfysup run`` needs: a stalled runner must be killed (and its claim released) before
    its lease could expire and hand the job to another runner while the stalled one may still act on it.

    Not part of ``check``: ``comfysup work`` and tools that never start a supervisor may use a short
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


class GpuSpec(NamedTuple):
    """What ``gpus`` asks for: ``auto`` (NVML), explicit CUDA indices, or ``cpu`` slots."""

    mode: str  # "auto" | "list" | "cpu" | "none" (launch nothing: supervise only the [[servers]])
    indices: tuple[int, ...] = ()
    cpu_slots: int = 0


def gpus_problem(value: str | tuple[int, ...]) -> Answer:
    """``[comfyui] gpus``'s check: ``auto``, ``none``, ``cpu:N`` or a list of distinct CUDA indices."""
    if isinstance(value, tuple):
        if not value:
            return ("the list is empty; give CUDA indices like [0, 2], \"auto\", or \"none\" to launch no ComfyUI "
                    "server and supervise only the [[servers]]")
        if any(i < 0 for i in value) or len(set(value)) != len(value):
            return "expected distinct CUDA device indices (0 or more)"
        return None
    if value in ("auto", "none") or _cpu_slots(value) >= 1:
        return None
    return ("expected \"auto\", a list of CUDA indices like [0, 2], or \"cpu:N\" (N ComfyUI servers on the CPU); or "
            "\"none\" to launch none and use only the [[servers]]")


def _cpu_slots(value: str) -> int:
    """N of ``cpu:N``; 0 for any other text."""
    return int(value[4:]) if value.startswith("cpu:") and value[4:].isdigit() else 0


def parse_gpus(value: str | tuple[int, ...], source: str = "<config>") -> GpuSpec:
    """``[comfyui] gpus`` as a GpuSpec; ConfigError naming ``source`` when it is none of what ``gpus`` may be."""
    problem = gpus_problem(value)
    if problem is not None:
        raise ConfigError(f"{source}: [comfyui] gpus = {value!r}: {problem}")
    if isinstance(value, tuple):
        return GpuSpec("list", indices=tuple(value))
    if value in ("auto", "none"):
        return GpuSpec(value)
    return GpuSpec("cpu", cpu_slots=_cpu_slots(value))
