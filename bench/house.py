"""bench/house.py: the figures of the house rules for a tree (docs/architecture.md, "House rules"), so a change
can show them before and after.

    .venv/bin/python bench/house.py              # this checkout
    .venv/bin/python bench/house.py --root DIR   # another checkout (e.g. a git worktree of an older commit)

Prints, for comfysup: how many functions and methods (closures included) have a cyclomatic complexity over
10, 15 and 20 as radon counts it, the mean, and the largest modules by code tokens (the counts of
tests/unit/test_architecture.py, which this imports so that both measure alike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
from test_architecture import code_tokens, complexities


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--largest", type=int, default=8, help="how many of the largest modules to list")
    args = parser.parse_args()
    files = sorted((args.root / "comfysup").rglob("*.py"))
    counts = [n for p in files for _name, n in complexities(p.read_text(encoding="utf-8"))]
    print(f"functions {len(counts)}, mean complexity {statistics.mean(counts):.2f}, "
          + ", ".join(f"over {limit}: {sum(n > limit for n in counts)}" for limit in (10, 15, 20)))
    sizes = sorted(((code_tokens(p.read_text(encoding="utf-8")), p.relative_to(args.root)) for p in files),
                   reverse=True)
    print(f"modules {len(sizes)}, median {statistics.median(n for n, _ in sizes):.0f} code tokens; largest:")
    for n, path in sizes[:args.largest]:
        print(f"  {n:6,}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
