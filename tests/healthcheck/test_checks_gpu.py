"""Pure evaluation of GPU snapshots."""

from __future__ import annotations

import pytest

from resilient_slurm.healthcheck import checks_gpu as cg
from resilient_slurm.healthcheck.config import HealthConfig, ProfileSpec
from resilient_slurm.healthcheck.gpu import GpuSnapshot

from .helpers import P5, snap

CTX = cg.GpuContext(HealthConfig(), P5)
ALL = [cg.evaluate_gpu_count, cg.evaluate_ecc, cg.evaluate_row_remap, cg.evaluate_retired_pages,
       cg.evaluate_clocks, cg.evaluate_temperature, cg.evaluate_nvlink, cg.evaluate_pcie,
       cg.evaluate_fabric, cg.evaluate_recovery_action, cg.evaluate_gpu_procs,
       cg.evaluate_gpu_memory]


@pytest.mark.parametrize("fn", ALL)
def test_healthy_snapshot_is_ok(fn):
    results = fn(snap(), CTX)
    assert [r.status for r in results] == ["ok"], results


@pytest.mark.parametrize("fn", ALL)
@pytest.mark.parametrize("state,status", [("timeout", "unknown"), ("init_error", "unknown"),
                                          ("error", "unknown")])
def test_unusable_nvml_never_ok(fn, state, status):
    s = GpuSnapshot(state=state, error="DRIVER_NOT_LOADED", hung_call="nvmlInit")
    results = fn(s, CTX)
    assert results and all(r.status == status for r in results)


def test_gpu_lost_in_error_state_fails():
    s = GpuSnapshot(state="error", error="GPU_IS_LOST in nvmlDeviceGetCount")
    (r,) = cg.evaluate_gpu_count(s, CTX)
    assert r.status == "fail" and r.code == "GPU_LOST"


def test_gpu_count_short_and_lost():
    (r,) = cg.evaluate_gpu_count(snap(7), CTX)
    assert (r.status, r.code) == ("fail", "GPU_COUNT")
    results = cg.evaluate_gpu_count(snap(g3={"ecc": "GPU_IS_LOST"}), CTX)
    assert [(r.status, r.code, r.device) for r in results] == [("fail", "GPU_LOST", "gpu3")]
    # other checks say they could not check it: never ok for that GPU
    (e,) = cg.evaluate_ecc(snap(g3={"ecc": "GPU_IS_LOST"}), CTX)
    assert (e.status, e.device) == ("unknown", "gpu3")


def test_ecc():
    (r,) = cg.evaluate_ecc(snap(g5={"ecc": (2, 2)}), CTX)
    assert (r.status, r.code, r.device, r.action) == ("fail", "ECC_DBE", "gpu5", "reset_gpu")
    assert r.evidence.startswith("gpu5 ")
    (r,) = cg.evaluate_ecc(snap(g5={"ecc": (0, 3)}), CTX)
    assert (r.status, r.code) == ("warn", "ECC_DBE_AGGREGATE")
    (r,) = cg.evaluate_ecc(snap(g1={"ecc": "NOT_SUPPORTED"}), CTX)
    assert (r.status, r.code) == ("warn", "ECC_DISABLED")


def test_every_failing_gpu_is_reported_not_only_the_first():
    results = cg.evaluate_ecc(snap(g1={"ecc": (1, 1)}, g6={"ecc": (4, 4)}), CTX)
    assert [r.device for r in results] == ["gpu1", "gpu6"]


def test_row_remap():
    (r,) = cg.evaluate_row_remap(snap(g2={"remapped_rows": (0, 1, True, False)}), CTX)
    assert (r.status, r.code, r.action) == ("fail", "ROW_REMAP_PENDING", "reset_gpu")
    (r,) = cg.evaluate_row_remap(snap(g2={"remapped_rows": (0, 9, False, True)}), CTX)
    assert (r.status, r.code) == ("fail", "ROW_REMAP_FAILURE")
    (r,) = cg.evaluate_row_remap(snap(g2={"remapped_rows": "NOT_SUPPORTED"}), CTX)
    assert r.status == "ok"  # pre-Ampere


def test_retired_pages():
    (r,) = cg.evaluate_retired_pages(snap(g0={"retired_pages": (3, True)}), CTX)
    assert r.code == "PAGE_RETIRE_PENDING"
    (r,) = cg.evaluate_retired_pages(snap(g0={"retired_pages": (61, False)}), CTX)
    assert r.code == "PAGES_RETIRED"
    (r,) = cg.evaluate_retired_pages(snap(g0={"retired_pages": "NOT_SUPPORTED"}), CTX)
    assert r.status == "ok"


@pytest.mark.parametrize("bits,status,code", [
    (0x8, "fail", "CLOCK_HW_SLOWDOWN"), (0x40, "fail", "CLOCK_HW_SLOWDOWN"),
    (0x80, "fail", "CLOCK_HW_SLOWDOWN"), (0x20, "warn", "CLOCK_SW_THERMAL"),
    (0x4, "ok", "OK"), (0x1, "ok", "OK"), (0x0, "ok", "OK"),
])
def test_clock_reasons(bits, status, code):
    (r,) = cg.evaluate_clocks(snap(g4={"clock_reasons": bits}), CTX)
    assert (r.status, r.code) == (status, code)


