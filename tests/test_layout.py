"""The package's structure: one package per feature in layers that import only downward, no import cycle at import
time, no module reaching into another module's private (underscore) names, light `__init__`s, rich only in the
terminal output, no torch where a result is read or a profile checked, and modules that stay small."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "specbench"
FIXTURES = Path(__file__).parent / "fixtures"
MAX_LINES = 450  # "under ~400 lines", with a little slack

# The feature packages from the bottom up: a package imports only packages on lower lines (a type named in an
# annotation under `if TYPE_CHECKING:` is no import). Packages on one line do not import each other.
LAYERS = (
    ("core",),  # results, traces, statistics, summaries, predictions, cost, errors: no torch
    ("models", "engines", "capacity"),  # model references and loading; serving engines' flags; the capacity search
    ("workloads",),  # prompt sets, datasets, what is sent
    ("profile",),  # the profile schema, one module per TOML table
    ("decoding",),  # speculative decoding in this process
    ("heads",),  # EAGLE-3 heads distilled here
    ("backends",),  # how a point runs: native, hf, server
    ("scaleout",),  # processes sharing a run or tune through an Optuna storage
    ("sweep",),  # `specbench run`
    ("tune",),  # `specbench tune`
    ("report",),  # `specbench report`
    ("ui",),  # live progress and end-of-command summaries
    ("cli",),  # one module per command
)
LEVEL = {package: level for level, packages in enumerate(LAYERS) for package in packages}
HEAVY = ("torch", "transformers")
# what may be imported with no torch: the core, the profile, `specbench report` and `specbench --help`
TORCH_FREE = ("specbench.core", "specbench.profile", "specbench.report", "specbench.ui.run", "specbench.ui.tune",
              "specbench.cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_in(tree: ast.Module, *, top_level_only: bool,
               type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run: at import time only (not inside functions or classes), or anywhere; those under
    `if TYPE_CHECKING:` only with `type_checking` (what a reader or a type checker follows)."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and is_type_checking(node):
            todo += node.orelse + (node.body if type_checking else [])
        elif top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        elif top_level_only and not isinstance(node, (ast.If, ast.Try, ast.ExceptHandler)):
            continue
        else:
            todo += list(ast.iter_child_nodes(node))
    return found


def imported_modules(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """specbench modules an import statement runs: the module itself, a submodule named in `from x import y`,
    and, across packages, the __init__ of every package on the way."""
    if isinstance(node, ast.Import):
        targets = {alias.name for alias in node.names}
    else:
        base = node.module or ""
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


def import_graph(*, top_level_only: bool = True, type_checking: bool = False) -> dict[str, set[str]]:
    return {name: {t for node in imports_in(tree, top_level_only=top_level_only, type_checking=type_checking)
                   for t in imported_modules(name, node)} - {name}
            for name, tree in TREES.items()}


def third_party(tree: ast.Module) -> set[str]:
    """Top-level names of the non-specbench packages a module imports at import time."""
    names = set()
    for node in imports_in(tree, top_level_only=True):
        modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        names |= {module.split(".")[0] for module in modules if not module.startswith("specbench") and module}
    return names


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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def feature(name: str) -> str | None:
    """The feature package a module belongs to (None for the root package)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of a package on the same level or above."""
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if feature(name) and feature(target) and feature(name) != feature(target)
                  and LEVEL[feature(target)] >= LEVEL[feature(name)])


def test_every_package_has_a_layer():
    packages = {feature(name) for name, path in MODULES.items() if path.name == "__init__.py"} - {None}
    assert packages == set(LEVEL)
    assert {feature(name) for name in MODULES} - {None} == set(LEVEL)  # no flat module beside the packages


def test_imports_go_only_downward_between_feature_packages():
    assert upward_imports(import_graph(top_level_only=False)) == []


def test_the_layer_check_sees_an_upward_and_a_sideways_import():
    graph = {"specbench.core.results": {"specbench.sweep.loop"}, "specbench.models.load": {"specbench.engines"},
             "specbench.sweep.loop": {"specbench.core.results", "specbench.sweep.files"}}
    assert upward_imports(graph) == ["specbench.core.results -> specbench.sweep.loop",
                                     "specbench.models.load -> specbench.engines"]


def test_no_import_cycle_inside_specbench():
    assert find_cycle(import_graph()) is None


def test_no_import_cycle_even_through_the_imports_only_a_type_checker_follows():
    """A cycle hidden under `if TYPE_CHECKING:` still ties two modules together for a reader (sweep/files.py and
    loop.py once did, and the server backend and its measurement)."""
    assert find_cycle(import_graph(type_checking=True)) is None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", ["specbench.sweep", "specbench.scaleout", "specbench.backends"])
def test_run_and_scale_out_do_not_import_tune_or_report(package):
    graph = import_graph()
    modules = [name for name in MODULES if name == package or name.startswith(package + ".")]
    leaked = {m: sorted(t for t in reachable(graph, m) if t.startswith(("specbench.tune", "specbench.report")))
              for m in modules}
    assert not {m: t for m, t in leaked.items() if t}


def heavy_at_import(name: str, graph: dict[str, set[str]]) -> list[str]:
    """The modules importing `name` loads (itself included) that import torch or transformers at import time."""
    return sorted(m for m in reachable(graph, name) | {name} if third_party(TREES[m]) & set(HEAVY))


def test_the_core_profile_report_and_cli_import_no_torch():
    graph = import_graph()
    roots = [name for name in MODULES if name.startswith(TORCH_FREE)]
    assert {root: heavy_at_import(root, graph) for root in roots if heavy_at_import(root, graph)} == {}


def test_every_package_init_is_light():
    """An __init__ imports nothing heavy (torch, transformers, Optuna), directly or through what it imports."""
    graph = import_graph()
    inits = [name for name, path in MODULES.items() if path.name == "__init__.py"]
    heavy = {name: sorted(m for m in reachable(graph, name) | {name} if third_party(TREES[m]) & {*HEAVY, "optuna"})
             for name in inits}
    assert {name: found for name, found in heavy.items() if found} == {}


def test_rich_is_imported_only_by_the_terminal_output():
    importers = sorted(name for name, tree in TREES.items() if "rich" in {
        (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
        for node in imports_in(tree, top_level_only=False) for alias in node.names})
    assert [name for name in importers if not name.startswith(("specbench.ui.", "specbench.report.terminal"))] == []


CHECK = """
import contextlib, io, json, sys
from typer.testing import CliRunner
from specbench.cli import app
from specbench.profile import load_profile
runner = CliRunner()
results = [runner.invoke(app, ["--help"]).exit_code]
results += [runner.invoke(app, [command, "--help"]).exit_code for command in ("run", "tune", "report", "models")]
for path in sys.argv[2:]:
    load_profile(path)
