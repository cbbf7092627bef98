"""Every admin-facing command answers ``--version`` (``resilient-launch``'s is the launcher's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm import __version__

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("prog", ["resilient-slurm", "resilient-health", "resilient-prolog",
                                  "resilient-epilog"])
def test_version(prog: str) -> None:
    done = subprocess.run([str(BIN / prog), "--version"], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert prog in done.stdout and __version__ in done.stdout
    assert done.stderr == ""
