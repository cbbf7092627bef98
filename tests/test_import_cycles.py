"""No import cycle among first-party modules, and the layer table of docs/architecture.md is
the import graph between folders.

The graph is read from the source with the stdlib's ``ast`` (nothing is imported): each file
under a folder of ``[tool.setuptools] package-dir`` in pyproject.toml is the module that mapping
names (``launcher/cycle/plan.py`` is ``resilient_slurm.launcher.cycle.plan``), and ``bench/*.py``
are the top-level modules the benchmark scripts import each other as (``from render import ...``).

Counted: every ``import`` / ``from ... import`` anywhere in a file, function-level ones and
those under ``if TYPE_CHECKING:`` included (a local import that closes a loop is still a loop a
reader follows, and a type-only one still ties the two modules' meaning together; only the
timing differs). Not counted: dynamic ``importlib`` imports and the implicit import of a
module's parent packages. ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``.

The layer table ("The folders as layers"): each row's folders (the backquoted ``name/`` of its
second column) form a layer; its "imports" column names the layers its modules import
(``base`` for ``resilient_slurm/``, a folder's name for the others; the third-party names in
:data:`OUTSIDE` and parenthesised remarks are read past; "every layer" / "everything": no
constraint). The layers the graph shows a row's modules importing must be exactly those it
names, each in a row above it, and every module must fall in a row.
"""

from __future__ import annotations

import ast
import re
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


# The lab's import package (the distribution resilient-slurm-lab, lab/pyproject.toml): a plain
# folder, its modules named by their path (``lab/resilient_slurm_lab/sandbox/cli.py`` is
# ``resilient_slurm_lab.sandbox.cli``).
LAB_FOLDER = "lab/resilient_slurm_lab"
LAB = "resilient_slurm_lab"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every first-party ``.py`` file (package-dir mapping, the lab,
    bench/)."""
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
    lab = root / LAB_FOLDER
    for path in sorted(lab.rglob("*.py")):
        rel = path.relative_to(lab.parent).with_suffix("").parts
        found[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
    for path in sorted((root / "bench").glob("*.py")):
        found[path.stem] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (``if TYPE_CHECKING:`` bodies included)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


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


def lab_imports(g: dict[str, set[str]]) -> list[str]:
    """``product.module -> lab.module`` for every edge from the product into the lab."""
    return sorted(f"{name} -> {target}" for name, targets in g.items()
                  if name.split(".")[0] == "resilient_slurm"
                  for target in targets if target.split(".")[0] == LAB)


def test_no_product_module_imports_the_lab() -> None:
    """The product (the wheel resilient-slurm) works without the lab: none of its modules
    imports ``resilient_slurm_lab``, at any depth, type-only imports included."""
    g = graph()
    assert any(name.startswith(LAB + ".") for name in g), "the graph misses the lab"
    assert lab_imports(g) == []


def test_the_lab_check_sees_each_spelling(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "resilient_slurm" = "core" }\n')
    (tmp_path / "core").mkdir()
    (tmp_path / "bench").mkdir()
    lab = tmp_path / LAB_FOLDER
    (lab / "sub").mkdir(parents=True)
    (lab / "__init__.py").write_text("")
    (lab / "sub" / "__init__.py").write_text("")
    (lab / "sub" / "x.py").write_text("from resilient_slurm import a\n")  # lab -> product: fine
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from resilient_slurm_lab.sub import x\n")
    (tmp_path / "core" / "b.py").write_text("def f():\n    import resilient_slurm_lab.sub\n")
    g = graph(tmp_path)
    assert g[f"{LAB}.sub.x"] == {"resilient_slurm.a"}
    assert lab_imports(g) == [f"resilient_slurm.a -> {LAB}.sub.x",
                              f"resilient_slurm.b -> {LAB}.sub"]


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
        "def f():\n    from ..sub import c\n")
    (tmp_path / "sub" / "c.py").write_text("import pkg.a.name\n")
    (tmp_path / "sub" / "d.py").write_text(  # a type-only import: an edge, and here a cycle
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import e\n")
    (tmp_path / "sub" / "e.py").write_text("from . import d\n")
    (tmp_path / "bench" / "x.py").write_text("def f():\n    from y import z\n")
    (tmp_path / "bench" / "y.py").write_text("import x\n")
    g = graph(tmp_path)
    assert g["pkg.a"] == {"pkg.sub.b"}
    assert g["pkg.sub"] == {"pkg.sub.b"}
    assert g["pkg.sub.b"] == {"pkg.sub.c"}
    assert g["pkg.sub.c"] == {"pkg.a"}
    assert g["pkg.sub.d"] == {"pkg.sub.e"}  # under `if TYPE_CHECKING:`
    assert sorted(map(sorted, cycles(g))) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"],
                                              ["pkg.sub.d", "pkg.sub.e"], ["x", "y"]]


# --- the layer table --------------------------------------------------------------------------

# What an "imports" cell may name besides the layers: outside the repository, not checked.
OUTSIDE = frozenset({"the standard library", "click", "torch", "NVRx"})
UNCONSTRAINED = frozenset({"every layer", "everything"})
# A layer's imports of a layer below it, allowed by (row, name in its "imports" cell); the
# table's introduction says why. Each must still be needed (the list only shrinks).
UPWARD = frozenset({("base", "healthcheck")})  # HealthConfig, the type of Config.health


def layer_table(text: str) -> list[tuple[str, list[str], set[str] | None]]:
    """(layer, its folders, the layers it names as imported; None: unconstrained), per row of
    the table under "## The folders as layers", in order. A name is ``base`` or a folder's."""
    section = text.split("## The folders as layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines()
            if line.startswith("|")]
    out: list[tuple[str, list[str], set[str] | None]] = []
    for cells in rows[2:]:  # past the header and its rule
        layer, folders, imports = cells[0].strip(), cells[1], cells[-1]
        named = {n.strip() for n in re.sub(r"\([^)]*\)", "", imports).split(",")} - {""}
        out.append((layer, re.findall(r"`([\w/]+/)`", folders),
                    None if named & UNCONSTRAINED else named - OUTSIDE))
    return out


