"""The development install lets tools see the code: every ``resilient_slurm.*`` module is a
plain file on ``sys.path`` (the strict editable link tree) that is the repository's own file.

The default editable mode maps the package through an import hook, which mypy and IDEs cannot
follow; ``scripts/setup.sh`` installs in strict mode instead. A link tree lists files, so a
module added since the last ``scripts/setup.sh`` is missing from it: this test names it.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from resilient_slurm.config import tomllib

REPO = Path(__file__).resolve().parents[1]


def _mapping() -> dict[str, str]:
    with open(REPO / "pyproject.toml", "rb") as fh:
        mapping: dict[str, str] = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    return mapping


def _find_on_sys_path(name: str) -> str | None:
    """Where ``name`` is, searching ``sys.path`` as static tools do (no import hooks)."""
    search: list[str] | None = None
    origin = None
    for part in name.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        origin = spec.origin
        search = list(spec.submodule_search_locations or [])
    return origin


def test_every_module_is_found_on_sys_path_as_its_repository_file() -> None:
    problems = []
    for package, folder in _mapping().items():
        for path in sorted((REPO / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            origin = _find_on_sys_path(name)
            if origin is None:
                problems.append(f"{name}: not on sys.path (run scripts/setup.sh)")
            elif os.path.realpath(origin) != str(path):
                problems.append(f"{name}: {origin} is not {path}")
    assert not problems, problems


def test_every_lab_module_is_found_on_sys_path_as_its_repository_file() -> None:
    """The lab (lab/, resilient-slurm-lab) is installed in strict mode too."""
    lab = REPO / "lab"
    problems = []
    for path in sorted((lab / "resilient_slurm_lab").rglob("*.py")):
        rel = path.relative_to(lab).with_suffix("").parts
        name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        origin = _find_on_sys_path(name)
        if origin is None:
            problems.append(f"{name}: not on sys.path (run scripts/setup.sh)")
        elif os.path.realpath(origin) != str(path):
            problems.append(f"{name}: {origin} is not {path}")
    assert problems == [] and len(list(lab.rglob("*.py"))) > 1, problems


def test_no_import_hook_finder_for_the_package() -> None:
    hooks = [f for f in sys.meta_path if "editable" in getattr(f, "__module__", "").lower()]
    assert not hooks, f"an editable import hook serves the package: {hooks}"


def test_mypy_resolves_first_party_imports() -> None:
    """No blanket ``ignore_missing_imports``: it would turn first-party imports into ``Any``."""
    with open(REPO / "pyproject.toml", "rb") as fh:
        mypy = tomllib.load(fh)["tool"]["mypy"]
    assert "ignore_missing_imports" not in mypy
    for override in mypy.get("overrides", []):
        if override.get("ignore_missing_imports"):
            modules = override["module"]
            assert not any(m.startswith("resilient_slurm") for m in modules), modules
