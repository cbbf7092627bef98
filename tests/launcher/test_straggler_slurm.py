"""Stragglers on a real 3-node sandbox: a node slowed 2x (seeded ``slow`` fault) is found from
the training's step_timing events within the configured window, the cycle is stopped, the node
left out (elastic) and released to Slurm, not drained; training finishes on the other two with
the fault-free run's weights digest (fixed virtual shards)."""

from __future__ import annotations

import os
import subprocess

import pytest
from launch_helpers import (  # type: ignore[import-not-found]
    BIN,
    fault_free,
    kinds,
    log_of,
    submit,
    wait_job,
)

pytestmark = pytest.mark.slurm

pytest.importorskip("torch")

STEPS, SLOW_FROM, WINDOW, EVERY = 40, 10, 20, 5


def test_slow_node_is_blamed_within_the_window_and_training_goes_on_without_it(
        slurm, clean, tmp_path):
    jid, _, state = submit(
        slurm, clean, tmp_path, 3,
        ["--min-nodes=2", f"--straggler-window={WINDOW}", "--on-straggler=exclude"],
        [f"--fault=slow@{SLOW_FROM}@node3:2", f"--step-timing-every={EVERY}"],
        ("--nodelist=node[1-3]",), steps=STEPS)
    digest = fault_free(3, STEPS, tmp_path)
    job = wait_job(slurm, jid, timeout=360)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 0
    found = kinds(state, "straggler")
    assert [(e["node"], e["action"]) for e in found] == [("node3", "exclude")], found
    v = found[0]
    assert v["evidence"].startswith("slow: ") and f"median over {v['steps']} steps" in \
        v["evidence"]
    assert v["ratio"] >= 1.3 and v["steps"] >= WINDOW
    # within the configured window (plus one report interval of granularity) of the slowdown
    assert v["last_step"] <= SLOW_FROM + WINDOW + EVERY, v
    stops = [e for e in kinds(state, "stop_cycle") if "straggler" in str(e.get("reason"))]
    assert stops and "node3" in stops[0]["reason"]
    blames = kinds(state, "blame")
    assert list(blames[0]["blamed"]) == ["node3"], blames
    assert any(r.startswith("slow: ") for r in blames[0]["blamed"]["node3"])
    assert [(e["node"], e["mode"]) for e in kinds(state, "exclude")] == [("node3", "elastic")]
    assert kinds(state, "cycle_start")[-1]["nodes"] == ["node1", "node2"]
    assert [(e["nodes"], e["done"]) for e in kinds(state, "release")] == [(["node3"], True)]
    # no cause found by the hooks: reported, not drained
    cause = kinds(state, "straggler_cause")
    assert [(e["node"], e["drained"]) for e in cause] == [("node3", False)]
    (node3,) = slurm.nodes(["node3"])
    assert not node3.drain, node3.describe()
    assert kinds(state, "verdict")[-1]["verdict"] == "completed"
    assert digest in log
    out = subprocess.run([os.path.join(BIN, "resilient-slurm"), "report", state],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "Node speed" in out and "straggler node3" in out, out
