"""The package's public surface and import-time behaviour."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fxrewrite

PUBLIC = [
    "Accept",
    "ArgumentError",
    "DidNotConverge",
    "Explanation",
    "Finding",
    "FxRewriteError",
    "Match",
    "MetadataError",
    "NotEquivalent",
    "Refuse",
    "Report",
    "RewriteError",
    "RewriteResult",
    "Rule",
    "RuleDefinitionError",
    "RuleLoadError",
    "RuleSet",
    "RuleStats",
    "RuleSyntaxError",
    "RuleWarning",
    "TargetError",
    "TensorView",
    "__version__",
    "analyze",
    "backend",
    "explain",
    "find_matches",
    "inductor_pass",
    "load_rules",
    "parse_rules",
    "replace_pattern",
    "replace_pattern_with_filters",
    "rewrite",
    "rule",
]


def test_public_names_are_pinned_and_sorted():
    assert fxrewrite.__all__ == sorted(fxrewrite.__all__)
    assert fxrewrite.__all__ == PUBLIC
    for name in fxrewrite.__all__:
        assert hasattr(fxrewrite, name), name


def test_importing_fxrewrite_does_not_import_pytest_or_hypothesis():
    code = "import sys, fxrewrite; print(sorted(m for m in ('pytest', 'hypothesis') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_is_typed():
    assert (Path(fxrewrite.__file__).parent / "py.typed").exists()


# -- the house: an acyclic import graph, short classes and functions ---------------------------------

PACKAGE = Path(fxrewrite.__file__).parent

#: Longer than the house allows, each with the sentence saying why (issue 22: none over 200 lines
#: per class or 60 per function without one).
LONG_ON_PURPOSE: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("fxrewrite", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at the top or inside a function (a local import is a
    dependency too: it only hides the cycle from Python)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                found |= {m for m in (f"{module}.{alias.name}", module) if m in modules}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
    found.discard(name)
    # a module imports its parent packages on the way (Python runs their __init__): not an edge
    return {m for m in found if not name.startswith(m + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_class_over_200_lines_or_function_over_60_without_a_reason():
    long = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = 200 if isinstance(node, ast.ClassDef) else 60
                size = node.end_lineno - node.lineno + 1
                if size > limit and f"{name}.{node.name}" not in LONG_ON_PURPOSE:
                    long[f"{name}.{node.name}"] = size
    assert long == {}
