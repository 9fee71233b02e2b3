"""The house's rules (docs/architecture.md, "House rules"), checked on the source itself.

Each rule stands for something a reader needs; none of them may be met by layout (rewrapping lines, walrus
tricks, moving imports), so each one measures what layout cannot change.

- No import cycle in ``comfysup`` or ``fake_comfy``, counting imports inside functions too (grimp's graph, the
  one ``lint-imports`` builds): a cycle means two modules cannot be read, tested or moved apart. An import
  under ``if TYPE_CHECKING`` (an annotation naming the class of an argument) never runs, and is not counted.
- No function or method (closures included) whose cyclomatic complexity, as radon counts it, is over 15: past
  that, one function makes more decisions than a reader holds at once, and its tests cannot cover its paths.
- No module over 3,000 code tokens: what the module makes Python read, docstrings, comments and layout not
  counted, so neither a long docstring nor a rewrapped line changes the figure.
- No class with two or more comfysup base classes: a class is composed of parts with explicit inputs, not of
  mixins that share ``self``. A Protocol that joins other Protocols carries no code, and is allowed.
- No module-level ``__getattr__``: a name is imported where it is used, not conjured on first touch.
- No import inside a function, except of an optional dependency (an extra that a machine may lack) or for a
  reason named in ``DEFERRED``: an import moved into a function only to save start-up time hides a module's
  dependencies from its reader and from the layers' check.
- Every dotted name of comfysup (a module, a class, a function) and every repository path cited in prose
  (docstrings, comments, docs/*.md and the README) resolves: a citation that points nowhere is worse than none.
- No issue numbers in code or SQL: code says what it promises; the history says why it changed.
"""

from __future__ import annotations

import ast
import functools
import importlib
import io
import re
import sys
import tokenize
from pathlib import Path

import grimp
import pytest
from radon.visitors import ComplexityVisitor, Function

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("comfysup", "fake_comfy")
MAX_COMPLEXITY = 15
# Measured on the anchors (procrastinate, gunicorn, huey): a module that holds one job sits at 2,600-2,700
# code tokens there (procrastinate's cli.py, huey's consumer.py, gunicorn's util.py); their largest cores,
# procrastinate's worker.py (3,421) and gunicorn's arbiter.py (4,395), are the files people find hard to read
# in one sitting. 3,000 keeps a module to one job with room for its edge cases.
MAX_CODE_TOKENS = 3_000
# Extras (pyproject.toml's optional-dependencies) that a machine may lack: imported where they are needed.
OPTIONAL = {"psycopg", "pika", "boto3", "botocore", "selenium",
            # a dependency that the code runs without: GPU code paths work, and say so, where NVML is absent
            "pynvml"}
# Imports inside functions that are not of an optional dependency, each with why it waits for its call.
_PIKA = "the broker's modules import pika, an extra: only a machine that names [rabbitmq] url needs it"
_PSYCOPG = "the PostgreSQL backend imports psycopg, an extra: only a queue at a postgresql:// URL needs it"
_NO_HTTP = ("an HTTP library is loaded by the one process that sends: comfysup work, the supervisor and their "
            "forked runners hold none (about 4 MB each)")
DEFERRED: dict[tuple[str, str], str] = {
    ("comfysup/commands/consume.py", "comfysup.broker.consumer"): _PIKA,
    ("comfysup/commands/run.py", "comfysup.broker.consumer"): _PIKA,
    ("comfysup/commands/submit.py", "comfysup.broker"): _PIKA,
    ("comfysup/commands/migrate.py", "comfysup.queue.postgres"): _PSYCOPG,
    ("comfysup/queue/__init__.py", "comfysup.queue.postgres"): _PSYCOPG,
    ("comfysup/comfy/http.py", "urllib3"): "its multipart encoder, for a job that brings an input file; " + _NO_HTTP,
    ("comfysup/comfy/probe.py", "requests"): _NO_HTTP,
    ("comfysup/observability/webhooks.py", "requests"): _NO_HTTP,
    ("comfysup/observability/webhooks.py", "comfysup.safehttp"): _NO_HTTP,
    ("comfysup/commands/run.py", "comfysup.models.pull"): "the model downloads (urllib3), for a supervisor with a "
                                                          "manifest; " + _NO_HTTP,
    # Start-up kept by these alone: each library costs a start-up-bound command (submit, status: within 0.1 s of
    # a bare Python, bench/startup.py) more than its whole budget, and serves one rare path of it.
    ("comfysup/jobs/inputs.py", "comfysup.jobs.fetch"): "requests and urllib3 (about 80 ms), for an input by URL "
                                                        "or from a bucket only",
    ("comfysup/commands/submit.py", "tqdm"): "about 45 ms, for the bars of --wait and of a download only",
    ("comfysup/jobs/readahead.py", "multiprocessing"): "about 12 ms, for a file of READ_AHEAD_LINES or more only",
    ("comfysup/queue/sqlite_file.py", "psutil"): "about 28 ms, for a machine without /proc/self/mounts only",
}

_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
           tokenize.ENCODING}
