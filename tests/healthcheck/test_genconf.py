"""``resilient-health genconf``: a profile from a known-good node, read at the hardware seams
(simulated scenarios: fake NVML, a real sysfs tree, real tool executables)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

from click.testing import CliRunner

from resilient_slurm.config import load_config, tomllib
from resilient_slurm.healthcheck.genconf import FLOOR_KEYS, observe, render
from resilient_slurm.healthcheck.profiles import shipped_profiles
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.hooks.health_cli import main
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import Scenario, scenario_path

from .helpers import by_check, write_scenario


def _genconf(tmp_path, *args: str) -> tuple[int, str, str]:
    cfg = tmp_path / "base.toml"
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nnvml_timeout_s = 1\n")
    res = CliRunner().invoke(main, ["genconf", "--config", str(cfg), "--node", "n1", *args])
    return res.exit_code, res.stdout, res.stderr


def _profile(text: str, name: str) -> dict:
    return tomllib.loads(text)["health"]["profiles"][name]


def test_healthy_p5_gives_the_shipped_p5_profile(tmp_path) -> None:
    code, out, err = _genconf(tmp_path, "--simulate", "healthy-p5", "--name", "p5",
                              "--match", "p5-*")
    assert code == 0, err
    got = _profile(out, "p5")
    want = dataclasses.asdict(shipped_profiles()["p5.48xlarge"])
    want["match"] = ["p5-*"]
    for floor in FLOOR_KEYS:  # a bandwidth floor is measured by the validation, not observed
        assert (got.pop(floor), want.pop(floor)) == (0.0, shipped_profiles()[
            "p5.48xlarge"].__dict__[floor]) and floor in out + err
    assert got == want
    assert "NVIDIA H100 80GB HBM3" in out and "550.90.07" in out  # the header says from what


def test_default_name_and_output_file(tmp_path) -> None:
    dest = tmp_path / "prof.toml"
    code, out, err = _genconf(tmp_path, "--simulate", "healthy-p5", "-o", str(dest))
    assert code == 0 and out == "", err
    assert "8x-nvidia-h100-80gb-hbm3" in tomllib.loads(dest.read_text())["health"]["profiles"]


def test_profile_round_trip_with_check(tmp_path) -> None:
    """The written fragment is a valid config: the healthy node passes with it, the same node
    with one EFA port down fails on it."""
    code, frag, _ = _genconf(tmp_path, "--simulate", "healthy-p5", "--name", "site-p5")
    assert code == 0
    path = tmp_path / "site.toml"
    path.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\n" + frag)
    config = load_config(str(path), env={})
    ok = check_node(config, hardware=ScenarioHardware("healthy-p5"), profile="site-p5", node="n1")
    assert ok.exit_code == 0, [r.to_json() for r in ok.results if r.status != "ok"]
    bad = check_node(config, hardware=ScenarioHardware("efa-port-down"), profile="site-p5",
                     node="n1")
    assert bad.exit_code == 1
    assert by_check(bad, "efa")[0].code == "EFA_PORT_DOWN"


def test_port_down_is_not_known_good(tmp_path) -> None:
    dest = tmp_path / "prof.toml"
    code, _, err = _genconf(tmp_path, "--simulate", "efa-port-down", "-o", str(dest))
    assert code == 1
    assert "rdmap33s0:1 (efa) is DOWN" in err and "nothing written" in err
    assert not dest.exists()
    code, _, err = _genconf(tmp_path, "--simulate", "efa-port-down", "-o", str(dest), "--force")
    assert code == 0, err
    text = dest.read_text()
    assert "# PROBLEM (written anyway, --force): rdmap33s0:1 (efa) is DOWN" in text
    assert _profile(text, "8x-nvidia-h100-80gb-hbm3")["efa"] == 32  # adapters, down or not


def test_unequal_gpus_and_nvml_errors_are_problems(tmp_path) -> None:
    scen = write_scenario(str(tmp_path), "odd", """
