"""Issue 23 item 6: ``dcgmi diag`` is scoped to the job's GPUs when a hook knows them.

The fake ``dcgmi`` (the scenario's tool seam) appends its argv to a file; the engine and the
epilog are the real ones.
"""

from __future__ import annotations

from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import install_scenario

from ..healthcheck.helpers import make_config, write_scenario
from .conftest import hook_config, run_hook


def _recording(tmp_path, diag: str = "pass") -> tuple[str, str]:
    log = tmp_path / "dcgmi-argv.log"
    scen = write_scenario(str(tmp_path / "s"), "rec", f'[tools.dcgmi]\ndiag = "{diag}"\n'
                          f'argv_log = "{log}"\n')
    return scen, str(log)


def _diag_calls(log: str) -> list[list[str]]:
    with open(log) as fh:
        return [line.split() for line in fh if line.startswith("diag")]


def test_engine_passes_the_scoped_gpus_to_dcgmi_diag(tmp_path):
    scen, log = _recording(tmp_path)
    cfg = make_config(str(tmp_path), dcgm_diag_level=1)
    check_node(cfg, hardware=ScenarioHardware(scen), node="n1", only=["dcgm_diag"], gpu_indices=[4,
               5])
    check_node(cfg, hardware=ScenarioHardware(scen), node="n1", only=["dcgm_diag"])
    scoped, unscoped = _diag_calls(log)
    assert scoped[scoped.index("-i") + 1] == "4,5" and scoped[scoped.index("-r") + 1] == "1"
    assert "-i" not in unscoped  # the health program's run: every GPU


def test_epilog_diag_after_a_failed_job_runs_on_the_jobs_gpus_only(tmp_path):
    config = hook_config(tmp_path, "epilog_diag_on_failure = true\nepilog_diag_level = 1\n")
    scen, log = _recording(tmp_path)
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), scen)
    done = run_hook("epilog", config, {"SLURM_JOB_GPUS": "2,3", "SLURM_JOB_EXIT_CODE": "1"})
    assert done.returncode == 0, done.stderr
    (call,) = _diag_calls(log)
    assert call[call.index("-i") + 1] == "2,3", call
