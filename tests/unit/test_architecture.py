"""The house's rules (docs/architecture.md, issue 29), checked on the source itself.

- No import cycle in ``comfysup`` or ``fake_comfy``, counting imports inside functions too (grimp's graph, the
  one ``lint-imports`` builds): a cycle means two modules cannot be read, tested or moved apart. An import
  under ``if TYPE_CHECKING`` (an annotation naming the class of an argument) never runs, and is not counted.
- No module over 450 lines: past that, a module holds more than one thing.
- No class in the runner that inherits from two classes of the project: an attempt is composed of steps with
  explicit inputs and results, not of mixins that share ``self``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("comfysup", "fake_comfy")
MAX_LINES = 450


def cycles(package: str) -> list[list[str]]:
    """Every strongly connected set of more than one module in ``package``'s import graph (Tarjan)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules) + 100))
    try:
        for m in modules:
            if m not in index:
                visit(m)
    finally:
        sys.setrecursionlimit(limit)
    return found


@pytest.mark.timeout(120)
@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    assert cycles(package) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    """The check above can fail: two modules that import each other are one cycle."""
    pkg = tmp_path / "circle_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle_pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from circle_pkg import a\n")  # inside a function: counted
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circle_pkg import e\n")
    (pkg / "e.py").write_text("from circle_pkg import d\n")  # d's import of e is for annotations only
    (pkg / "c.py").write_text("from circle_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles("circle_pkg") == [["circle_pkg.a", "circle_pkg.b"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_450_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / package).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def project_classes() -> dict[str, ast.ClassDef]:
    """Every class defined in comfysup, by its bare name (the bases in the runner are written by bare name)."""
    classes = {}
    for path in (ROOT / "comfysup").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    return classes


def test_no_runner_class_inherits_from_two_project_classes():
    ours = project_classes()
    mixed = {}
    for path in sorted((ROOT / "comfysup" / "runner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, ast.Name | ast.Attribute)]
                if len([b for b in bases if b in ours]) >= 2:
                    mixed[f"{path.name}:{node.name}"] = bases
    assert mixed == {}