[gpus.2]
nvlink = [true, true, false, true]
[gpus.5]
pcie = "NO_PERMISSION"
[gpus.6]
pcie = [5, 8, 5, 16]
fabric = "in_progress"
""")
    obs = observe(Scenario(scen).gpu_backend(), str(tmp_path / "nosys"), "/nonexistent", 2.0)
    assert obs.problems == [
        "gpu2: NVLink(s) 2 down",
        "gpu5: NVML NO_PERMISSION reading pcie",
        "gpu6: PCIe link running x8 of x16",
        "GPUs have different numbers of NVLinks up: [3, 18]",
        "GPU fabric state completed, in_progress: an NVSwitch node that is ready reports "
        "completed",
    ]
    assert obs.spec.nvswitch is False and obs.spec.nvlinks_per_gpu == 3


def test_infiniband_node_without_tools(tmp_path) -> None:
    scen = write_scenario(str(tmp_path), "ib", """
[gpu]
name = "NVIDIA A100-SXM4-80GB"
architecture = 7
nvlink = 12
pcie = [4, 16, 4, 16]
fabric = "NOT_SUPPORTED"
[rdma]
efa = 0
ib = 8
ib_rate = "200 Gb/sec (4X HDR)"
[tools.dcgmi]
behavior = "missing"
[tools.fi_info]
behavior = "missing"
""")
    code, out, err = _genconf(tmp_path, "--simulate", scen, "--name", "a100-ib")
    assert code == 0, err
    prof = _profile(out, "a100-ib")
    assert prof | {"match": []} == {
        "match": [], "gpus": 8, "gpu_generation": "ampere", "efa": 0, "efa_min_rate_gbps": 0.0,
        "ib_ports": 8, "ib_min_rate_gbps": 200.0, "nvlinks_per_gpu": 12, "nvswitch": False,
        "pcie_gen": 4, "pcie_width": 16, "require_dcgm": False, "require_fi_info": False,
        "require_ecc": True, "fabric_manager": True, "imex": False,  # as the base scenario
        "allreduce_busbw_gbps": 0.0, "loopback_gbps": 0.0,  # measured, not observed
        "nvml_required": ["ecc", "ecc_mode", "remapped_rows", "clock_reasons", "utilization",
                          "temperature", "pcie"]}
    assert "dcgmi not found" in err


def test_unknown_generation_is_noted_not_guessed(tmp_path) -> None:
    scen = write_scenario(str(tmp_path), "t4", """
[nvml]
count = 1
[gpu]
name = "Tesla T4"
architecture = 6
nvlink = "NOT_SUPPORTED"
fabric = "NOT_SUPPORTED"
pcie = [4, 16, 4, 16]
[rdma]
efa = 0
""")
    code, out, err = _genconf(tmp_path, "--simulate", scen, "--name", "t4")
    assert code == 0, err
    prof = _profile(out, "t4")
    assert (prof["gpus"], prof["gpu_generation"], prof["nvlinks_per_gpu"]) == (1, "", 0)
    assert "unknown to the Xid policy" in err
    assert "no EFA or InfiniBand devices" in out


def test_nvml_hang_exits_3_within_the_timeout(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nnvml_timeout_s = 1\n")
    dest = tmp_path / "prof.toml"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resilient_slurm.hooks.health_cli", "genconf",
                           "--simulate", "nvml-hang", "--config", str(cfg), "-o", str(dest)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 1.0 + 5.0
    assert "hung in nvmlInit" in proc.stderr
    assert not dest.exists()


def test_render_rejects_a_name_that_breaks_toml(tmp_path) -> None:
    obs = observe(Scenario(scenario_path("healthy-p5")).gpu_backend(), str(tmp_path),
                  "/nonexistent", 2.0)
    code, _, err = _genconf(tmp_path, "--simulate", "healthy-p5", "--name", 'a"b')
    assert code == 2 and "bad profile name" in err
    assert '[health.profiles."x y"]' in render("x y", obs, "n")
