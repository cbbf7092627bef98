"""Per-profile blind spots (issue 23 item 7) and the fabric services (item 9, fabric half)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck import checks_fabric as cf
from resilient_slurm.healthcheck import checks_gpu as cg
from resilient_slurm.healthcheck.config import HealthConfig, ProfileSpec
from resilient_slurm.healthcheck.profiles import shipped_profiles
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.proc import Outcome
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import P5, by_check, make_config, snap, write_scenario

REQUIRES = dataclasses.replace(P5, require_ecc=True, nvml_required=[
    "ecc", "ecc_mode", "remapped_rows", "clock_reasons", "utilization", "temperature", "pcie"])


def ctx(profile: ProfileSpec = REQUIRES) -> cg.GpuContext:
    return cg.GpuContext(HealthConfig(), profile)


# -- PCIe: a narrower link is a fault, busy or idle (issue 36 item 13) ----------------------

@pytest.mark.parametrize("values,status", [
    ({"pcie": (5, 8, 5, 16), "utilization": 97, "clock_reasons": 0}, "fail"),  # busy, x8
    ({"pcie": (5, 8, 5, 16), "utilization": 0, "clock_reasons": 1}, "fail"),   # idle, x8
    ({"pcie": (1, 8, 5, 16), "utilization": 3, "clock_reasons": 0}, "fail"),   # gen1 and x8
    ({"pcie": (1, 16, 5, 16), "utilization": 0, "clock_reasons": 1}, "ok"),    # idle: gen only
    ({"pcie": (5, 16, 5, 16), "utilization": 97, "clock_reasons": 0}, "ok"),   # full width
    ({"pcie": (5, 8, 5, 16), "utilization": "NOT_SUPPORTED",
      "clock_reasons": "NOT_SUPPORTED"}, "fail"),  # busy-ness does not matter
])
def test_pcie_width_below_max_fails_busy_or_idle(values, status):
    """Was: an idle (or unreadably busy) GPU's x8 link passed as a power-saving downtrain;
    idle GPUs lower the link's generation, never its width."""
    results = cg.evaluate_pcie(snap(g3=values), ctx(P5))
    assert {r.status for r in results} == {status}, results
    if status == "fail":
        (r,) = results
        assert (r.code, r.device, r.action) == ("PCIE_WIDTH", "gpu3", "drain")
        assert "x8 of x16" in r.reason


@pytest.mark.parametrize("name", sorted(shipped_profiles()))
def test_pcie_width_below_max_warns_at_least_on_every_profile(name):
    """Was ok on every profile for an idle GPU; on a profile without ``pcie_width``, even a
    busy one only warned, and an idle one passed."""
    prof = shipped_profiles()[name]
    for util, bits in ((97, 0), (0, 1)):
        (r,) = cg.evaluate_pcie(snap(g3={"pcie": (5, 8, 5, 16), "utilization": util,
                                         "clock_reasons": bits}), ctx(prof))
        assert r.status in ("warn", "fail") and r.code == "PCIE_WIDTH", (name, r)
        assert r.status == ("fail" if prof.pcie_width else "warn")


def test_pcie_width_on_a_profile_without_a_width_only_warns():
    (r,) = cg.evaluate_pcie(snap(g3={"pcie": (5, 8, 5, 16), "utilization": 0,
                                     "clock_reasons": 1}), ctx(ProfileSpec(gpus=8)))
    assert (r.status, r.code) == ("warn", "PCIE_WIDTH")


# -- NOT_SUPPORTED for a field the profile requires ------------------------------------------

@pytest.mark.parametrize("fn,field", [
    (cg.evaluate_row_remap, "remapped_rows"), (cg.evaluate_clocks, "clock_reasons"),
    (cg.evaluate_temperature, "temperature"), (cg.evaluate_pcie, "pcie"),
])
def test_not_supported_for_a_required_field_is_unknown(fn, field):
    """Was ok: a GPU that cannot report row remapping passed the row-remap check."""
    results = fn(snap(g6={field: "NOT_SUPPORTED"}), ctx())
    (r,) = [r for r in results if r.device == "gpu6"]
    assert (r.status, r.code) == ("unknown", "NVML_NOT_SUPPORTED")
    assert field in r.reason and "requires" in r.reason
    # A profile that does not require the field does not judge it.
    assert [x.status for x in fn(snap(g6={field: "NOT_SUPPORTED"}), ctx(P5))] == ["ok"]


