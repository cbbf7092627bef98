"""The built wheel works on its own: installed into a fresh venv outside the repository, every
console script answers ``--help`` and a simulated health check finds its data files.

The editable install used by the other tests reads the repository's folders, so a data file
missing from ``[tool.setuptools]`` would pass them all and break every real installation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from resilient_slurm.config import tomllib

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
# Developer notes inside package folders; everything else under a mapped folder must ship.
NOT_SHIPPED = {"healthcheck/README.md", "training/README.md"}
# The lab's parts (lab/, the distribution resilient-slurm-lab), as the product once named them
# (package paths in the wheel): the product's wheel ships none of them, nor the lab's package.
LAB_ONLY = ("resilient_slurm/sandbox/", "resilient_slurm_lab/",
            # simulated hardware (the lab's resilient_slurm_lab/hardware/ since issue 41)
            "resilient_slurm/healthcheck/scenarios/", "resilient_slurm/healthcheck/fakes.py",
            "resilient_slurm/healthcheck/simulate.py", "resilient_slurm/healthcheck/klogfile.py",
            # fault injection (the lab's resilient_slurm_lab/faults/)
            "resilient_slurm/training/faults.py",
            # the goodput projection (the lab's resilient_slurm_lab/projection/)
            "resilient_slurm/projection.py", "resilient_slurm/cli/plan.py")


def _pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                          **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, a fresh venv with it installed), both outside the repository."""
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("wheel")
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    src = root / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".sandbox*",
        ".pytest_cache", ".mypy_cache", ".ruff_cache", "results", "tests"))
    dist = root / "dist"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(dist), str(src)])
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("resilient_slurm-*.whl")
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    # This interpreter's pip installs into the new venv (no ensurepip copy: seconds saved).
    # Dependencies come from the configured index or the local wheel cache.
    inst = _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                 "install", "-q", str(wheel)])
    assert inst.returncode == 0, inst.stdout + inst.stderr
    print(f"wheel built and installed in {time.monotonic() - t0:.1f} s")
    return wheel, venv


def _env(home: Path) -> dict[str, str]:
    """A clean environment: nothing points back at the repository or its venv."""
    keep = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["HOME"] = str(home)
    return env


def test_wheel_ships_every_file_of_the_mapped_folders(wheel_venv: tuple[Path, Path]) -> None:
    wheel, _ = wheel_venv
    mapping: dict[str, str] = _pyproject()["tool"]["setuptools"]["package-dir"]
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    missing = []
    for package, folder in mapping.items():
        base = REPO / folder
        for path in base.rglob("*"):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(base).as_posix()
            if f"{folder}/{rel}" in NOT_SHIPPED:
                continue
            if f"{package.replace('.', '/')}/{rel}" not in shipped:
                missing.append(f"{folder}/{rel}")
    assert not missing, f"files the wheel does not ship: {missing}"


def test_every_console_script_answers_help(wheel_venv: tuple[Path, Path],
                                           tmp_path: Path) -> None:
    _, venv = wheel_venv
    scripts = _pyproject()["project"]["scripts"]
    assert scripts
    for name in scripts:
        res = _run([str(venv / "bin" / name), "--help"], cwd=tmp_path, env=_env(tmp_path))
        assert res.returncode == 0, f"{name} --help: rc {res.returncode}\n{res.stderr}"
        # click prints "Usage: NAME", argparse "usage: NAME".
        assert f"usage: {name}" in res.stdout.lower(), f"{name} --help: no usage:\n{res.stdout}"


def test_installed_package_is_the_wheel_not_the_repository(wheel_venv: tuple[Path, Path],
                                                           tmp_path: Path) -> None:
    _, venv = wheel_venv
    code = ("import resilient_slurm.healthcheck.policy as p, resilient_slurm.sbatch as s; "
            "print(p.__file__); print(s.__file__)")
    res = _run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=_env(tmp_path))
    assert res.returncode == 0, res.stderr
    for line in res.stdout.split():
        assert Path(line).is_relative_to(venv), line


def test_health_data_from_the_wheel_and_no_simulated_hardware(wheel_venv: tuple[Path, Path],
                                                                tmp_path: Path) -> None:
    """Profiles and Xid policies are read from the installed package; the product has no
    simulated hardware: `--simulate` says it comes with the lab and exits 2."""
    _, venv = wheel_venv
    env = _env(tmp_path)
    code = ("from resilient_slurm.healthcheck.config import HealthConfig\n"
            "from resilient_slurm.healthcheck.policy import load_policy\n"
            "from resilient_slurm.healthcheck.profiles import select_profile\n"
            "cfg = HealthConfig()\n"
            "print(load_policy('hopper', cfg).rule(79).action)\n"
            "print(select_profile(cfg, 'n1', 'p5.48xlarge', '').spec.gpus)\n")
    data = _run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env)
    # Xid 79 maps to reboot in the shipped Hopper policy (healthcheck/xid_policies/); p5.48xlarge
    # (the shipped profiles.toml) has 8 GPUs.
    assert data.returncode == 0 and data.stdout.split() == ["reboot", "8"], \
        data.stdout + data.stderr
    config = tmp_path / "config.toml"
    config.write_text(f'[health]\nstate_dir = "{tmp_path / "state"}"\n')
    health = str(venv / "bin" / "resilient-health")
    sim = _run([health, "check", "--simulate", "healthy-p5", "--config", str(config)],
               cwd=tmp_path, env=env)
    assert sim.returncode == 2, sim.stdout + sim.stderr
    assert "resilient-slurm-lab" in sim.stderr and "Traceback" not in sim.stderr, sim.stderr
    listed = _run([health, "--help"], cwd=tmp_path, env=env)
    assert listed.returncode == 0 and "scenarios" not in listed.stdout, listed.stdout


def test_the_product_names_no_lab_package() -> None:
    """pyproject.toml's packages and package-dir name none of the lab's parts."""
    setuptools = _pyproject()["tool"]["setuptools"]
    named = [*setuptools["packages"], *setuptools["package-dir"]]
    lab = [p for p in named if any(f"{p.replace('.', '/')}/".startswith(prefix)
                                   for prefix in LAB_ONLY)]
    assert lab == [], f"the product's pyproject.toml names lab packages: {lab}"


def test_the_wheel_ships_no_lab(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    """No lab in the product's wheel; its `resilient-slurm sandbox` and `plan` say where they
    are."""
    wheel, venv = wheel_venv
    with zipfile.ZipFile(wheel) as zf:
        lab = [n for n in zf.namelist() if n.startswith(LAB_ONLY)]
    assert lab == [], f"the product's wheel ships lab files: {lab[:10]}"
    for argv in (["sandbox", "up", "--nodes", "2"], ["plan", "--gpus", "1024"]):
        res = _run([str(venv / "bin" / "resilient-slurm"), *argv], cwd=tmp_path,
                   env=_env(tmp_path))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "resilient-slurm-lab" in res.stderr and "Traceback" not in res.stderr, res.stderr
    listed = _run([str(venv / "bin" / "resilient-slurm"), "--help"], cwd=tmp_path,
                  env=_env(tmp_path))
    assert listed.returncode == 0 and "resilient-slurm-lab" in listed.stdout, listed.stdout
