"""How long to wait before trying again: full-jitter exponential backoff, a pure computation.

The delay after try ``n`` (1-based) is ``random(0, min(cap, base × 2^(n-1)))`` — full jitter, so callers
that failed together do not try again together (AWS Architecture Blog, "Exponential Backoff And Jitter").
Used by the runner's retries of an attempt (comfysup.runner.retry) and by webhook deliveries.

A base module: it imports only the standard library. Its values come from the settings
(``[runner]``, ``[webhooks]`` in comfysup.config), where every default is declared; it declares none.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How many tries, and the delays between them (no defaults: see comfysup.config)."""

    attempts: int
    base_delay_seconds: float
    max_delay_seconds: float
    jitter: bool

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before the try after ``attempt`` (1-based); ``rand`` in [0, 1) is injected by tests."""
        ceiling = min(self.max_delay_seconds, self.base_delay_seconds * 2 ** max(attempt - 1, 0))
        return ceiling * rand() if self.jitter else ceiling
