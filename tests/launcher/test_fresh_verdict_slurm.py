"""Restarts spent before the hooks have spoken: a node's GPU is lost and its job-wide in-job
restart budget (0 here) is spent at once, well before the HealthCheckProgram (every 10 s on
this sandbox) has run since. Blame on the verdicts published before the failure finds nobody
and used to requeue the job onto the same bad node's allocation; the launcher now waits for the
nodes' next verdicts (``--verdict-wait``), blames node3 from its ``fail`` and goes on without it
(elastic, no requeue), ending with the fault-free weights."""

from __future__ import annotations

import pytest
from launch_helpers import (  # type: ignore[import-not-found]
    fault_free,
    kinds,
    log_of,
    submit,
    wait_job,
)

pytestmark = pytest.mark.slurm

pytest.importorskip("torch")


def test_restarts_spent_before_the_verdict_still_blame_the_bad_node(slurm, clean, tmp_path):
    jid, _, state = submit(slurm, clean, tmp_path, 3,
                           ["--min-nodes=2", "--max-restarts=0", "--max-requeues=1"],
                           ["--fault=node@5@node3"], ("--nodelist=node[1-3]",), steps=40)
    digest = fault_free(3, 40, tmp_path)
    job = wait_job(slurm, jid, timeout=300)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 0, log  # no requeue
    blames = kinds(state, "blame")
    assert blames and "node3" in (blames[0].get("blamed") or {}), blames
    assert [(e["node"], e["mode"]) for e in kinds(state, "exclude")] == [("node3", "elastic")]
    assert kinds(state, "cycle_start")[-1]["nodes"] == ["node1", "node2"]
    assert digest in log
