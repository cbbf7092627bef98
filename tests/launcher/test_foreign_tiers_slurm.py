"""The outside-style script with memory tiers (``foreign/train_tiers.py``: ``checkpoint.load`` /
``checkpoint.save`` where ``dcp.load`` / ``dcp.save`` stood) under resilient-launch on the real
sandbox, as the unprivileged job user: an exception and a SIGKILL, each restarted by
ft_launcher, resume from the step before the fault out of node memory (0 lost steps), and the
run ends with the fault-free weights digest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import launch_helpers  # type: ignore[import-not-found]  # tests/launcher is on sys.path
import pytest

from resilient_slurm.checkpoint import store
from tests.checkpoint import tier_helpers

pytestmark = pytest.mark.slurm

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext")

FOREIGN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "foreign")
BIN = os.path.dirname(sys.executable)
STEPS = ["--steps=14", "--step-time=0.2"]


def test_tiers_script_resumes_from_node_memory(slurm, clean, job_user, tmp_path):
    reference = tier_helpers.digest(tier_helpers.on_nodes(str(tmp_path), ["a", "b"], [
        "--steps", "14", "--step-time", "0"]))
    work = Path(job_user.make_dir(mode=0o755))
    faults = Path(job_user.make_dir(str(work / "faults")))
    line = [os.path.join(BIN, "resilient-launch"), "--nproc-per-node=1", "--max-restarts=3",
            "--heartbeat-timeout=8", "--initial-heartbeat-timeout=120", "--term-timeout=3",
            f"--checkpoint-dir={work}/ck", os.path.join(FOREIGN, "train_tiers.py"), *STEPS,
            f"--save-dir={work}/ck", "--durable-every=5", "--fault=exception@4:1",
            "--fault=sigkill@9:0", f"--fault-dir={faults}"]
    batch = work / "job.sbatch"
    # one node-memory folder per sandbox node ({node}: they all share this host's /dev/shm)
    batch.write_text(f"#!/bin/bash\nexport RESILIENT_SANDBOX_TIER1_DIR={work}/shm/{{node}}\nexec "
                     + " ".join(line) + "\n")
    os.chown(batch, job_user.uid, job_user.gid)
    res = job_user.run(clean, ["sbatch", "--parsable", "--nodes=2", "--requeue",
                               "--open-mode=append", f"--output={work}/slurm-%j.out",
                               f"--chdir={work}", "--job-name=rl-tiers", str(batch)],
                       capture_output=True, timeout=60,
                       env={"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    job = launch_helpers.wait_job(slurm, jid, 420)
    log = (work / f"slurm-{jid}.out").read_text()
    assert job.state == "COMPLETED", log[-4000:]
    starts = sorted(tier_helpers.starts(log))
    assert starts == [(0, 0, "None"), (0, 3, "own memory"), (0, 8, "own memory"),
                      (1, 0, "None"), (1, 3, "own memory"), (1, 8, "own memory")], log[-3000:]
    assert tier_helpers.digest(log) == reference
    assert job.restart_count == 0  # no requeue: both faults handled inside the job
    # each of the two nodes holds its rank's snapshot and the other's copy (tier 2)
    nodes = sorted(os.listdir(work / "shm"))
    assert len(nodes) == 2, nodes
    for node in nodes:
        held = {(s.owner, s.step) for s in store.scan(str(work / "shm" / node / str(jid)))}
        assert {(0, 14), (1, 14)} <= held, (node, held)
