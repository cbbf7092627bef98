"""Fixtures shared by the launcher's cluster tests (helpers: ``launch_helpers.py``)."""

from __future__ import annotations

import os
import time

import pytest


@pytest.fixture()
def clean(sandbox, slurm):  # type: ignore[no-untyped-def]
    """Every node healthy and idle before a test."""
    for n in slurm.nodes():
        try:
            from resilient_slurm.healthcheck.simulate import install_scenario

            install_scenario(sandbox.node_dir(n.name), "clear")
        except ImportError:
            scen = os.path.join(sandbox.node_dir(n.name), "scenario.toml")
            if os.path.exists(scen):
                os.unlink(scen)
        if n.drain or not n.available:
            slurm.resume(n.name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            n.state == "IDLE" and not n.flags for n in slurm.nodes()):
        time.sleep(0.3)
    return sandbox
