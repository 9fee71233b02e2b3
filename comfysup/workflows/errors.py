"""The refusal of a workflow that cannot be read: every problem found, each naming the node it is about."""

from __future__ import annotations

from collections.abc import Sequence


class UIWorkflowError(ValueError):
    """A workflow that cannot be converted or addressed; ``problems`` holds one sentence per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))