# -- ECC off on a profile that requires ECC ---------------------------------------------------

def test_ecc_disabled_fails_where_the_profile_requires_ecc():
    """Was a warning everywhere (ECC counters NOT_SUPPORTED = ECC off)."""
    (r,) = cg.evaluate_ecc(snap(g2={"ecc": "NOT_SUPPORTED", "ecc_mode": (False, False)}), ctx())
    assert (r.status, r.code, r.device, r.action) == ("fail", "ECC_DISABLED", "gpu2", "drain")
    (r,) = cg.evaluate_ecc(snap(g2={"ecc_mode": (True, False)}), ctx())  # off after a reset
    assert (r.status, r.code) == ("fail", "ECC_DISABLED") and "pending" in r.reason
    (r,) = cg.evaluate_ecc(snap(g2={"ecc_mode": "NOT_SUPPORTED"}), ctx())
    assert r.status == "unknown"
    (r,) = cg.evaluate_ecc(snap(g2={"ecc": "NOT_SUPPORTED"}), ctx(P5))  # not required: warn
    assert (r.status, r.code) == ("warn", "ECC_DISABLED")
    assert [r.status for r in cg.evaluate_ecc(snap(), ctx())] == ["ok"]


# -- profiles ----------------------------------------------------------------------------------

def test_shipped_profiles_cover_a100_fabric_gb200_gb300_and_ada():
    p = shipped_profiles()
    assert p["p4d.24xlarge"].fabric_manager and not p["p4d.24xlarge"].nvswitch  # A100 HGX
    for name in ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"):
        assert p[name].fabric_manager and p[name].nvswitch and p[name].require_ecc
    for name in ("gb200-nvl72", "gb300-nvl72"):
        assert (p[name].gpu_generation, p[name].gpus, p[name].imex) == ("grace_blackwell", 4, True)
        assert p[name].nvswitch and not p[name].fabric_manager
    assert p["l40s-8gpu"].gpu_generation == "ada" and not p["l40s-8gpu"].nvlinks_per_gpu


def test_a_profile_naming_an_unknown_nvml_field_is_a_config_error(tmp_path):
    from resilient_slurm.config import ConfigError

    cfg = make_config(str(tmp_path), '[health.profiles.x]\nnvml_required = ["ecc", "eec"]\n')
    with pytest.raises(ConfigError, match="eec"):
        check_node(cfg, hardware=ScenarioHardware("healthy-p5"), node="n", profile="x",
                   only=["ecc"])


# -- the fabric manager / IMEX services -------------------------------------------------------

def _out(kind: str = "ok", stdout: str = "", rc: int | None = 0) -> Outcome:
    return Outcome(("systemctl",), kind, rc, stdout, "", 0.01)


@pytest.mark.parametrize("stdout,kind,status,code", [
    ("LoadState=loaded\nActiveState=active\nSubState=running\n", "ok", "ok", "OK"),
    ("LoadState=loaded\nActiveState=failed\nSubState=failed\n", "ok", "fail", "FM_INACTIVE"),
    ("LoadState=loaded\nActiveState=inactive\nSubState=dead\n", "ok", "fail", "FM_INACTIVE"),
    ("LoadState=not-found\nActiveState=inactive\nSubState=dead\n", "ok", "fail",
     "FM_NOT_INSTALLED"),
    ("LoadState=loaded\nActiveState=activating\nSubState=start\n", "ok", "unknown",
     "FM_STARTING"),
    ("", "missing", "unknown", "SYSTEMCTL_MISSING"),
    ("", "timeout", "unknown", "SYSTEMCTL_TIMEOUT"),
    ("System has not been booted with systemd", "nonzero", "unknown", "SYSTEMCTL_ERROR"),
    ("garbage\x13 ###", "ok", "unknown", "SYSTEMCTL_ERROR"),
])
def test_fabric_manager_unit_states(stdout, kind, status, code):
    r = cf.evaluate_unit(cf.FABRIC_MANAGER, _out(kind, stdout, 0 if kind == "ok" else 1))
    assert (r.status, r.code) == (status, code), r


