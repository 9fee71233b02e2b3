"""What a failure is, and what to do after it: a pure decision, tested as a table (procrastinate's
RetryStrategy).

Transient failures are retried after the policy's full-jitter backoff (comfysup.backoff) until
``attempts`` is spent; then the job is dead with ``gave up after N attempts, last: <reason>``. Permanent
failures are dead at once. Which failures are transient is decided here (DESIGN.md's failure table).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from comfysup.backoff import RetryPolicy

OOM_TYPES = frozenset({"torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "OutOfMemoryError"})
OOM_MESSAGE = re.compile(r"out of memory|allocation on device", re.I)
__all__ = ["Decision", "Failure", "RetryPolicy", "decide", "execution_failure", "gave_up", "is_oom"]


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed. ``kind`` is the reason class (metrics, logs); ``reason`` the text."""

    kind: str
    reason: str
    transient: bool


@dataclass(frozen=True)
class Decision:
    dead: bool
    reason: str
    delay_seconds: float = 0.0


def decide(policy: RetryPolicy, attempt: int, failure: Failure,
           rand: Callable[[], float] = random.random) -> Decision:
    if not failure.transient:
        return Decision(dead=True, reason=failure.reason)
    if attempt >= policy.attempts:
        return Decision(dead=True, reason=gave_up(attempt, failure.reason))
    return Decision(dead=False, reason=failure.reason, delay_seconds=policy.backoff(attempt, rand))


def gave_up(attempts: int, last: str | None) -> str:
    return f"gave up after {attempts} attempts, last: {last or 'unknown'}"


def is_oom(error: dict[str, Any]) -> bool:
    """An out-of-memory execution_error, from its exception type or message, not guessed."""
    kind = str(error.get("exception_type") or "")
    return kind in OOM_TYPES or kind.endswith(".OutOfMemoryError") \
        or bool(OOM_MESSAGE.search(str(error.get("exception_message") or "")))


def execution_failure(error: dict[str, Any]) -> Failure:
    """The failure an ``execution_error`` message stands for: OOM is transient, the rest permanent."""
    # The first line is the message; the rest (ComfyUI's TIPS, a tensor dump) is not a reason.
    lines = [line.strip() for line in str(error.get("exception_message") or "").strip().splitlines()]
    message = lines[0] + (" …" if len(lines) > 1 else "") if lines else ""
    text = (f"execution_error, node {error.get('node_id')} ({error.get('node_type')}): "
            f"{error.get('exception_type')}: {message}")
    if is_oom(error):
        return Failure("oom", text, transient=True)
    return Failure("execution_error", text, transient=False)
