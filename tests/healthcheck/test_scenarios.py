"""Every shipped scenario through the real engine: verdict, failing check, readable reason."""

from __future__ import annotations

import pytest

from resilient_slurm.config import ConfigError
from resilient_slurm.healthcheck.engine import CHECK_SETS, CHECKS
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import shipped_scenarios

from .helpers import by_check, make_config

# scenario -> (exit code, [(check, code, device)] that must be among the not-ok results)
EXPECTED = {
    "healthy-p5": (0, []),
    "boot-noise": (0, []),
    "xid79": (1, [("gpu_count", "GPU_LOST", "gpu3"), ("xid", "XID79", "gpu3")]),
    "ecc-uncorrectable": (1, [("ecc", "ECC_DBE", "gpu5"), ("xid", "XID48", "gpu5")]),
    "row-remap-pending": (1, [("row_remap", "ROW_REMAP_PENDING", "gpu2")]),
    "efa-port-down": (1, [("efa", "EFA_PORT_DOWN", "rdmap33s0:1")]),
    "efa-missing": (1, [("efa", "EFA_COUNT", None)]),
    "nvml-hang": (1, [("gpu_count", "NVML_TIMEOUT", None), ("xid", "XID119", "gpu0")]),
    "dcgmi-missing": (3, [("dcgm_health", "DCGMI_MISSING", None)]),
    "dcgmi-hang": (3, [("dcgm_health", "DCGMI_TIMEOUT", None)]),
    "thermal-slowdown": (1, [("clocks", "CLOCK_HW_SLOWDOWN", "gpu6"),
                             ("temperature", "GPU_TEMP", "gpu6")]),
    "forged-xid": (0, []),
    "flood-then-fatal": (1, [("xid", "XID79", "gpu3")]),
    "fabric-manager-down": (1, [("fabric_manager", "FM_INACTIVE", None)]),
    "pcie-x8-busy": (1, [("pcie", "PCIE_WIDTH", "gpu4")]),
    "healthy-gb200": (0, []),
    "b200-under-p5": (1, [("gpu_count", "GPU_GENERATION", "gpu0"), ("xid", "XID145", "gpu0")]),
    "xid74-ignorable": (1, [("xid", "XID74", "gpu5")]),
    "xid154-by-value": (1, [("xid", "XID154", "gpu2")]),
    "efa-admin-queue-dead": (1, [("efa_driver", "EFA_DRIVER_FATAL", None)]),
    "ib-mlx5-fatal": (1, [("ib_driver", "IB_DRIVER_FATAL", "0000:3b:00.0"),
                          ("ib_driver", "IB_LINK_FLAP", "ibp94s0")]),
    "ib-mlx5-noise": (0, []),
    "gpu-proc-left": (0, []),  # the periodic set does not look; the epilog does (holds tests)
}


@pytest.fixture()
def fast_config(tmp_path):
    return make_config(str(tmp_path), nvml_timeout_s=1.0, tool_timeout_s=1.0, watchdog_s=5.0)


def test_every_listed_scenario_is_shipped():
    assert set(EXPECTED) <= set(shipped_scenarios())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_scenario_verdict(name, fast_config):
    code, must = EXPECTED[name]
    report = check_node(fast_config, hardware=ScenarioHardware(name), node="sim1")
    assert report.simulated is True
    assert report.exit_code == code, [r.to_json() for r in report.results if r.status != "ok"]
    bad = {(r.check, r.code, r.device) for r in report.results if r.status != "ok"}
    for item in must:
        assert item in bad, (item, bad)
    for r in report.results:
        assert r.reason and r.code == r.code.upper() and len(r.code) <= 32
    if code == 0:
        assert report.status in ("ok", "warn")


def test_dcgmi_missing_when_diag_runs(fast_config):
    # The prolog set holds no diagnostic (issue 12 item 12); run on demand, a missing dcgmi
    # is still unknown.
    report = check_node(fast_config, check_set="prolog",
                        hardware=ScenarioHardware("dcgmi-missing"), node="s",
                        only=["dcgm_diag"])
    (r,) = by_check(report, "dcgm_diag")
    assert (r.status, r.code) == ("unknown", "DCGMI_MISSING")


def test_check_sets_are_known_checks():
    for names in CHECK_SETS.values():
        assert set(names) <= set(CHECKS)
    assert "gpu_procs" in CHECK_SETS["epilog"] and "gpu_memory" in CHECK_SETS["epilog"]
    # No diagnostic in the default prolog or periodic sets: it cannot finish in their budgets.
    assert "dcgm_diag" not in CHECK_SETS["prolog"] and "dcgm_diag" not in CHECK_SETS["periodic"]