def _layer_of(path: Path, folders: dict[str, str], root: Path) -> str | None:
    """The layer whose folder holds ``path`` (the deepest such folder)."""
    rel = path.relative_to(root).as_posix()
    best = max((f for f in folders if rel.startswith(f)), key=len, default=None)
    return folders[best] if best else None


def layer_problems(root: Path = ROOT, doc: str = "docs/architecture.md",
                   upward: frozenset[tuple[str, str]] = UPWARD) -> list[str]:
    """Where the layer table and the import graph between its layers disagree."""
    table = layer_table((root / doc).read_text())
    folders = {f: layer for layer, fs, _ in table for f in fs}
    name_of = {f.rstrip("/"): layer for f, layer in folders.items()}
    name_of["base"] = folders.get("resilient_slurm/", "base")
    modules = module_files(root)
    g = {name: edges(name, path, modules) for name, path in modules.items()}
    problems: list[str] = []
    layer_of: dict[str, str] = {}
    for name, path in modules.items():
        found = _layer_of(path, folders, root)
        if found is None:
            problems.append(f"{path.relative_to(root)}: in no row of the layer table")
        else:
            layer_of[name] = found
    uses: dict[str, set[str]] = {layer: set() for layer, _, _ in table}
    for name, targets in g.items():
        for target in targets:
            if name in layer_of and target in layer_of and layer_of[name] != layer_of[target]:
                uses[layer_of[name]].add(layer_of[target])
    above: set[str] = set()
    for layer, _, named in table:
        if named is not None:
            unknown = sorted(n for n in named if n not in name_of)
            if unknown:
                problems.append(f"{layer}: imports names no layer: {unknown}")
            declared = {name_of[n] for n in named if n in name_of}
            if declared != uses[layer]:
                problems.append(f"{layer}: the table says it imports {sorted(declared)}, "
                                f"it imports {sorted(uses[layer])}")
            allowed = {name_of[n] for r, n in upward if r == layer and n in name_of}
            if declared - above - allowed:
                problems.append(f"{layer}: imports layers not above it in the table: "
                                f"{sorted(declared - above - allowed)}")
            if allowed - uses[layer]:
                problems.append(f"{layer}: no longer imports {sorted(allowed - uses[layer])}: "
                                "delete it from UPWARD")
        above.add(layer)
    return problems


def test_the_layer_table_is_the_import_graph() -> None:
    assert layer_problems() == []


def test_the_layer_table_check_sees_each_disagreement(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "pkg" = "pkg", "pkg.low" = "low", '
        '"pkg.high" = "high", "pkg.lost" = "lost" }\n')
    for folder in ("pkg", "low", "high", "lost", "bench"):
        (tmp_path / folder).mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "low" / "a.py").write_text("from pkg.high import b\n")  # upward
    (tmp_path / "high" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg\n")
    (tmp_path / "lost" / "c.py").write_text("")
    (tmp_path / "doc.md").write_text(
        "# A\n\n## The folders as layers\n\n| layer | folder | what | imports |\n"
        "|---|---|---|---|\n"
        "| base | `pkg/` (`pkg`) | x | the standard library |\n"
        "| low | `low/` | x | high |\n"
        "| high | `high/` | x | low (a remark, with a comma), torch, heigh |\n"
        "| outside | `bench/` | x | everything |\n\n## Next\n")
    assert sorted(layer_problems(tmp_path, "doc.md")) == [
        "high: imports names no layer: ['heigh']",
        "high: the table says it imports ['low'], it imports ['base']",  # TYPE_CHECKING counts
        "lost/c.py: in no row of the layer table",
        "low: imports layers not above it in the table: ['high']",
    ]
    allowed = layer_problems(tmp_path, "doc.md", upward=frozenset({("low", "high")}))
    assert not any(p.startswith("low: imports layers not above") for p in allowed)
    unused = layer_problems(tmp_path, "doc.md", upward=frozenset({("high", "low")}))
    assert "high: no longer imports ['low']: delete it from UPWARD" in unused
