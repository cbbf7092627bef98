"""Real or simulated is decided once (issue 27 item 1): :func:`seams.seams_for` builds the seams
on the hardware it is given (this machine's unless a caller plugs the lab's in), the engine
takes them and never imports simulated hardware."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from resilient_slurm.healthcheck.seams import check_node, seams_for
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import make_config, write_scenario

SCENARIO_CODE = ("resilient_slurm_lab", "resilient_slurm_lab.hardware.simulate",
                 "resilient_slurm_lab.hardware.fakes")


def _imported_after(statement: str) -> set[str]:
    """The scenario modules loaded after ``statement`` in a fresh interpreter."""
    code = f"import sys\n{statement}\nprint(' '.join(m for m in {SCENARIO_CODE!r} " \
           "if m in sys.modules))"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    return set(out.stdout.split())


def test_the_engine_and_the_real_seams_import_no_scenario_code() -> None:
    assert _imported_after("import resilient_slurm.healthcheck.engine") == set()
    assert _imported_after(
        "from resilient_slurm.config import load_config\n"
        "from resilient_slurm.healthcheck.seams import seams_for\n"
        "s = seams_for(load_config(env={}), 'n1')\n"
        "assert not s.simulated and type(s.gpu).__name__ == 'NvmlBackend', s") == set()


def test_a_scenario_is_chosen_by_seams_for_with_its_site_settings(tmp_path: Path) -> None:
    path = write_scenario(str(tmp_path), "site", 'profile = "p5.48xlarge"\n'
                          "[site.health]\nwatchdog_s = 17\n")
    cfg = make_config(str(tmp_path))
    seams = seams_for(cfg, "n1", ScenarioHardware(path))
    assert seams.simulated and seams.profile == "p5.48xlarge"
    assert type(seams.gpu).__name__ == "FakeNvml"
    assert seams.config.health.watchdog_s == 17 and cfg.health.watchdog_s != 17
    assert seams.sysfs_root.endswith("/sys") and seams.tool_path.split(":")[0].endswith("/bin")
    assert not seams.setup_error


def test_a_set_up_failure_is_every_check_unknown(tmp_path: Path, monkeypatch) -> None:
    from resilient_slurm_lab.hardware import simulate

    def no_space(self: simulate.Scenario) -> tuple[str, str]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simulate.Scenario, "materialize", no_space)
    report = check_node(make_config(str(tmp_path)), hardware=ScenarioHardware("healthy-p5"),
                        node="n1")
    checks = [r for r in report.results if r.check != "profile"]
    assert checks and {r.code for r in checks} == {"SETUP_ERROR"}
    assert {r.status for r in checks} == {"unknown"}
    assert report.exit_code != 0


def test_genconf_says_a_set_up_failure(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from resilient_slurm.hooks.health_cli import main
    from resilient_slurm_lab.hardware import simulate

    def no_space(self: simulate.Scenario) -> tuple[str, str]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simulate.Scenario, "materialize", no_space)
    monkeypatch.setenv("RESILIENT_SLURM_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    res = CliRunner().invoke(main, ["genconf", "--simulate", "healthy-p5", "--node", "n1"])
    assert res.exit_code == 2 and "No space left on device" in res.output, res.output


def test_the_hooks_run_on_the_hardware_their_caller_passes(tmp_path: Path) -> None:
    """A hook's entry point takes hardware from its caller only; without one, the run is on
    this machine whatever the config says."""
    from resilient_slurm.healthcheck import seams

    hw = ScenarioHardware("healthy-p5")
    with seams.using(hw):
        assert seams.current() is hw
        assert seams_for(make_config(str(tmp_path)), "n1").simulated
    assert seams.current() is seams.REAL
