"""``train_fsdp.py --memory-tiers`` (``training/memory_tiers.py``), as real 3-rank gloo jobs on
three simulated nodes (each its own node-memory folder): a fresh run's weights equal a run
without tiers bit for bit, and a run resumed from memory (no disk checkpoint left, one node's
memory gone, as on a replacement node) ends with the uninterrupted run's digest."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.train, pytest.mark.integration]

pytest.importorskip("torch")

TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "sbatch", "train_fsdp.py")


def _run(d: str, steps: int, *extra: str) -> tuple[str, str]:
    """(rank 0's output, all output)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RESILIENT_"))}
    procs = []
    for r in range(3):
        env = {**base, "RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RESILIENT_NODE": f"n{r}", "RESILIENT_TIER1_DIR": os.path.join(d, "shm", f"n{r}"),
               "RESILIENT_CKPT_JOB": "j"}
        procs.append(subprocess.Popen(
            [sys.executable, TRAIN, "--checkpoint-dir", os.path.join(d, "ck"),
             f"--steps={steps}", "--checkpoint-every=5", "--threads=1", "--log-every=4",
             "--step-timing-every=0", *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
    return outs[0], "\n".join(outs)


def _digest(out: str) -> str:
    found = re.findall(r"weights digest: ([0-9a-f]{64})", out)
    assert len(found) == 1, out[-2000:]
    return found[0]


def test_memory_tiers_change_nothing_and_resume_from_a_peer_copy(tmp_path) -> None:
    plain, tiers = str(tmp_path / "plain"), str(tmp_path / "tiers")
    assert _digest(_run(plain, 12)[0]) == _digest(_run(tiers, 12, "--memory-tiers")[0])
    reference = _digest(_run(str(tmp_path / "plain20"), 20)[0])
    shutil.rmtree(os.path.join(tiers, "ck"))  # no disk checkpoint left
    shutil.rmtree(os.path.join(tiers, "shm", "n1"))  # rank 1's node replaced: memory empty
    out, _ = _run(tiers, 20, "--memory-tiers")
    assert "resuming from step 12" in out, out[-2000:]
    assert _digest(out) == reference
