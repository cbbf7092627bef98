"""The skip policy (tests/skip_policy.py) on generated test files run by a real pytest: with
`make test`'s and the stages' RESILIENT_REQUIRE_SLURM=1, a deliberately broken NVRx import
fails the run instead of skipping the launcher's tests, while a pyslurm or CUDA skip passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import skip_policy

REPO = Path(__file__).resolve().parents[1]
# a broken install: NVRx's package imports, a module it needs does not
MISSING = "nvrx_dependency_deliberately_missing_for_the_skip_policy_test"
BROKEN = f"import {MISSING}\n"
CONFTEST = "from tests.skip_policy import pytest_make_collect_report, pytest_runtest_makereport\n"
FILES = {
    # a launcher test module as they start: the NVRx import skips the module when it fails
    "test_launcher.py": "import pytest\n"
                        "nvrx = pytest.importorskip('nvidia_resiliency_ext.inprocess')\n\n"
                        "def test_restart():\n    pass\n",
    "test_allowed.py": "import pytest\n\n"
                       "def test_pyslurm():\n"
                       "    pytest.skip('pyslurm backend unavailable here: not importable')\n\n"
                       "@pytest.mark.skipif(True, reason='needs a CUDA device')\n"
                       "def test_cuda():\n    pass\n",
    "test_in_body.py": "import pytest\n\n"
                       "def test_tool():\n    pytest.skip('no ft_launcher')\n",
}


def _pytest(tmp_path: Path, test_file: str, strict: bool,
            extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    broken = tmp_path / "site" / "nvidia_resiliency_ext"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "__init__.py").write_text(BROKEN)
    env = {k: v for k, v in os.environ.items() if k not in skip_policy.STRICT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(REPO)])
    if strict:
        env["RESILIENT_REQUIRE_SLURM"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-c", str(tmp_path / "pytest.ini"),
                           "--rootdir", str(tmp_path), str(tmp_path / test_file)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_broken_nvrx_import_fails_the_run(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "test_launcher.py", strict=True)
    assert out.returncode != 0, out.stdout
    assert "skips are failures here" in out.stdout
    assert f"No module named '{MISSING}'" in out.stdout


def test_a_skip_in_a_test_body_fails_the_run(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "test_in_body.py", strict=True)
    assert out.returncode == 1, out.stdout
    assert "1 failed" in out.stdout and "no ft_launcher" in out.stdout


def test_allow_listed_skips_pass(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "test_allowed.py", strict=True)
    assert out.returncode == 0, out.stdout
    assert "2 skipped" in out.stdout


def test_outside_make_test_a_skip_stays_a_skip(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "test_in_body.py", strict=False)
    assert out.returncode == 0, out.stdout
    assert "1 skipped" in out.stdout


@pytest.mark.parametrize("reason, entry", [
    ("pyslurm backend unavailable here: pyslurm not importable", "pyslurm"),
    ("Skipped: needs a CUDA device", "CUDA"),
    ("could not import 'nvidia_resiliency_ext': CUDA driver missing", None),
    ("NVRx async checkpointing not importable (ImportError: pyslurm)", None),
    ("Slurm sandbox unavailable: not root", None),
])
def test_the_allow_list_matches_the_start_of_the_reason(reason: str, entry: str | None) -> None:
    assert skip_policy.allowed(reason) == entry


def test_the_real_suite_applies_it_to_the_nvrx_writer_variants(tmp_path: Path) -> None:
    """tests/checkpoint/test_checkpoint.py under the real tests/conftest.py with NVRx broken:
    its NVRx writer variants are collected, skip with the import's reason, and fail the run."""
    broken = tmp_path / "site" / "nvidia_resiliency_ext"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(BROKEN)
    env = {k: v for k, v in os.environ.items() if k not in skip_policy.STRICT_ENV}
    env.update(PYTHONPATH=str(tmp_path / "site"), RESILIENT_REQUIRE_SLURM="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "tests/checkpoint/test_checkpoint.py", "-k", "nvrx"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "NVRx async checkpointing not importable (ModuleNotFoundError: No module named " \
           f"'{MISSING}')" in out.stdout, out.stdout[-3000:]
    # each NVRx variant: collected, skipped at setup, reported as an error; the others pass
    assert "4 errors" in out.stdout and "skips are failures here" in out.stdout, out.stdout
