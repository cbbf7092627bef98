"""The watch loop's node watch against a real cluster: a node whose slurmd is paused is only
flagged while the training advances; it stops the step once the training stops advancing;
more flagged nodes than the share-of-nodes cap stop nothing; the job's nodes are asked about
in one batched query (the same RPCs for 1 node or 4), in a worker thread: a frozen controller
never holds a check."""

from __future__ import annotations

import time

import pytest

from resilient_slurm.launcher.recovery import nodewatch
from resilient_slurm_lab.sandbox import lifecycle
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm
NODES = ["node1", "node2", "node3", "node4"]


def test_paused_slurmd_waits_while_training_advances_one_query_per_check(
        slurm, clean) -> None:
    cfg = nodewatch.NodeWatchSettings(query_interval=60.0, confirm_s=30.0, max_share=0.5)
    watch = nodewatch.NodeWatch(slurm, NODES, time.time() - 200, "", cfg)
    with lifecycle.rpc_window(clean.root) as quiet:
        first = watch.check([], time.time(), wait=15)
    assert first.stop == {} and first.waiting == {}
    assert quiet.delta is not None and quiet.delta.total == 0  # nothing asked: no RPC at all
    stall = lifecycle.node_pause(clean.root, "node2", 40, wait=False)
    try:
        with lifecycle.rpc_window(clean.root) as w:
            wait_until(lambda: "NOT_RESPONDING" in slurm.node("node2").flags, 30)
            trouble = [{"kind": "worker_restart", "ts": time.time() - 100}]  # before the flag
            found = watch.check(trouble, time.time(), wait=15)  # the query sees it; steps advance
            assert found.stop == {} and found.waiting == {"node2": "IDLE+NOT_RESPONDING"}
            old = time.time() - 31  # no step report for longer than confirm_s
            stopped = watch.check(trouble, old, wait=15)
            assert list(stopped.stop) == ["node2"], stopped
            assert "training stopped advancing" in stopped.stop["node2"]
            # Two nodes of a 2-node step: more than the cap (1) is a shared fault.
            pair = nodewatch.NodeWatch(slurm, ["node1", "node2"], time.time() - 200, "", cfg)
            pair.flagged["node1"] = (time.time(), "IDLE+NOT_RESPONDING")
            pair.check([], old, wait=15)  # queries: node1 clears, node2 stays flagged
            assert set(pair.flagged) == {"node2"}
        assert w.delta is not None  # one batched query per check (5; the test's own
        assert 0 < w.delta.by_type.get("REQUEST_NODE_INFO", 0) <= 5, w.delta.by_type  # single)
    finally:
        stall.end()
    wait_until(lambda: "NOT_RESPONDING" not in slurm.node("node2").flags, 60)
    back = watch.check([], time.time() - 31, wait=15)
    assert back.stop == {} and back.waiting == {}  # unflagged: nothing to confirm


def test_share_cap_applies_before_the_step_is_stopped(slurm, clean) -> None:
    cfg = nodewatch.NodeWatchSettings(query_interval=60.0, confirm_s=30.0, max_share=0.5)
    stalls = [lifecycle.node_pause(clean.root, n, 40, wait=False, notice=n == "node3")
              for n in ("node2", "node3")]
    try:
        wait_until(lambda: all("NOT_RESPONDING" in slurm.node(n).flags
                               for n in ("node2", "node3")), 30)
        watch = nodewatch.NodeWatch(slurm, ["node1", "node2", "node3"], time.time() - 200, "",
                                    cfg)
        watch.flagged["node2"] = (time.time(), "")  # asks the first check to query
        found = watch.check([], time.time() - 100, wait=15)  # the training has stopped advancing
        assert found.stop == {} and "a shared fault" in found.shared, found
        assert set(found.waiting) == set()
        one = nodewatch.NodeWatch(slurm, ["node1", "node2", "node3", "node4"],
                                  time.time() - 200, "",
                                  nodewatch.NodeWatchSettings(60.0, 30.0, 0.25))
        one.flagged["node2"] = (time.time(), "")
        assert one.check([], time.time() - 100, wait=15).shared  # 2 of 4 > 1
    finally:
        for s in stalls:
            s.end()
    wait_until(lambda: not any("NOT_RESPONDING" in slurm.node(n).flags
                               for n in ("node2", "node3")), 60)


def test_one_query_for_all_nodes_and_a_frozen_controller_never_holds_a_check(
        slurm, clean) -> None:
    cfg = nodewatch.NodeWatchSettings(query_interval=0.0, confirm_s=30.0, max_share=0.5,
                             query_timeout=20.0)
    cost = {}
    for nodes in (NODES[:1], NODES):
        watch = nodewatch.NodeWatch(slurm, nodes, time.time() - 200, "", cfg)
        with lifecycle.rpc_window(clean.root) as w:
            watch.check([], time.time(), wait=15)
        assert w.delta is not None
        cost[len(nodes)] = w.delta.total
    assert cost[4] == cost[1] <= 2, cost  # one sinfo for the node list (per node: 2 each)
    drained = nodewatch.NodeWatch(slurm, NODES, time.time() - 200, "", cfg)
    slurm.drain("node3", "rhc:GPU_LOST test")
    try:
        with lifecycle.controller_stall(clean.root, 12, wait=False) as stall:
            t0 = time.monotonic()
            assert drained.check([], time.time()).stop == {}  # asked; not waited for
            assert drained.check([], time.time()).stop == {}
            assert time.monotonic() - t0 < 1.0
            assert not drained.answered()
            stall.end()  # the controller answers the query that waited in the worker thread
            wait_until(drained.answered, 20)
            assert drained.check([], time.time()).stop == {"node3": "drained by health hook"}
    finally:
        slurm.resume("node3")
