"""comfysup.runner.running.redactor_of: a claim's secrets are collected once, and only ever for that claim."""

from __future__ import annotations

from typing import Any

import pytest

from comfysup.queue.base import Claim
from comfysup.runner.running import redactor_of

pytestmark = pytest.mark.timeout(30)


def claim(key: str) -> Claim:
    workflow: dict[str, Any] = {"1": {"class_type": "Node", "inputs": {"text": "hello"}}}
    return Claim(id="job-1", attempt=1, owner="o", server="cpu0", workflow=workflow,
                 extra_data={"api_key_comfy_org": key}, lease_until=0.0)


def test_one_claim_is_walked_once_and_another_claim_of_the_same_id_gets_its_own_secrets() -> None:
    first = claim("alpha0123456789")
    assert redactor_of(first) is redactor_of(first)
    assert redactor_of(first)("it said alpha0123456789") == "it said ***"
    # The same id and attempt, other data (a test's job, or the same job read again): never the first's secrets.
    second = claim("zulu9876543210")
    assert redactor_of(second) is not redactor_of(first)
    assert redactor_of(second)("zulu9876543210 and alpha0123456789") == "*** and alpha0123456789"


def test_many_claims_do_not_grow_the_cache_without_bound() -> None:
    from comfysup.runner import running

    for n in range(100):
        redactor_of(claim(f"secret-number-{n:04d}"))
    assert len(running._REDACTORS) <= 8
