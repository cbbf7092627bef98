"""Issue 23 item 11: a root hook never takes simulated hardware from the production config, a
shipped scenario name, or a scenario file anyone but root can change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.config import ConfigError
from resilient_slurm.healthcheck.simulate import install_scenario
from resilient_slurm.hooks.entry import check_simulate

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is for hooks run as root")


def _health(config: Path) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from resilient_slurm.hooks.health import health_main; "
            f"sys.exit(health_main(['--config', {str(config)!r}]))")
    return subprocess.run([sys.executable, "-I", "-c", code], env={"SLURMD_NODENAME": "n1"},
                          capture_output=True, text=True, timeout=120, cwd="/")


def _config(tmp_path: Path, simulate: str) -> Path:
    root = tmp_path / "root"
    root.mkdir(mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    path = root / "config.toml"
    path.write_text(f'[hooks]\nstate_dir = "{root}/hooks"\nevents_file = "{root}/ev.jsonl"\n'
                    'slurm_bin_dir = "/nonexistent"\nslurm_conf = "/nonexistent/slurm.conf"\n'
                    f'[health]\nstate_dir = "{root}/health"\nsimulate = "{simulate}"\n'
                    'profile = "p5.48xlarge"\n')
    os.chmod(path, 0o644)
    return path


def test_a_shipped_scenario_name_is_refused_by_the_root_hook(tmp_path: Path) -> None:
    done = _health(_config(tmp_path, "healthy-p5"))
    assert done.returncode == 2, done.stderr
    assert "health.simulate" in done.stderr and "shipped scenario" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_scenario_file_others_can_write_is_refused(tmp_path: Path) -> None:
    node = tmp_path / "root" / "nodes" / "n1"
    install_scenario(str(node), "clear")
    scenario = node / "scenario.toml"
    config = _config(tmp_path, str(scenario))
    check_simulate(str(scenario), str(config))  # root's, 0644 or tighter: taken
    os.chmod(scenario, 0o666)
    with pytest.raises(ConfigError, match="writable by others"):
        check_simulate(str(scenario), str(config))
    os.chmod(scenario, 0o600)
    os.chown(node, 65534, 65534)  # a directory another user owns: they could swap the file
    with pytest.raises(ConfigError, match="not root's"):
        check_simulate(str(scenario), str(config))


def test_the_production_config_never_simulates() -> None:
    with pytest.raises(ConfigError, match="real hardware only"):
        check_simulate("/var/lib/x/scenario.toml", "/etc/resilient-slurm/config.toml")
