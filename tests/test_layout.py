"""Shared test helpers live in a conftest or a helper module (``helpers.py``,
``launch_helpers.py``, ``inprocess_harness.py``), never in a test module another one imports."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str) -> list[str]:
    """What ``source`` imports from a test module (``test_*``): the imported names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another() -> None:
    bad = {str(p.relative_to(TESTS)): found for p in sorted(TESTS.rglob("*.py"))
           if (found := imported_test_modules(p.read_text()))}
    assert bad == {}


def test_the_check_sees_each_spelling() -> None:
    assert imported_test_modules("from .test_hooks_cluster import submit\n") == [
        "test_hooks_cluster"]
    assert imported_test_modules("from . import test_scale\n") == [".test_scale"]
    assert imported_test_modules("import tests.launcher.test_scale as t\n") == [
        "tests.launcher.test_scale"]
    assert imported_test_modules("from .helpers import make_config\n") == []
    assert imported_test_modules("from .conftest import fault\n") == []


def test_an_import_path_is_found_by_reading_the_tree() -> None:
    """``resilient_slurm.a.b`` is ``a/b.py`` when ``a/`` is one of the product card's top-level
    folders, else ``resilient_slurm/a/b.py``: the package-dir mapping is exactly that rule, so a
    reader (or a static tool) needs no link tree to follow an import."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    root = TESTS.parent
    with open(root / "pyproject.toml", "rb") as fh:
        setuptools = tomllib.load(fh)["tool"]["setuptools"]
    for package, folder in setuptools["package-dir"].items():
        if package == "resilient_slurm":
            assert folder == "resilient_slurm"
        else:
            head, _, name = package.partition(".")
            assert head == "resilient_slurm" and "." not in name and folder == name, package
        assert (root / folder / "__init__.py").is_file(), folder
    for package in setuptools["packages"]:
        parts = package.split(".")
        top = parts[1] if len(parts) > 1 else ""
        where = (root / top / Path(*parts[2:])) if top in setuptools["package-dir"].values() \
            and top != "resilient_slurm" else root / Path(*parts)
        assert where.is_dir(), (package, where)
    assert not (root / "core").exists()
    # the mapped folders are reachable under the base package too: the symlinks
    for package, folder in setuptools["package-dir"].items():
        if package != "resilient_slurm":
            link = root / "resilient_slurm" / folder
            assert link.is_symlink() and os.readlink(link) == f"../{folder}", link
