"""What a failure is, and what to do after it: a pure decision, tested as a table (procrastinate's
RetryStrategy).

Transient failures are retried after the policy's full-jitter backoff (comfysup.backoff) until
``attempts`` is spent; then the job is dead with ``gave up after N attempts, last: <reason>``. Permanent
failures are dead at once. Which of ComfyUI's failures are transient is comfysup.comfy.errors' to say
(docs/design.md's failure table); ``Failure``, ``execution_failure`` and ``is_oom`` are importable from here too,
beside the decisions on them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from comfysup.backoff import RetryPolicy
from comfysup.comfy.errors import Failure, execution_failure, is_oom

__all__ = ["Decision", "Failure", "RetryPolicy", "decide", "execution_failure", "gave_up", "is_oom"]


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


