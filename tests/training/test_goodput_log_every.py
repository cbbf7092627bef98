"""Issue 28 item 8b on the real example training: run with its default ``--log-every 10``
through a fault and a restart from checkpoint, the report counts every step (the old
definition counted only consecutive reports and called the productive time unknown)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm import goodput
from resilient_slurm.events import read_events
from resilient_slurm_lab.faults import TRAIN_SCRIPT as FAULTS_TRAIN

pytestmark = pytest.mark.train
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _train(tmp_path: Path, *extra: str) -> int:
    env = {**os.environ, "RESILIENT_EVENTS_FILE": str(tmp_path / "events.jsonl")}
    return subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "1",
                           FAULTS_TRAIN, "--steps", "60",
                           "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "15",
                           "--step-sleep", "0.2", "--threads", "1", *extra],
                          cwd=tmp_path, env=env, capture_output=True, timeout=600).returncode


def test_sparse_step_reports_count_every_step(tmp_path: Path) -> None:
    assert _train(tmp_path, "--fault", "exception@37") != 0  # the fault ends the first run
    assert _train(tmp_path) == 0  # resumes from the step-30 checkpoint
    evs = list(read_events(str(tmp_path / "events.jsonl")))
    steps = [e["step"] for e in evs if e.get("kind") == "progress"]
    assert 1 not in steps and 10 in steps  # reports every 10th step (and around saves)
    prod, high, counted, basis = goodput.productive(evs)
    assert (high, counted, basis) == (60, 60, goodput.STEP_REPORTS)
    # each step sleeps 0.2 s: 60 steps, once each, take at least 12 s of step time
    assert prod is not None and 12.0 <= prod
    runs = [float(e["ts"]) for e in evs if e.get("kind") == "resume"]
    assert prod <= float(evs[-1]["ts"]) - runs[0]  # never more than the wall of the runs
