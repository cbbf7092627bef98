"""A verdict's exit code reaches the job's final state under ``KillOnBadExit=1`` (a sandbox
with it set): the launcher's step is cancelled when a rank fails (its other tasks end 143),
yet the job ends FAILED with the verdict's code (here 4, budget exhausted: a crash with no requeue
left), never the step's 143."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import launch_helpers  # type: ignore[import-not-found]  # tests/launcher is on sys.path
import pytest

from resilient_slurm.launcher.recovery import exits
from resilient_slurm.slurm import connect
from tests.conftest import TEST_PREFIX, _start_sandbox

pytestmark = [pytest.mark.slurm, pytest.mark.train]

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def kill_on_bad_exit() -> Iterator:
    yield from _start_sandbox(TEST_PREFIX + "kobe-", nodes=2, extra_conf=["KillOnBadExit=1"])


def test_verdict_exit_code_survives_kill_on_bad_exit(kill_on_bad_exit, tmp_path: Path) -> None:
    sbx = kill_on_bad_exit
    assert "KillOnBadExit=1" in Path(sbx.conf).read_text()
    s = connect(conf=sbx.conf, backend="cli", timeout=10)
    crash = tmp_path / "crash.py"
    crash.write_text("import sys, time\ntime.sleep(1)\nsys.exit(1)\n")
    batch = tmp_path / "job.sbatch"
    batch.write_text("#!/bin/bash\nexec " + " ".join([
        os.path.join(BIN, "resilient-launch"), "--nproc-per-node=1", "--max-restarts=0",
        "--max-requeues=0", "--term-timeout=3", "--verdict-path=", str(crash)]) + "\n")
    env = {**os.environ, "SLURM_CONF": sbx.conf, "PATH": BIN + ":" + os.environ["PATH"]}
    jid = s.submit(str(batch), ["--nodes=2", f"--output={tmp_path}/slurm-%j.out",
                                f"--chdir={tmp_path}"], env=env)
    job = launch_helpers.wait_job(s, jid, 300)
    log = (tmp_path / f"slurm-{jid}.out").read_text(errors="replace")
    assert (job.state, job.exit_code) == ("FAILED", exits.EXIT_BUDGET), log[-3000:]
    assert f"(exit {exits.EXIT_BUDGET})" in log
