"""The job log stays readable: no FutureWarning per rank about the deprecated ``pynvml``
package (nvidia-resiliency-ext's dependency) in the processes resilient-launch starts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from resilient_slurm.launcher.step import PYNVML_FILTER, quiet_env

WARNING = "The pynvml package is deprecated"


def _import_pynvml(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", "import pynvml"], capture_output=True,
                          text=True, env=env, timeout=60).stderr


@pytest.mark.skipif(importlib.util.find_spec("_pynvml_redirector") is None,
                    reason="the deprecated pynvml package is not installed here")
def test_ranks_import_pynvml_without_the_deprecation_warning() -> None:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    assert WARNING in _import_pynvml(base)  # what every rank printed before
    assert WARNING not in _import_pynvml(quiet_env(base))
    # the user's own filters stay, and the filter is added once
    env = quiet_env({**base, "PYTHONWARNINGS": "error::DeprecationWarning"})
    assert env["PYTHONWARNINGS"] == f"error::DeprecationWarning,{PYNVML_FILTER}"
    assert quiet_env(env)["PYTHONWARNINGS"] == env["PYTHONWARNINGS"]
    assert WARNING not in _import_pynvml(env)


def test_the_project_depends_on_nvidia_ml_py_not_pynvml() -> None:
    from importlib.metadata import requires

    reqs = [r.split(";")[0].strip() for r in requires("resilient-slurm") or []]
    names = {r.split(">")[0].split("=")[0].split("[")[0].split("<")[0].strip() for r in reqs}
    assert "nvidia-ml-py" in names and "pynvml" not in names
