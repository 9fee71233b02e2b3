"""The seed of a chaos run and the log of the faults it injected.

Every scenario draws its fault schedule (which process, when, how long) from one ``random.Random``
seeded per scenario from the run's seed. The seed is printed at the start, so a failure can be replayed
with ``CHAOS_SEED=<seed>``: the same faults in the same order (the system's own timing still varies,
which is the point of running many).

The fault log is the checker's evidence: a re-execution of a job is only acceptable when a recorded
fault destroyed the run before it (docs/design.md, promise 4), so each fault is written down with the time
it happened and the pids it killed, before the checker ever looks.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED_VARIABLE = "CHAOS_SEED"


def run_seed() -> int:
    """``$CHAOS_SEED`` when set (a replay), else a fresh one; printed so that every run can be replayed."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    seed = int(text) if text else random.SystemRandom().randrange(2**32)
    print(f"chaos seed {seed} (replay with {SEED_VARIABLE}={seed})")
    return seed


def scenario_rng(seed: int, scenario: str) -> random.Random:
    """A generator per scenario, so that one row's schedule does not depend on which rows ran before."""
    return random.Random(f"{seed}/{scenario}")


@dataclass(frozen=True)
class Fault:
    """One injected fault: what, when (UTC epoch seconds, taken just after it was done), which pids died
    of it (for matching executions cut short), and anything else the scenario wants to show."""

    kind: str
    at: float
    pids: tuple[int, ...] = ()
    until: float | None = None
    """For a fault that lasts (a database lock): when it ended."""
    job: str | None = None
    detail: dict[str, Any] | None = None


class FaultLog:
    """An append-only JSON-lines file of faults; ``faults()`` reads it back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def record(self, kind: str, *, pids: tuple[int, ...] | list[int] = (), at: float | None = None,
               until: float | None = None, job: str | None = None, **detail: Any) -> Fault:
        fault = Fault(kind=kind, at=time.time() if at is None else at, pids=tuple(pids), until=until, job=job,
                      detail=detail or None)
        with open(self.path, "a") as f:
            f.write(json.dumps(fault.__dict__) + "\n")
        return fault

    def faults(self) -> list[Fault]:
        out = []
        for line in self.path.read_text().splitlines():
            raw = json.loads(line)
            raw["pids"] = tuple(raw.get("pids") or ())
            out.append(Fault(**raw))
        return out
