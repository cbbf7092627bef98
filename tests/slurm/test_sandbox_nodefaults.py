"""Node-loss faults on a real cluster: ``sandbox node pause`` (NOT_RESPONDING, then back) and
``sandbox node kill`` (slurmd and the node's job processes gone: DOWN after SlurmdTimeout)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox import lifecycle, nodefaults
from resilient_slurm_lab.sandbox.cluster import Paths

from ..conftest import require_sandbox, wait_until
from .sandbox_helpers import env_of, show_job

pytestmark = pytest.mark.slurm
CLI = [sys.executable, "-m", "resilient_slurm.cli"]


def _own(timing: str) -> Iterator[Paths]:
    require_sandbox()
    root = tempfile.mkdtemp(prefix=f"rs-test-node-{timing}-")
    try:
        yield lifecycle.up(root, nodes=2, hooks=False, timing=timing)
    finally:
        assert lifecycle.down(root) == []
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def prod2() -> Iterator[Paths]:
    yield from _own("production")


@pytest.fixture(scope="module")
def fast2() -> Iterator[Paths]:
    yield from _own("fast")


def flags(paths: Paths, node: str) -> frozenset[str]:
    return connect(conf=paths.conf, backend="cli", timeout=20).node(node).flags


def state(paths: Paths, node: str) -> str:
    return connect(conf=paths.conf, backend="cli", timeout=20).node(node).state


def two_node_job(paths: Paths, *extra: str) -> str:
    """A 2-node job whose script outlives its step (``srun sleep; sleep``)."""
    out = subprocess.run(["sbatch", "--parsable", "-N2", *extra, "-o", "/dev/null", "--wrap",
                          "srun sleep 600; sleep 600"], env=env_of(paths), capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip().split(";")[0]
    wait_until(lambda: len(nodefaults.node_processes(paths.root, "node2")) >= 2, 60)
    return out


def test_pause_flags_not_responding_then_back_and_the_step_runs_on(prod2: Paths) -> None:
    job = two_node_job(prod2)
    tasks = nodefaults.node_processes(prod2.root, "node2")
    res = subprocess.run([*CLI, "sandbox", "node", "pause", "node2", "25", "--background",
                          "--dir", prod2.root], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    start = time.monotonic()
    wait_until(lambda: "NOT_RESPONDING" in flags(prod2, "node2"), 24)  # MessageTimeout=10
    assert time.monotonic() - start < 25  # seen while slurmd is still stopped
    assert show_job(prod2, job)["JobState"] == "RUNNING"
    wait_until(lambda: "NOT_RESPONDING" not in flags(prod2, "node2"), 60)
    assert show_job(prod2, job)["JobState"] == "RUNNING"
    assert set(tasks) <= set(nodefaults.node_processes(prod2.root, "node2"))  # never stopped
    subprocess.run(["scancel", job], env=env_of(prod2), timeout=30, check=True)


def test_kill_ends_the_node_and_its_jobs_only_then_down_after_slurmd_timeout(
        fast2: Paths) -> None:
    job = two_node_job(fast2, "--no-kill")
    on_node1 = nodefaults.node_processes(fast2.root, "node1")
    pid = nodefaults.slurmd_pid(fast2.root, "node2")
    res = subprocess.run([*CLI, "sandbox", "node", "kill", "node2", "--dir", fast2.root],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert nodefaults.slurmd_pid(fast2.root, "node2") is None and pid is not None
    assert nodefaults.node_processes(fast2.root, "node2") == []
    assert set(on_node1) <= set(nodefaults.node_processes(fast2.root, "node1"))
    assert state(fast2, "node2") != "DOWN"  # not until SlurmdTimeout has passed
    timing = lifecycle.sandbox_timing(fast2.root)
    wait_until(lambda: state(fast2, "node2") == "DOWN", timing.slurmd_timeout * 3)
    assert show_job(fast2, job)["JobState"] == "RUNNING"  # --no-kill: the job keeps node1
    res = subprocess.run([*CLI, "sandbox", "node", "start", "node2", "--dir", fast2.root],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    subprocess.run(["scancel", job], env=env_of(fast2), timeout=30, check=True)
    wait_until(lambda: state(fast2, "node2") == "IDLE", 60)


def test_node_faults_refuse_unknown_nodes(fast2: Paths) -> None:
    for args in (["pause", "node9", "5"], ["kill", "node9"], ["start", "node9"]):
        res = subprocess.run([*CLI, "sandbox", "node", *args, "--dir", fast2.root],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode != 0 and "not a node of this sandbox" in res.stderr, res
        assert "Traceback" not in res.stderr