results.append(runner.invoke(app, ["report", sys.argv[1]]).exit_code)
results.append(runner.invoke(app, ["report", sys.argv[1], "--format", "md"]).exit_code)
print(json.dumps({"exit_codes": results, "loaded": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_help_profile_validation_and_a_report_load_no_torch():
    """Measured in a fresh process: `specbench --help` and each command's, every shipped profile validated, and
    `specbench report` of the quickstart's results in the terminal and as Markdown leave no torch in sys.modules."""
    profiles = sorted(str(path) for path in (ROOT.parent / "profiles").glob("*.toml"))
    result = subprocess.run([sys.executable, "-c", CHECK, str(FIXTURES / "quickstart"), *profiles],
                            capture_output=True, text=True, timeout=300, cwd=ROOT.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"exit_codes": [0] * 7, "loaded": []}


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
    uses = [use for name, tree in TREES.items() for use in private_uses(name, tree)]
    assert uses == []


def test_the_private_name_check_sees_both_forms():
    tree = ast.parse("from specbench.core.results import _metrics\nfrom specbench.core import results\n"
                     "results._alpha(1)\n")
    assert private_uses("x", tree) == ["x: from specbench.core.results import _metrics",
                                       "x: specbench.core.results._alpha"]


def test_modules_stay_small():
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
