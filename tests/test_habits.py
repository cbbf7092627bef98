"""The habits run where the suite runs (issue 27 item 6): ``make test`` lints and type-checks
first, and the tests rely on mypy's test settings (pyproject.toml) rather than a
``type: ignore`` per unannotated test function."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# Still carried by a module the launcher branches change; stripped once they have merged.
NOT_YET: set[str] = set()  # every test module is stripped
IGNORE = "type: ignore" + "[no-untyped-def]"  # spelt in two so this file does not carry it


def prerequisites(makefile: str, target: str) -> list[str]:
    """The prerequisites of ``target`` in a Makefile's text (its rule line)."""
    match = re.search(rf"^{re.escape(target)}:([^\n=]*)$", makefile, re.MULTILINE)
    return match.group(1).split() if match else []


def test_make_test_lints_and_typechecks() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert {"lint", "typecheck"} <= set(prerequisites(makefile, "test"))
    assert "ruff check" in makefile and "mypy -p resilient_slurm\n" in makefile
    assert "mypy -p resilient_slurm_lab" in makefile  # the lab (lab/) too
    assert "mypy tests" in makefile  # the tests too, with their settings


def untyped_test_modules() -> list[str]:
    """The test modules pyproject.toml still lets mypy skip (``ignore_errors``)."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        overrides = tomllib.load(fh)["tool"]["mypy"].get("overrides", [])
    return sorted(m for o in overrides if o.get("ignore_errors") for m in o["module"])


@pytest.mark.integration  # mypy over the tests without the skip list: about a minute cold
def test_the_untyped_list_only_holds_modules_mypy_still_rejects(tmp_path: Path) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace("ignore_errors = true",
                                                          "ignore_errors = false"))
    res = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                          str(tmp_path / "pyproject.toml"), "tests"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    failing = {line.split(":")[0][:-3].replace("/", ".") for line in res.stdout.splitlines()
               if ": error:" in line}
    clean = [m for m in untyped_test_modules() if m not in failing]
    assert clean == [], f"typed now: delete from pyproject.toml's skip list: {clean}"


def test_prerequisites_reads_a_rule_line() -> None:
    text = "x = 1\ntest: setup lint typecheck\n\tpytest\ntest-unit: setup\n"
    assert prerequisites(text, "test") == ["setup", "lint", "typecheck"]
    assert prerequisites(text, "lint") == []


def test_tests_use_mypys_test_settings_not_ignores() -> None:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        overrides = tomllib.load(fh)["tool"]["mypy"].get("overrides", [])
    assert any("tests.*" in o.get("module", []) and o.get("disallow_untyped_defs") is False
               for o in overrides)
    carrying = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                      if IGNORE in p.read_text())
    assert [p for p in carrying if p not in NOT_YET] == []


MAX_LINES = 400  # the before-stop check: split a product module rather than grow it


def long_modules(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """Product modules (every ``.py`` under the folders ``package-dir`` maps, and the lab's,
    the benchmark's and the scripts' own) over ``limit`` lines, as ``path: lines``."""
    with open(root / "pyproject.toml", "rb") as fh:
        folders = set(tomllib.load(fh)["tool"]["setuptools"]["package-dir"].values())
    folders |= {f for f in ("lab/resilient_slurm_lab", "bench", "scripts") if (root / f).is_dir()}
    out = []
    for folder in sorted(folders):
        for path in sorted((root / folder).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{path.relative_to(root)}: {n}")
    return out


def test_no_product_module_over_400_lines() -> None:
    assert long_modules() == []


def test_long_modules_sees_a_long_one(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = { "p" = "core" }\n')
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "a.py").write_text("x = 1\n" * 401)
    (tmp_path / "core" / "b.py").write_text("x = 1\n" * 400)
    assert long_modules(tmp_path) == ["core/a.py: 401"]
