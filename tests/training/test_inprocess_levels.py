"""Levels 0 and 1 together (no Slurm): three ft_launcher agents, one rank each, with
``--nnodes=2:3 --ft-restart-policy=min-healthy`` around ``train_fsdp.py --inprocess``.

A first SIGKILL is handled in-process (level 0: world 3 -> 2 from the peer copy, ft_launcher
restarts nothing); a second one would leave one rank, below the minimum, so that rank exits
and ft_launcher restarts the workers (level 1: fresh processes, which resume from the same
memory tiers, resharded from 2 ranks onto 3). The job completes with the digest of an
uninterrupted run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext.inprocess")

from tests.training.inprocess_harness import SCRIPT, run_ft_job  # noqa: E402

STEPS = 20


def _uninterrupted_digest(tmp: Path) -> str:
    """One process over the same 3 virtual shards: bitwise the same as 3 ranks."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(STEPS), "--virtual-dp", "3",
                          "--threads", "1", "--checkpoint-dir", str(tmp / "ref"),
                          "--checkpoint-every", "0", "--sync-checkpoint"],
                         capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("weights digest: ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-2000:]
    return lines[0].split(": ", 1)[1]


def test_second_loss_below_min_goes_to_ft_launcher(tmp_path: Path) -> None:
    res = run_ft_job(tmp_path / "job", STEPS, ("sigkill@6@rank1", "sigkill@11@rank1"))
    tail = "\n".join(out[-3000:] for out in res.outputs)
    assert res.rcs == [0, 0, 0], tail
    assert [f["type"] for f in res.fired] == ["sigkill", "sigkill"]
    resumes = res.kind("resume")
    level0 = [e for e in resumes if e.get("level") == "inprocess"]
    level1 = [e for e in resumes if e.get("restart") not in (None, "0")]
    assert len(level0) == 1 and len(level1) == 1, resumes
    first, second = level0[0], level1[0]
    # level 0: the first loss, in the same processes, from memory, no step lost
    assert first["restart"] == "0" and first["source_state"] == "memory"
    assert first["world_size"] == 2 and first["lost_ranks"] == [1] and first["step"] == 5
    # level 1: fresh processes on all three agents, from the same memory tiers: the 2-rank
    # set of step 10 (the last before the second SIGKILL) resharded onto 3 ranks; the disk
    # checkpoint (every 4 steps) is older
    assert second["iteration"] == 0 and second["source_state"] == "memory"
    assert second["world_size"] == 3 and second["step"] == 10
    assert "memory tiers: step 10 from memory, resharded from 2 ranks" in "".join(res.outputs)
    second_fault = res.fired[1]["time"]
    print(f"\nlevel 0 (first SIGKILL): fault to resume "
          f"{first['ts'] - res.fired[0]['time']:.1f} s; level 1 (second SIGKILL): fault to "
          f"resume {second['ts'] - second_fault:.1f} s from disk step {second['step']}")
    assert res.digests() == {_uninterrupted_digest(tmp_path)}, tail
