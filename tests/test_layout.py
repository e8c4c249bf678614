"""The package's structure: no import cycle inside specbench at import time, no module reaching into another
module's private (underscore) names, `run` independent of `tune`, and modules that stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "specbench"
MAX_LINES = 450  # "under ~400 lines", with a little slack


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: not inside functions, classes or `if TYPE_CHECKING:`."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not is_type_checking(node):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body]
    return found


def imported_modules(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """specbench modules an import statement runs: the module itself, a submodule named in `from x import y`,
    and, across packages, the __init__ of every package on the way."""
    if isinstance(node, ast.Import):
        targets = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".")[: len(name.split(".")) - node.level + (name in _packages())]
            base = ".".join(package + ([node.module] if node.module else []))
        targets = {base} | {f"{base}.{alias.name}" for alias in node.names}
    found = set()
    for target in targets:
        if target not in MODULES or name.startswith(target + "."):  # its own package: already being imported
            continue
        found.add(target)
        parts = target.split(".")
        for i in range(2, len(parts)):
            package = ".".join(parts[:i])
            if not name.startswith(package + ".") and name != package:
                found.add(package)
    return found


def _packages() -> set[str]:
    return {name for name, path in MODULES.items() if path.name == "__init__.py"}


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        graph[name] = {t for node in top_level_imports(tree) for t in imported_modules(name, node)} - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_inside_specbench():
    assert find_cycle(import_graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("package", ["specbench.sweep", "specbench.scaleout", "specbench.backends"])
def test_run_and_scale_out_do_not_import_tune_or_report(package):
    graph = import_graph()
    modules = [name for name in MODULES if name == package or name.startswith(package + ".")]
    leaked = {m: sorted(t for t in reachable(graph, m) if t.startswith(("specbench.tune", "specbench.report")))
              for m in modules}
    assert not {m: t for m, t in leaked.items() if t}


def private_uses(name: str, tree: ast.Module) -> list[str]:
    """`from specbench.x import _y` and `module._y` where `module` is a specbench module bound by an import."""
    uses, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specbench"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in MODULES:
                    aliases[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    uses.append(f"{name}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            uses.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    return uses


def test_no_module_uses_another_modules_private_names():
    uses = [use for name, path in MODULES.items() for use in private_uses(name, ast.parse(path.read_text()))]
    assert uses == []


def test_the_private_name_check_sees_both_forms():
    tree = ast.parse("from specbench.core.results import _metrics\nfrom specbench.core import results\nresults._alpha(1)\n")
    assert private_uses("x", tree) == ["x: from specbench.core.results import _metrics", "x: specbench.core.results._alpha"]


def test_modules_stay_small():
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
