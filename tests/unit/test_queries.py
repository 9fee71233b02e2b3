"""comfysup.queue.queries: each dialect's queries are inlined and translated when first asked for, so a fragment
that is missing or includes itself is found here, for every query, not when a command first runs that one."""

from __future__ import annotations

import pytest

from comfysup.queue.queries import Queries, load


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_every_query_of_a_dialect_expands_whole(dialect: str) -> None:
    queries = load(dialect)
    texts = dict(queries.items())  # each one inlined: a fragment missing (KeyError) or circular fails here
    assert len(texts) == len(queries) > 100
    assert ("= ANY(" in texts["known_ids"]) == (dialect == "postgres")


def test_a_fragment_that_includes_itself_is_refused_when_asked_for() -> None:
    queries = Queries("sqlite", {"a": "SELECT {b}\n", "b": "{a}\n", "c": "SELECT 1\n"})
    assert queries["c"] == "SELECT 1"
    with pytest.raises(ValueError, match="includes itself"):
        queries["a"]
