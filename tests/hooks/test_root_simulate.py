"""A product hook cannot be made to use simulated hardware: the config key that once chose it,
``[health] simulate``, is an unknown key (the hook exits 2 naming it), and nothing else in the
config or the environment reaches the hardware seam (``tests/hooks/test_no_torch.py``: the
product's hooks never load the lab). The lab's own hooks, the sandbox's, take only a
root-owned scenario file when they run as root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.config import ConfigError
from resilient_slurm.config import load_config as load
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import install_scenario

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is for hooks run as root")


def _health(config: Path, module: str = "resilient_slurm.hooks.health") -> \
        subprocess.CompletedProcess[str]:
    code = (f"import sys; from {module} import health_main; "
            f"sys.exit(health_main(['--config', {str(config)!r}]))")
    return subprocess.run([sys.executable, "-I", "-c", code], env={"SLURMD_NODENAME": "n1"},
                          capture_output=True, text=True, timeout=120, cwd="/")


def _config(tmp_path: Path, health: str = "") -> Path:
    root = tmp_path / "root"
    root.mkdir(mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    path = root / "config.toml"
    path.write_text(f'[hooks]\nstate_dir = "{root}/hooks"\nevents_file = "{root}/ev.jsonl"\n'
                    'slurm_bin_dir = "/nonexistent"\nslurm_conf = "/nonexistent/slurm.conf"\n'
                    f'[health]\nstate_dir = "{root}/nodes/{{node}}/health"\n'
                    f'profile = "p5.48xlarge"\n{health}')
    os.chmod(path, 0o644)
    return path


@pytest.mark.parametrize("value", ["healthy-p5", "{root}/nodes/{{node}}/scenario.toml"])
def test_the_config_cannot_choose_simulated_hardware(tmp_path: Path, value: str) -> None:
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), "clear")
    value = value.format(root=tmp_path / "root")
    done = _health(_config(tmp_path, f'simulate = "{value}"\n'))
    assert done.returncode == 2, done.stderr
    assert "health.simulate" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(ConfigError, match="health.simulate"):
        load(str(_config(tmp_path, 'simulate = "healthy-p5"\n')), env={})


def test_the_labs_hook_takes_only_a_root_owned_scenario_file(tmp_path: Path) -> None:
    node = tmp_path / "root" / "nodes" / "n1"
    install_scenario(str(node), "clear")
    config = _config(tmp_path)
    lab = "resilient_slurm_lab.hardware.hooks"
    done = _health(config, lab)  # root's, 0600: taken
    assert done.returncode == 0, done.stderr
    scenario = node / "scenario.toml"
    os.chmod(scenario, 0o666)
    done = _health(config, lab)
    assert done.returncode == 2 and "writable by others" in done.stderr, done.stderr
    os.chmod(scenario, 0o600)
    os.chown(node, 65534, 65534)  # a directory another user owns: they could swap the file
    done = _health(config, lab)
    assert done.returncode == 2 and "not root's" in done.stderr, done.stderr
    cfg = load(str(config), env={})
    with pytest.raises(ConfigError, match="shipped scenario"):
        ScenarioHardware("healthy-p5", root_owned=True).klog(cfg, "n1")
