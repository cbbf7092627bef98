"""Shared test helpers live in a conftest or a helper module (``helpers.py``,
``launch_helpers.py``, ``inprocess_harness.py``), never in a test module another one imports."""

from __future__ import annotations

import ast
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