def test_temperature_thresholds():
    assert cg.evaluate_temperature(snap(g0={"temperature": 95}), CTX)[0].status == "fail"
    assert cg.evaluate_temperature(snap(g0={"temperature": 86}), CTX)[0].status == "warn"
    ctx = cg.GpuContext(HealthConfig(temperature_fail_c=80), P5)
    assert cg.evaluate_temperature(snap(g0={"temperature": 81}), ctx)[0].status == "fail"


def test_nvlink():
    links = [True] * 16 + [False, False]
    (r,) = cg.evaluate_nvlink(snap(g7={"nvlink": links}), CTX)
    assert (r.status, r.code, r.device) == ("fail", "NVLINK_DOWN", "gpu7")
    assert "16,17" in r.evidence
    (r,) = cg.evaluate_nvlink(snap(g7={"nvlink": "NOT_SUPPORTED"}), CTX)
    assert r.status == "fail"
    no_nvl = cg.GpuContext(HealthConfig(), ProfileSpec(gpus=8))
    assert cg.evaluate_nvlink(snap(g7={"nvlink": "NOT_SUPPORTED"}), no_nvl)[0].status == "ok"


def test_pcie_idle_gpu_is_not_failed_for_low_current_gen():
    (r,) = cg.evaluate_pcie(snap(g0={"pcie": (1, 16, 5, 16), "clock_reasons": 1}), CTX)
    assert r.status == "ok"
    (r,) = cg.evaluate_pcie(snap(g0={"pcie": (5, 8, 5, 16), "clock_reasons": 0}), CTX)
    assert (r.status, r.code) == ("fail", "PCIE_WIDTH")  # busy (not idle): issue 23 item 7
    (r,) = cg.evaluate_pcie(snap(g0={"pcie": (4, 16, 4, 16)}), CTX)
    assert (r.status, r.code) == ("fail", "PCIE_DEGRADED")


def test_fabric():
    (r,) = cg.evaluate_fabric(snap(g1={"fabric": "in_progress"}), CTX)
    assert (r.status, r.code) == ("fail", "FABRIC_NOT_READY")
    no_sw = cg.GpuContext(HealthConfig(), ProfileSpec(gpus=8))
    assert cg.evaluate_fabric(snap(g1={"fabric": "in_progress"}), no_sw)[0].status == "ok"


@pytest.mark.parametrize("value,action", [(1, "reset_gpu"), (2, "reboot"), (3, "drain"),
                                          (4, "reset_gpu"), (42, "drain")])
def test_recovery_action(value, action):
    (r,) = cg.evaluate_recovery_action(snap(g2={"recovery_action": value}), CTX)
    assert (r.status, r.action) == ("fail", action)
    (r,) = cg.evaluate_recovery_action(snap(g2={"recovery_action": "NOT_SUPPORTED"}), CTX)
    assert r.status == "ok"  # driver < 570


def test_epilog_leftovers():
    (r,) = cg.evaluate_gpu_procs(snap(g0={"processes": [123, 456]}), CTX)
    assert (r.status, r.code) == ("fail", "GPU_PROCS_LEFT") and "123" in r.evidence
    (r,) = cg.evaluate_gpu_memory(snap(g0={"memory": 70000}), CTX)
    assert (r.status, r.code) == ("fail", "GPU_MEM_NOT_RELEASED")


def test_field_errors_fail_closed():
    (r,) = cg.evaluate_temperature(snap(g0={"temperature": "UNKNOWN"}), CTX)
    assert r.status == "unknown" and r.code == "NVML_UNKNOWN"
    (r,) = cg.evaluate_temperature(snap(g0={"temperature": "RESET_REQUIRED"}), CTX)
    assert (r.status, r.code) == ("fail", "GPU_RESET_REQUIRED")


def test_ok_results_show_the_values_they_judged() -> None:
    s = snap(2, g1={"temperature": 51, "clock_reasons": 0x4, "retired_pages": "NOT_SUPPORTED"})
    ev = {f.__name__[len("evaluate_"):]: f(s, CTX)[0] for f in ALL}
    assert all(r.status == "ok" for k, r in ev.items() if k != "gpu_count")  # 2 of 8 GPUs
    assert ev["temperature"].evidence == "temperature: gpu0 40C; gpu1 51C"
    assert ev["clocks"].evidence == "clock_reasons: gpu0 0x1; gpu1 0x4"
    assert ev["ecc"].evidence == "ecc: gpu0 volatile=0 aggregate=0; gpu1 volatile=0 aggregate=0"
    assert ev["pcie"].evidence.startswith("pcie: gpu0 gen1 x16 (max gen5 x16)")
    assert ev["row_remap"].evidence.startswith("remapped_rows: gpu0 correctable=0 "
                                               "uncorrectable=0 pending=False failure=False")
    assert ev["retired_pages"].evidence == ("retired_pages: gpu0 dbe_pages=0 pending=False; "
                                            "gpu1 NOT_SUPPORTED")
    assert ev["recovery_action"].evidence == "recovery_action: gpu0 0; gpu1 0"
    assert ev["nvlink"].evidence == "nvlink: gpu0 18/18 up; gpu1 18/18 up"
