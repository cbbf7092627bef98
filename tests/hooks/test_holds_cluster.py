"""Issue 23 item 5 on the real sandbox: a failure only the epilog can see keeps the node
drained through healthy periodic runs, until its check passes again or an admin clears it.

The simulated node keeps a process on GPU 3 after the job (scenario ``gpu-proc-left``, what
the epilog's ``gpu_procs`` finds); the periodic checks do not look at processes, so every
periodic check passes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from resilient_slurm_lab.sandbox.lifecycle import HEALTH_INTERVAL, config_path

from ..conftest import wait_until
from ..healthcheck.helpers import write_scenario
from .conftest import (
    PREFIX,
    events,
    fault,
    restore,
    run_health_as_slurm,
    run_health_not_skipped,
    submit,
)

pytestmark = pytest.mark.slurm
NODE = "node2"


def _drained_by_epilog(sandbox, slurm, tmp_path):
    fault(sandbox, NODE, "gpu-proc-left")  # shipped: a process stays on GPU 3
    jid = submit(slurm, sandbox, tmp_path, "hostname", "-N1", "-w", NODE)
    wait_until(lambda: slurm.job(jid).state in ("COMPLETED", "FAILED"), timeout=60)
    node = wait_until(lambda: (n := slurm.node(NODE)).drain and n, timeout=30)
    assert node.reason.startswith(f"{PREFIX}GPU_PROCS_LEFT gpu3"), node.reason
    return node


def _held_by_epilog(sandbox) -> None:
    holds = [e for e in events(sandbox, kind="hold", node=NODE, source="epilog")
             if e["check"] == "gpu_procs"]
    assert holds and holds[-1]["gpus"] == [3]


def test_epilog_only_failure_stays_drained_until_its_check_passes(sandbox, slurm,
                                                                  tmp_path) -> None:
    try:
        _drained_by_epilog(sandbox, slurm, tmp_path)
        for _ in range(5):  # more than resume_after (2) healthy periodic runs
            run_health_as_slurm(sandbox, NODE)
        node = slurm.node(NODE)
        assert node.drain and node.reason.startswith(PREFIX), node.describe()
        _held_by_epilog(sandbox)
        assert not [e for e in events(sandbox, kind="resume", node=NODE)
                    if e["ts"] > events(sandbox, kind="hold", node=NODE)[-1]["ts"]]
        health = [e for e in events(sandbox, kind="verdict", node=NODE, source="health")][-1]
        assert [r["code"] for r in health["evidence"]] == ["GPU_PROCS_LEFT"]  # re-run, only it
        # The process is gone, the node did not reboot (same boot id): gpu_procs passes again.
        fault(sandbox, NODE, write_scenario(str(tmp_path / "s"), "gpu-proc-gone", ""))
        for _ in range(3):  # not skipped: these runs, not slurmd's, resume it
            run_health_not_skipped(sandbox, NODE)
        wait_until(lambda: not slurm.node(NODE).drain, timeout=2 * HEALTH_INTERVAL)
        released = events(sandbox, kind="hold_released", node=NODE)
        assert released and released[-1]["cause"] == "gpu_procs passed again"
    finally:
        restore(sandbox, slurm, NODE)


def test_admin_clear_hold_lets_the_health_program_resume_the_node(sandbox, slurm,
                                                                   tmp_path) -> None:
    try:
        _drained_by_epilog(sandbox, slurm, tmp_path)
        for _ in range(3):
            run_health_as_slurm(sandbox, NODE)
        assert slurm.node(NODE).drain
        _held_by_epilog(sandbox)
        done = subprocess.run(
            [sys.executable, "-m", "resilient_slurm_lab.hardware.health", "clear-hold", "--node",
             NODE, "--config", config_path(sandbox), "--check", "gpu_procs"],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        assert "cleared hold gpu_procs GPU_PROCS_LEFT gpu3 (epilog)" in done.stdout
        assert f"{NODE}: no holds left" in done.stdout
        for _ in range(3):  # the process is still there: the admin vouched for the node
            run_health_not_skipped(sandbox, NODE)
        wait_until(lambda: not slurm.node(NODE).drain, timeout=2 * HEALTH_INTERVAL)
        assert events(sandbox, kind="hold_released", node=NODE, by="admin")
    finally:
        restore(sandbox, slurm, NODE)


def test_failed_dcgm_diag_holds_until_recheck_passes(sandbox, slurm, tmp_path) -> None:
    """The epilog's DCGM diagnostic after a failed job (here run as slurmd runs it, with a copy
    of the sandbox config that turns the diagnostic on) fails; no health run can afford to
    re-run it, so the node stays drained until `clear-hold --recheck` sees it pass."""
    node = "node1"
    conf = tmp_path / "diag.toml"
    text = open(config_path(sandbox)).read().replace(
        "[hooks]\n", "[hooks]\nepilog_diag_on_failure = true\nepilog_diag_level = 1\n", 1)
    conf.write_text(text)
    os.chmod(conf, 0o644)
    fault(sandbox, node, write_scenario(str(tmp_path / "s"), "diag-fail",
                                        '[tools.dcgmi]\ndiag = "fail"\n'))
    epilog = ("import sys; from resilient_slurm_lab.hardware.hooks import epilog_main; "
              f"sys.exit(epilog_main(['--config', {str(conf)!r}]))")
    env = {"SLURMD_NODENAME": node, "SLURM_JOB_ID": "990001", "SLURM_JOB_EXIT_CODE": "1",
           "SLURM_JOB_GPUS": "0,1"}
    recheck = [sys.executable, "-m", "resilient_slurm_lab.hardware.health", "clear-hold",
               "--node", node, "--config", str(conf), "--recheck"]
    try:
        done = subprocess.run([sys.executable, "-I", "-c", epilog], env=env, cwd="/",
                              timeout=120, capture_output=True, text=True)  # as slurmd runs it
        assert done.returncode == 1, done.stderr
        assert slurm.node(node).reason.startswith(f"{PREFIX}DCGM_DIAG")
        for _ in range(4):
            assert run_health_as_slurm(sandbox, node).returncode == 0  # periodic: healthy
        assert slurm.node(node).drain
        (hold,) = [e for e in events(sandbox, kind="hold", node=node, source="epilog")
                   if e["check"] == "dcgm_diag"]
        assert hold["gpus"] == [0, 1] and "clear-hold --recheck" in hold["until"]
        still = subprocess.run(recheck, capture_output=True, text=True, timeout=120)
        assert still.returncode == 1 and "kept hold dcgm_diag" in still.stdout, still.stdout
        fault(sandbox, node, write_scenario(str(tmp_path / "s"), "diag-pass", ""))
        passed = subprocess.run(recheck, capture_output=True, text=True, timeout=120)
        assert passed.returncode == 0 and "dcgm_diag passed again" in passed.stdout
        for _ in range(3):  # not skipped: these runs, not slurmd's, resume it
            run_health_not_skipped(sandbox, node)
        wait_until(lambda: not slurm.node(node).drain, timeout=2 * HEALTH_INTERVAL)
    finally:
        restore(sandbox, slurm, node)