@pytest.mark.parametrize("scenario_body,profile,status,code", [
    ("", "p5.48xlarge", "ok", "OK"),
    ('[tools.systemctl]\nfabricmanager = "failed"\n', "p5.48xlarge", "fail", "FM_INACTIVE"),
    ('[tools.systemctl]\nfabricmanager = "not-found"\n', "p4d.24xlarge", "fail",
     "FM_NOT_INSTALLED"),
    # The scenario's tool path ends in /usr/bin:/bin: where this machine has a systemctl of its
    # own it answers instead (and, without systemd, fails): unknown either way.
    ('[tools.systemctl]\nbehavior = "missing"\n', "p4d.24xlarge", "unknown", "SYSTEMCTL_"),
    ('[tools.systemctl]\nbehavior = "hang"\n', "p5.48xlarge", "unknown", "SYSTEMCTL_TIMEOUT"),
    ('[tools.systemctl]\nimex = "inactive"\n', "gb200-nvl72", "fail", "IMEX_INACTIVE"),
    ('[tools.systemctl]\nbehavior = "missing"\n', "l40s-8gpu", "ok", "SKIPPED"),
])
def test_fabric_services_through_the_real_runner(tmp_path, scenario_body, profile, status, code):
    """Was: an A100 HGX node with its fabric manager down passed (the fabric check said
    'profile has no NVSwitch fabric'); no check looked at the service on any profile."""
    cfg = make_config(str(tmp_path), tool_timeout_s=0.5, watchdog_s=3.0)
    scen = write_scenario(str(tmp_path), "s", scenario_body)
    report = check_node(cfg, hardware=ScenarioHardware(scen), node="n", profile=profile)
    (r,) = by_check(report, "fabric_manager")
    assert r.status == status and r.code.startswith(code), r
    if status != "ok":
        assert report.status in ("fail", "unknown")


def test_a100_hgx_with_its_fabric_manager_down_is_not_healthy(tmp_path):
    cfg = make_config(str(tmp_path), tool_timeout_s=0.5, watchdog_s=3.0)
    scen = write_scenario(str(tmp_path), "a100", '''
[gpu]
name = "NVIDIA A100-SXM4-80GB"
architecture = "ampere"
nvlink = 12
pcie = [1, 16, 4, 16]
fabric = "NOT_SUPPORTED"
[rdma]
efa = 4
[tools.systemctl]
fabricmanager = "inactive"
''')
    report = check_node(cfg, hardware=ScenarioHardware(scen), node="n", profile="p4d.24xlarge")
    assert report.status == "fail"
    assert ("fabric_manager", "fail") in {(r.check, r.status) for r in report.results}
    (fabric,) = by_check(report, "fabric")
    assert fabric.status == "ok"  # NVML's fabric state is not A100's signal


_LINE = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(list(cf.PROPERTIES) + ["Id", "Foo"]),
              st.sampled_from(["active", "running", "loaded", "not-found", "failed", "dead",
                               "inactive", "activating", "exited", ""]) | st.text(max_size=8)),
    st.text(max_size=30))


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(_LINE, max_size=8), kind=st.sampled_from(["ok", "nonzero"]))
def test_systemctl_output_is_never_read_as_healthy_unless_it_says_so(lines, kind):
    """Property: whatever systemctl prints, the unit is ok only when its last LoadState,
    ActiveState and SubState lines say loaded-or-other-than-not-found / active / running, and
    the tool exited 0; anything else is warn, fail or unknown, and nothing raises."""
    stdout = "\n".join(lines)
    r = cf.evaluate_unit(cf.IMEX, _out(kind, stdout, 0 if kind == "ok" else 1))
    state = cf.parse_show(stdout)
    if r.status == "ok":
        assert kind == "ok" and state["ActiveState"] == "active"
        assert state["SubState"] == "running" and state["LoadState"] != "not-found"
    else:
        assert r.status in ("warn", "fail", "unknown") and r.code
