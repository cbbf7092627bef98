"""Shims that fail closed, on the real sandbox: a hook whose interpreter or package is gone
drains its own node with ``rhc:HOOK_BROKEN`` through scontrol and exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from resilient_slurm.events import read_events
from resilient_slurm.hooks import install
from resilient_slurm_lab.sandbox.lifecycle import config_path

from ..conftest import wait_until

pytestmark = pytest.mark.slurm

NODE = "node4"


def _run(shim: str, **env: str) -> subprocess.CompletedProcess[str]:
    """As slurmd runs a hook: root, an environment of Slurm's values only."""
    return subprocess.run([shim], env={"SLURMD_NODENAME": NODE, **env}, cwd="/",
                          capture_output=True, text=True, timeout=60)


def _broken_drains(sandbox, since: float) -> list[dict]:
    return [e for e in read_events(sandbox.p("log", "events.jsonl"))
            if e.get("kind") == "drain" and e.get("node") == NODE and e["ts"] >= int(since)
            and "HOOK_BROKEN" in e.get("reason", "")]


def _resume(slurm) -> None:
    if slurm.node(NODE).drain:
        slurm.resume(NODE)
    wait_until(lambda: not slurm.node(NODE).drain, timeout=20)


def test_shims_drain_their_node_when_interpreter_or_package_is_gone(sandbox, slurm,
                                                                    tmp_path) -> None:
    with open(config_path(sandbox)) as fh:
        config = fh.read()  # the sandbox's: its slurm.conf, Slurm's tools, its events file
    gone = tmp_path / "venv-python"
    os.symlink(sys.executable, gone)
    prefix = str(tmp_path / "gone")
    shims = install.install(prefix, python=str(gone), config_text=config).shims
    bare = tmp_path / "bare"  # a Python without the package (a venv rebuilt, say)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    nopkg = install.install(str(tmp_path / "nopkg"), python=str(bare / "bin" / "python"),
                            config_text=config).shims
    os.unlink(gone)  # the venv is removed
    since = time.time()
    try:
        done = _run(shims["healthcheck"])
        assert done.returncode == 4, done.stderr
        assert "interpreter" in done.stderr and "missing" in done.stderr
        node = slurm.node(NODE)
        assert node.drain and node.reason == "rhc:HOOK_BROKEN healthcheck", node
        drain = _broken_drains(sandbox, since)
        assert drain and "interpreter" in drain[-1]["cause"], drain
        # Drained already: a second broken hook leaves the reason as it is.
        again = _run(shims["watch"])
        assert again.returncode == 4 and "left as it is" in again.stderr
        assert slurm.node(NODE).reason == "rhc:HOOK_BROKEN healthcheck"
        _resume(slurm)

        # The package cannot be imported: the prolog refuses the job and drains the node.
        refused = _run(nopkg["prolog"], SLURM_JOB_ID="77")
        assert refused.returncode == 4, refused.stderr
        assert "cannot import resilient_slurm.prolog.hook" in refused.stderr
        assert slurm.node(NODE).reason == "rhc:HOOK_BROKEN prolog"
        assert any("cannot import" in e["cause"] for e in _broken_drains(sandbox, since))
    finally:
        _resume(slurm)
    problems = install.check(prefix, slurm_conf=sandbox.conf)
    assert any("interpreter" in p and "HOOK_BROKEN" in p for p in problems), problems
    problems = install.check(str(tmp_path / "nopkg"), slurm_conf=sandbox.conf)
    assert any("cannot import resilient_slurm.hooks.health" in p for p in problems), problems
