"""No import cycle among first-party modules.

The graph is read from the source with the stdlib's ``ast`` (nothing is imported): each file
under a folder of ``[tool.setuptools] package-dir`` in pyproject.toml is the module that mapping
names (``launcher/plan.py`` is ``resilient_slurm.launcher.plan``), and ``bench/*.py`` are the
top-level modules the benchmark scripts import each other as (``from render import ...``).

Counted: every ``import`` / ``from ... import`` anywhere in a file, function-level ones
included (a local import that closes a loop is still a loop a reader follows; only its timing
differs). Not counted: imports under ``if TYPE_CHECKING:`` (never run) and the implicit import of
a module's parent packages. ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

# Cycles allowed for now, each by its exact set of modules, so a new cycle there still fails
# and a removed one is noticed (test_allowed_cycles_still_exist). Keep it empty.
ALLOWED: list[frozenset[str]] = []  # every cycle is gone (issue 27 item 4)


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every first-party ``.py`` file (package-dir mapping + bench/)."""
    with open(root / "pyproject.toml", "rb") as fh:
        mapping: dict[str, str] = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, folder in mapping.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("").parts
            if rel and rel[-1] == "__init__":
                rel = rel[:-1]
            name = ".".join((package, *rel))
            # a nested folder that is itself mapped (none today) belongs to its own package
            if not any(other != package and name.startswith(other + ".")
                       and other.startswith(package + ".") for other in mapping):
                found[name] = path
    for path in sorted((root / "bench").glob("*.py")):
        found[path.stem] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except in ``if TYPE_CHECKING:`` bodies."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The first-party modules ``name`` (at ``path``) imports."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        for target in targets:
            while target and target not in modules:  # ``import a.b.c`` when c is a name
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: edges(name, path, modules) for name, path in modules.items()}


def cycles(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_no_import_cycles() -> None:
    unexpected = [sorted(c) for c in cycles(graph()) if c not in ALLOWED]
    assert unexpected == []


def test_allowed_cycles_still_exist() -> None:
    """An allow-list entry whose cycle is gone is deleted, so the list only shrinks."""
    assert [sorted(c) for c in ALLOWED if c not in cycles(graph())] == []


def test_the_graph_sees_each_spelling(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "pkg" = "core", "pkg.sub" = "sub" }\n')
    (tmp_path / "core").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "a.py").write_text("from pkg.sub import b\n")
    (tmp_path / "sub" / "__init__.py").write_text("from . import b\n")
    (tmp_path / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
        "def f():\n    from ..sub import c\n")
    (tmp_path / "sub" / "c.py").write_text("import pkg.a.name\n")
    (tmp_path / "bench" / "x.py").write_text("def f():\n    from y import z\n")
    (tmp_path / "bench" / "y.py").write_text("import x\n")
    g = graph(tmp_path)
    assert g["pkg.a"] == {"pkg.sub.b"}
    assert g["pkg.sub"] == {"pkg.sub.b"}
    assert g["pkg.sub.b"] == {"pkg.sub.c"}  # the TYPE_CHECKING import is not an edge
    assert g["pkg.sub.c"] == {"pkg.a"}
    assert sorted(map(sorted, cycles(g))) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"], ["x", "y"]]
