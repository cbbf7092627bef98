"""``make test``'s set-up makes the job user's path work by itself (``scripts/setup.sh``
``job_user_path`` -> ``scripts/open-path.sh``), not only CI's ``.ci/run``."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from resilient_slurm_lab.sandbox.jobuser import unreachable_by

REPO = Path(__file__).resolve().parents[2]
OTHER = (65534, 65534)  # a user who owns nothing here (nobody): only "others" bits apply


def _closed_tree() -> tuple[str, str]:
    top = tempfile.mkdtemp(prefix="rs-open-path-")  # 0700, as root's home is
    deep = os.path.join(top, "home", "checkout")
    os.makedirs(deep)
    for d in (top, os.path.join(top, "home"), deep):
        os.chmod(d, 0o700)
    return top, deep


def test_open_path_grants_traverse_only_and_says_so() -> None:
    top, deep = _closed_tree()
    try:
        assert unreachable_by(deep, *OTHER) == top
        out = subprocess.run([str(REPO / "scripts/open-path.sh"), deep], capture_output=True,
                             text=True, check=True).stdout
        assert unreachable_by(deep, *OTHER) is None
        for d in (top, os.path.join(top, "home"), deep):
            mode = stat.S_IMODE(os.stat(d).st_mode)
            assert mode == 0o701, (d, oct(mode))  # traverse, never list or read
            assert f"chmod o+x {d}" in out
        again = subprocess.run([str(REPO / "scripts/open-path.sh"), deep],
                               capture_output=True, text=True, check=True).stdout
        assert again == ""  # idempotent and quiet once open
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(os.geteuid() != 0, reason="the set-up opens paths as root only")
def test_setup_opens_the_checkout_and_interpreter_for_the_job_user() -> None:
    """The set-up step ``make test`` runs, on a checkout inside a 0700 tree whose venv's
    interpreter also lies inside a 0700 tree (pyenv under /root)."""
    top, checkout = _closed_tree()
    py_top, py_dir = _closed_tree()
    try:
        os.makedirs(os.path.join(checkout, "scripts"))
        for name in ("setup.sh", "open-path.sh"):
            shutil.copy2(REPO / "scripts" / name, os.path.join(checkout, "scripts", name))
        # A stand-in for the interpreter pyenv keeps under /root: asked for its real path
        # (what the set-up asks the venv's python), it answers with its own, inside the tree.
        interp = os.path.join(py_dir, "python3.11")
        Path(interp).write_text('#!/bin/sh\nreadlink -f "$0"\n')
        os.chmod(interp, 0o755)
        os.makedirs(os.path.join(checkout, ".venv", "bin"))
        os.symlink(interp, os.path.join(checkout, ".venv", "bin", "python"))
        code = ("import os, subprocess, sys; os.chdir(sys.argv[1]); "
                "sys.exit(subprocess.call(['scripts/setup.sh', '--job-user-path']))")
        done = subprocess.run([sys.executable, "-c", code, checkout], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert unreachable_by(checkout, *OTHER) is None
        assert unreachable_by(interp, *OTHER) is None
        assert f"chmod o+x {top} " in done.stdout and f"chmod o+x {py_top} " in done.stdout
    finally:
        shutil.rmtree(top)
        shutil.rmtree(py_top)
