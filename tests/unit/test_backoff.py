"""Full-jitter backoff is a pure computation: a table of (attempt, rand) -> delay."""

import pytest

from comfysup.backoff import RetryPolicy
from comfysup.config import RunnerConfig, WebhooksConfig

RUNNER = RetryPolicy(attempts=4, base_delay_seconds=2.0, max_delay_seconds=60.0, jitter=True)


@pytest.mark.parametrize(
    ("policy", "attempt", "rand", "delay"),
    [
        (RUNNER, 1, 1.0, 2.0),
        (RUNNER, 2, 0.5, 2.0),
        (RUNNER, 6, 1.0, 60.0),  # min(60, 2 * 2^5): capped
        (RUNNER, 0, 1.0, 2.0),  # never below the base's exponent
        (RUNNER, 3, 0.0, 0.0),  # full jitter reaches zero
        (RetryPolicy(attempts=4, base_delay_seconds=2.0, max_delay_seconds=60.0, jitter=False), 3, 0.0, 8.0),
        (RetryPolicy(attempts=8, base_delay_seconds=5.0, max_delay_seconds=600.0, jitter=True), 8, 1.0, 600.0),
    ],
)
def test_backoff_table(policy, attempt, rand, delay):
    assert policy.backoff(attempt, lambda: rand) == pytest.approx(delay)


def test_the_policy_declares_no_defaults_of_its_own():
    """Defaults live in comfysup.config only; a policy is always built from a section of it."""
    with pytest.raises(TypeError):
        RetryPolicy()  # type: ignore[call-arg]
    r, w = RunnerConfig(), WebhooksConfig()
    assert RetryPolicy(r.attempts, r.base_delay_seconds, r.max_delay_seconds, r.jitter).backoff(1, lambda: 1) == 2.0
    assert RetryPolicy(w.attempts, w.base_delay_seconds, w.max_delay_seconds, True).backoff(1, lambda: 1) == 5.0
