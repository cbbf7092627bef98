"""The fault matrix: every check x {tool/library missing, hang, garbage output, permission
denied, NVML init failure} -> never ``ok``. Cells that cannot apply to a check's seam are
listed as not applicable; the test prints how many cells it covered."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from resilient_slurm.healthcheck import tools
from resilient_slurm.healthcheck.engine import CHECKS
from resilient_slurm.healthcheck.model import worst
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import by_check, make_config, write_scenario

FAULTS = ("missing", "hang", "garbage", "denied", "nvml_init")
NVML_FIELD = {
    "ecc": "ecc", "row_remap": "remapped_rows", "retired_pages": "retired_pages",
    "clocks": "clock_reasons", "temperature": "temperature", "nvlink": "nvlink", "pcie": "pcie",
    "fabric": "fabric", "recovery_action": "recovery_action", "gpu_procs": "processes",
    "gpu_memory": "memory", "error_rates": "ecc_corrected",
}
NVML_INIT = '[nvml]\nbehavior = "init_error"\nerror = "DRIVER_NOT_LOADED"\n'
LOG_EVENT = {
    "xid": "NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    "sxid": "nvidia-nvswitch1: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 4 timeout",
    "efa_driver": "efa 0000:a8:00.0 rdmap168s0: Admin queue is closed",
    "ib_driver": "mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected",
}
LOG_GARBAGE = {
    "xid": "NVRM: Xid (PCI:0000:53:00): \\u0013\\u0000 ### torn record",
    "sxid": "nvidia-nvswitch1: SXid (PCI:0000:05:00.0) \\u0013 ### torn record",
}


@dataclass
class Cell:
    body: str = ""  # scenario TOML added to healthy-p5
    profile: str | None = None
    storage: Callable[[str, bool], list[str]] | None = None  # replaces the probe argv
    storage_path: str | None = None


def cell_for(check: str, fault: str, tmp: str) -> Cell | None:
    """How to inflict ``fault`` on ``check``'s seam; None = not applicable."""
    if check == "gpu_count":
        return Cell({
            "missing": '[nvml]\nbehavior = "library_missing"\n',
            "hang": '[nvml]\nbehavior = "hang"\n',
            "garbage": '[nvml]\ncount = "eight-ish"\n',
            "denied": '[nvml]\nbehavior = "init_error"\nerror = "NO_PERMISSION"\n',
            "nvml_init": NVML_INIT,
        }[fault])
    if check in NVML_FIELD:
        f = NVML_FIELD[check]
        return Cell({
            "missing": '[nvml]\nbehavior = "library_missing"\n',
            "hang": f'[gpus.2]\n{f} = "HANG"\n',
            "garbage": f'[gpus.2]\n{f} = "garbage"\n',
            "denied": f'[gpus.2]\n{f} = "NO_PERMISSION"\n',
            "nvml_init": NVML_INIT,
        }[fault])
    if check in LOG_EVENT:
        if fault == "garbage" and check not in LOG_GARBAGE:
            return None  # an EFA line we cannot read is indistinguishable from any other line
        if fault == "nvml_init":  # the fallback: the kernel log still reports the fault
            return Cell(NVML_INIT + f'[kernel_log]\nappend = ["{LOG_EVENT[check]}"]\n')
        if fault == "garbage":
            return Cell(f'[kernel_log]\nappend = ["{LOG_GARBAGE[check]}"]\n')
        return Cell(f'[kernel_log]\nbehavior = "{fault}"\n')
    if check in ("efa", "infiniband"):
        key, prof = ("efa", None) if check == "efa" else ("ib", "ib-8gpu")
        if fault in ("hang", "nvml_init"):
            return None  # sysfs attribute reads do not block; NVML is not involved
        if fault == "missing":
            return Cell(f"[rdma]\n{key} = 0\n", prof)
        if fault == "garbage":
            return Cell(f'[rdma]\n{key} = {32 if key == "efa" else 8}\n{key}_rate = "fast-ish"\n',
                        prof)
        return Cell(f"[rdma]\n{key} = 8\nunreadable = true\n", prof)  # denied
    if check == "fabric_manager":  # p5 requires nvidia-fabricmanager: systemctl is the tool
        if fault == "nvml_init":
            return None
        return Cell(f'[tools.systemctl]\nbehavior = "{fault}"\n')
    if check in ("fi_info", "dcgm_diag", "dcgm_health"):
        if fault == "nvml_init":
            return None
        tool = "fi_info" if check == "fi_info" else "dcgmi"
        return Cell(f'[tools.{tool}]\nbehavior = "{fault}"\n')
    if check in ("allreduce_bw", "loopback_bw"):  # the validation set's bandwidth probes
        if fault == "nvml_init" or (check == "allreduce_bw" and fault == "missing"):
            return None  # no NVML; without all_reduce_perf the torch probe runs instead
        tool = "all_reduce_perf" if check == "allreduce_bw" else "fi_pingpong"
        return Cell(f'[tools.{tool}]\nbehavior = "{fault}"\n')
    if check == "storage":
        if fault == "nvml_init":
            return None
        if fault == "missing":
            return Cell(storage_path=f"{tmp}/not-there")
        script = {
            "hang": "import time; time.sleep(30)",
            "garbage": "print('\\x13#### garbage')",
            "denied": "import sys; sys.stderr.write('PermissionError: [Errno 13] Permission "
                      "denied\\n'); sys.exit(1)",
        }[fault]
        return Cell(storage=lambda p, m: [sys.executable, "-c", script],
                    storage_path=tmp)
    raise AssertionError(f"no fault cells defined for check {check}")


