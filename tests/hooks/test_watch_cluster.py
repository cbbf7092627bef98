"""The node watcher on a real 2-node sandbox (``lifecycle.up(watch=True)``: ``resilient-health
watch`` on every node, as root, as its service would run it) with HealthCheckInterval=300, a
common production setting: a lost GPU is published and drained by the watcher within
seconds, not at the next health run; the healthy node is left alone; a repaired node is never
resumed by the watcher (the health program's runs do that); ``sandbox node kill`` takes the
node's watcher with it and ``node start`` brings it back."""

from __future__ import annotations

import json
import time

import pytest

from resilient_slurm import verdict_file
from resilient_slurm.slurm import Node, connect
from resilient_slurm_lab.sandbox import nodefaults
from resilient_slurm_lab.sandbox.cluster import members, read_meta

from ..conftest import TEST_PREFIX, _start_sandbox, wait_until
from .conftest import PREFIX, events, fault, run_health_as_slurm

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def watched():
    yield from _start_sandbox(TEST_PREFIX + "watch-", nodes=2, watch=True, health_interval=300)


def _watcher(paths, node: str) -> int | None:
    daemons = read_meta(paths)["daemons"]
    pid = daemons.get(f"watch-{node}") if isinstance(daemons, dict) else None
    return pid if isinstance(pid, int) and pid in members(paths).daemons else None


def test_the_watcher_drains_a_lost_gpu_within_seconds_and_never_resumes(watched):
    slurm = connect(conf=watched.conf, backend="cli")
    assert _watcher(watched, "node1") and _watcher(watched, "node2")
    wait_until(lambda: events(watched, kind="watch_start", node="node2"), timeout=30)
    fault(watched, "node2", "xid79")
    # the health program's next run is up to 300 s away: only the watcher can be this quick
    def drained() -> Node | None:
        n = slurm.node("node2")
        return n if n.drain else None

    node = wait_until(drained, timeout=20)
    assert node is not None
    assert node.reason.startswith(PREFIX) and "gpu3" in node.reason
    assert events(watched, kind="drain", node="node2", source="watch")
    published = json.loads(open(watched.p("verdicts", "node2.json")).read())
    assert published["status"] == "fail" and published["source"] == "watch"
    assert not slurm.node("node1").drain
    assert not events(watched, kind="verdict", node="node1", source="watch")  # healthy: none
    fault(watched, "node2", "clear")
    time.sleep(5)  # a few watcher ticks on repaired hardware
    assert slurm.node("node2").drain
    assert not events(watched, kind="resume", node="node2")
    v = verdict_file.read(watched.p("verdicts", "node2.json"))
    assert v is not None and v.status == "fail"  # the watcher never clears
    for _ in range(2):  # resume_after = 2 healthy health-program runs
        assert run_health_as_slurm(watched, "node2").returncode == 0
    wait_until(lambda: not slurm.node("node2").drain, timeout=30)
    assert events(watched, kind="resume", node="node2", source="health")


def test_node_kill_takes_the_watcher_and_node_start_brings_it_back(watched):
    before = _watcher(watched, "node1")
    assert before is not None
    killed = nodefaults.node_kill(watched.root, "node1")
    assert before in killed
    wait_until(lambda: _watcher(watched, "node1") is None, timeout=10)
    nodefaults.node_start(watched.root, "node1")
    after = _watcher(watched, "node1")
    assert after is not None and after != before
