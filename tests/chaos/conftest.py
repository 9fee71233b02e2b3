"""The chaos suite's seed: one per test session, printed, replayable with ``CHAOS_SEED``."""

from __future__ import annotations

import pytest

from chaos.faults import run_seed


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    return run_seed()