_ISSUE = re.compile(r"\b[Ii]ssues? #?\d{1,3}\b")
_DOTTED = re.compile(r"(?<![\w./-])comfysup(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"(?<![\w./-])((?:comfysup|fake_comfy|tests|bench|docs|\.ci)/[\w./*-]*[\w*])")


def sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def docstrings(tree: ast.AST) -> list[ast.Constant]:
    """The docstring nodes of a module, its classes and its functions."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append(first.value)
    return found


def code_tokens(source: str) -> int:
    """How many tokens Python reads in ``source``, docstrings, comments and layout not counted."""
    starts = {(d.lineno, d.col_offset) for d in docstrings(ast.parse(source))}
    return sum(1 for t in tokenize.generate_tokens(io.StringIO(source).readline)
               if t.type not in _LAYOUT and not (t.type == tokenize.STRING and t.start in starts))


@functools.cache
def prose(path: Path) -> str:
    """What a person reads in ``path``: a Markdown file whole; of Python, its comments and docstrings."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return "\n".join(parts + [d.value for d in docstrings(ast.parse(text))])


def complexities(source: str):
    """(qualified name, complexity) of every function, method and closure in ``source``, as radon counts them."""
    visitor = ComplexityVisitor.from_code(source)
    yield from _complexities(visitor.functions, "")
    for cls in visitor.classes:
        yield from _complexities(cls.methods, f"{cls.name}.")
        for inner in cls.inner_classes:
            yield from _complexities(inner.methods, f"{cls.name}.{inner.name}.")


def _complexities(functions: list[Function], prefix: str):
    for function in functions:
        name = f"{prefix}{function.name}"
        yield name, function.complexity
        yield from _complexities(function.closures, name + ".")


def resolves(dotted: str) -> bool:
    """Whether a dotted name names a module, or an attribute reached from its longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_over_the_complexity_limit(package):
    over = {f"{rel(p)}:{name}": n for p in sources(package)
            for name, n in complexities(p.read_text(encoding="utf-8")) if n > MAX_COMPLEXITY}
    assert over == {}


def test_complexity_counts_closures_and_methods():
    """The count above can fail, and sees a closure inside a method."""
    branches = "".join(f"            if x == {i}:\n                return {i}\n" for i in range(16))
    source = ("class A:\n    def m(self, x):\n        def inner(x):\n"
              f"{branches}            return 0\n        return inner(x)\n")
    found = dict(complexities(source))
    assert found["A.m.inner"] > MAX_COMPLEXITY


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_the_code_token_budget(package):
    counts = {rel(p): code_tokens(p.read_text(encoding="utf-8")) for p in sources(package)}
    assert {path: n for path, n in counts.items() if n > MAX_CODE_TOKENS} == {}


def test_code_tokens_leave_out_docstrings_comments_and_layout():
    plain = "def f(a, b):\n    return a + b\n"
    dressed = ('def f(\n    a,  # one\n    b\n):\n    """Adds.\n\n    At length.\n    """\n'
               "    return (a\n            + b)\n")
    assert code_tokens(dressed) == code_tokens(plain) + 2  # the two parentheses around a + b are code


def test_no_class_with_two_project_bases():
    classes: dict[str, ast.ClassDef] = {}
    for path in sources("comfysup"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    mixed = {}
    for path in sources("comfysup"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                     if isinstance(b, ast.Name | ast.Attribute)]
            if "Protocol" not in bases and len([b for b in bases if b in classes]) >= 2:
                mixed[f"{rel(path)}:{node.name}"] = bases
    assert mixed == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_level_getattr(package):
    found = [rel(p) for p in sources(package) for node in ast.parse(p.read_text(encoding="utf-8")).body
             if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    assert found == []


def deferred_imports(path: Path) -> list[tuple[str, str]]:
    """(path, module) for each import statement inside a function of ``path``."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found += [(rel(path), alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.append((rel(path), node.module))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_inside_functions_are_optional_or_explained(package):
    unexplained = sorted({(where, module) for p in sources(package) for where, module in deferred_imports(p)
                          if module.split(".")[0] not in OPTIONAL and (where, module) not in DEFERRED})
    assert unexplained == []


def test_every_deferred_import_is_still_there():
    """An explanation outlives its import only as a stale excuse for the next one."""
    present = {found for p in sources(*PACKAGES) for found in deferred_imports(p)}
    assert sorted(set(DEFERRED) - present) == []


def test_the_import_and_citation_checks_can_fail(tmp_path, monkeypatch):
    """An import inside a function is found, whatever its depth; a dotted name resolves through attributes, and
    one that names nothing does not."""
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    if os:\n        import json\n        from uuid import uuid4\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert deferred_imports(module) == [("m.py", "json"), ("m.py", "uuid")]
    assert resolves("comfysup.queue.roles.Leases.claim")
    assert not resolves("comfysup.queue.roles.Leases.no_such_method")
    assert not resolves("comfysup.no_such_module")


def prose_files() -> list[Path]:
    return sources(*PACKAGES, "tests", "bench") + sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def test_every_cited_name_resolves():
    missing = sorted({f"{rel(p)}: {name}" for p in prose_files() for name in _DOTTED.findall(prose(p))
                      if not resolves(name.rstrip("."))})
    assert missing == []


def test_every_cited_path_exists():
    missing = sorted({f"{rel(p)}: {cited}" for p in prose_files() for cited in _PATH.findall(prose(p))
                      if "*" not in cited and not (ROOT / cited.rstrip(".")).exists()})
    assert missing == []


def test_the_design_is_cited_where_it_is():
    """The design document lives in the docs folder; a citation of its bare file name points nowhere."""
    bare = sorted({rel(p) for p in prose_files() if re.search(r"(?<!docs/)DESIGN\.md", prose(p))})
    assert bare == []


def test_no_issue_numbers_in_code_or_sql():
    files = sources(*PACKAGES, "tests", "bench") + sorted(ROOT.glob("comfysup/**/*.sql"))
    cited = [f"{rel(p)}:{n}" for p in files for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if _ISSUE.search(line)]
    assert cited == []