# The whole engine over every cell: fake tools run as processes, hangs wait out their timeouts
# (about 13 s a mode). An integration test: `make test` runs it, `make test-unit` does not;
# test_properties.py keeps the evaluators' "never ok on failure" in the unit set.
@pytest.mark.integration
@pytest.mark.parametrize("mode", ["profile", "auto"])
def test_fault_matrix(tmp_path, monkeypatch, capsys, mode):
    """``profile``: the check itself is never ok. ``auto`` (issue 12 item 6: no profile
    matches the node, none named): the node's verdict is never ok or warn."""
    covered, not_applicable, failures = 0, [], []
    for check in CHECKS:
        for fault in FAULTS:
            cell = cell_for(check, fault, str(tmp_path))
            if cell is None:
                not_applicable.append(f"{check}x{fault}")
                continue
            d = tmp_path / f"{check}-{fault}"
            body = ('profile = ""\n' if mode == "auto" else "") + cell.body
            scen = write_scenario(str(d), "s", body)
            extra = {}
            if cell.storage_path:
                extra = {"storage_paths": [cell.storage_path], "storage_require_mount": False}
            cfg = make_config(str(d), nvml_timeout_s=0.5, tool_timeout_s=0.5,
                              dcgm_diag_timeout_s=0.5, storage_timeout_s=0.5, watchdog_s=1.5,
                              **extra)
            with monkeypatch.context() as m:
                if cell.storage:
                    m.setattr(tools, "storage_argv", cell.storage)
                report = check_node(cfg, hardware=ScenarioHardware(scen), node="fm", only=[check],
                                    profile=cell.profile if mode == "profile" else None)
            results = by_check(report, check)
            if mode == "auto":
                if report.status in ("ok", "warn"):
                    failures.append((check, fault, [r.to_json() for r in report.results]))
            elif not results or worst([r.status for r in results]) == "ok":
                failures.append((check, fault, [r.to_json() for r in results]))
            covered += 1
    total = len(CHECKS) * len(FAULTS)
    with capsys.disabled():
        print(f"\nfault matrix ({mode}): {covered} of {total} cells covered "
              f"({len(not_applicable)} not applicable: {', '.join(not_applicable)})")
    assert not failures, failures
    assert covered >= 90


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_every_check_has_fault_cells(check, tmp_path):
    assert any(cell_for(check, f, str(tmp_path)) for f in FAULTS)
