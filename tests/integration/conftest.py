"""Fixtures integration tests take by name without importing them."""

from tests.api_support import api  # noqa: F401  (the API on a fresh queue, with a stand-in runner)