def test_only_and_kill_switch(tmp_path):
    cfg = make_config(str(tmp_path), "[health.checks.ecc]\nenabled = false\n")
    report = check_node(cfg, hardware=ScenarioHardware("ecc-uncorrectable"), only=["ecc",
                        "row_remap"], node="s")
    assert {r.check for r in report.results} == {"profile", "ecc", "row_remap"}
    (ecc,) = by_check(report, "ecc")
    assert ecc.code == "DISABLED"
    assert report.exit_code == 0


def test_bad_names_raise_config_error(fast_config, tmp_path):
    with pytest.raises(ConfigError, match="--only"):
        check_node(fast_config, hardware=ScenarioHardware("healthy-p5"), only=["nope"])
    with pytest.raises(ConfigError, match="no shipped scenario"):
        check_node(fast_config, hardware=ScenarioHardware("no-such-scenario"))
    with pytest.raises(ConfigError, match="--profile"):
        check_node(fast_config, hardware=ScenarioHardware("healthy-p5"), profile="p99")
    cfg = make_config(str(tmp_path), "[health.checks.bogus]\nenabled = false\n")
    with pytest.raises(ConfigError, match="health.checks.bogus"):
        check_node(cfg, hardware=ScenarioHardware("healthy-p5"))


def test_profile_selection(tmp_path):
    cfg = make_config(str(tmp_path), '[health.profile_patterns]\n"gpu-*" = "p4d.24xlarge"\n')
    assert check_node(cfg, hardware=ScenarioHardware("healthy-p5"), node="gpu-1",
                      only=["efa"]).profile == "p4d.24xlarge"
    r = check_node(cfg, hardware=ScenarioHardware("healthy-p5"), node="queue-st-p548xlarge-3",
                   only=["efa"])
    assert r.profile == "p5.48xlarge"
    r = check_node(cfg, hardware=ScenarioHardware("healthy-p5"), node="x", only=["efa"],
                   profile="ib-8gpu")
    assert r.profile == "ib-8gpu"


def test_auto_profile_is_reported(tmp_path, monkeypatch):
    cfg = make_config(str(tmp_path))
    scen = tmp_path / "s.toml"
    scen.write_text('base = "healthy-p5"\nprofile = ""\n')
    report = check_node(cfg, hardware=ScenarioHardware(str(scen)), node="plain", only=["gpu_count"])
    (p,) = by_check(report, "profile")
    # Issue 12 item 6: an unmatched node is unknown (drained) unless the admin chose that.
    assert (p.status, p.code) == ("unknown", "PROFILE_UNMATCHED")
    assert report.exit_code == 3
    allowed = make_config(str(tmp_path), "allow_unmatched_profile = true\n")
    report = check_node(allowed, hardware=ScenarioHardware(str(scen)), node="plain",
                        only=["gpu_count"])
    (p,) = by_check(report, "profile")
    assert (p.status, p.code) == ("warn", "PROFILE_AUTO")


def test_gpu_scope(fast_config):
    report = check_node(fast_config, check_set="prolog",
                        hardware=ScenarioHardware("ecc-uncorrectable"),
                        node="s", gpu_indices=[0, 1])
    assert [r.status for r in by_check(report, "ecc")] == ["ok"]
    report = check_node(fast_config, check_set="prolog",
                        hardware=ScenarioHardware("ecc-uncorrectable"),
                        node="s", gpu_indices=[5])
    assert [r.code for r in by_check(report, "ecc")] == ["ECC_DBE"]


def test_real_path_without_gpu_fails_closed(tmp_path):
    """No simulation configured: the real NVML path. On a machine without a GPU driver,
    NVML init fails and the verdict is unknown, never ok."""
    cfg = make_config(str(tmp_path), nvml_timeout_s=5.0)
    report = check_node(cfg, only=["gpu_count"], node="real")
    assert report.simulated is False
    (r,) = by_check(report, "gpu_count")
    if r.status == "ok":
        pytest.skip("this machine has a working NVML")
    assert r.status in ("unknown", "fail") and r.code.startswith("NVML")


def test_gpu_index_out_of_range_is_not_ok(fast_config):
    report = check_node(fast_config, check_set="prolog", hardware=ScenarioHardware("healthy-p5"),
                        node="s",
                        gpu_indices=[9])
    assert report.exit_code == 3


def test_bad_scenario_data_is_a_config_error(fast_config, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "healthy-p5"\n[rdma]\nefa = "lots"\n')
    with pytest.raises(ConfigError, match="simulate"):
        check_node(fast_config, hardware=ScenarioHardware(str(bad)), node="s")
    bad.write_text("not toml [")
    with pytest.raises(ConfigError, match="simulate"):
        check_node(fast_config, hardware=ScenarioHardware(str(bad)), node="s")
