"""docs/demo.md's ``sinfo -R`` excerpt is what Slurm shows for our drain on the real sandbox."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.sandbox.lifecycle import HEALTH_INTERVAL

from ..conftest import wait_until
from .conftest import fault, restore

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]


def _documented() -> tuple[str, str]:
    lines = (ROOT / "docs" / "demo.md").read_text().splitlines()
    i = lines.index("$ sinfo -R")
    return lines[i + 1], lines[i + 2]


def _watcher_reason() -> str:
    """The reason the node watcher writes for the same fault (the demo runs one on every
    node: its cheap checks drain first, without the Xid check's ``+1``)."""
    from resilient_slurm.config import load_config
    from resilient_slurm.healthcheck.seams import check_node
    from resilient_slurm.hooks import runner
    from resilient_slurm.hooks.nodestate import drain_reason

    config = load_config("/dev/null", env={})
    hs = runner.hooks_cfg(config)
    rep = check_node(config, hardware=ScenarioHardware("xid79"), node="node1",
                     profile="p5.48xlarge",
                     only=list(hs.watch_checks))
    return drain_reason(rep, hs.owner_prefix)


def test_sinfo_r_shows_the_documented_drain(sandbox, slurm) -> None:
    """The excerpt's columns and user are the real sinfo's for our drain; its reason is the
    real one, or (the demo runs the node watcher) the watcher's for the same fault."""
    header, row = _documented()
    reason, user = row[:20].rstrip(), row[21:30].rstrip()
    watcher = _watcher_reason()
    fault(sandbox, "node1", "xid79")
    try:
        wait_until(lambda: slurm.node("node1").drain, timeout=2 * HEALTH_INTERVAL + 5)
        out = subprocess.run(["sinfo", "-R"], env={"SLURM_CONF": sandbox.conf,
                                                    "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=30, check=True).stdout
        lines = out.splitlines()
        assert lines[0].split() == header.split()
        mine = [x for x in lines[1:] if x.split()[-1] == "node1"]
        assert mine and mine[0][21:30].rstrip() == user, out
        assert reason in (mine[0][:20].rstrip(), watcher), (reason, watcher, out)
    finally:
        restore(sandbox, slurm, "node1")
