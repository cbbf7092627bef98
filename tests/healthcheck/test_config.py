from __future__ import annotations

import dataclasses
import os

import pytest

from resilient_slurm import config as cfgmod
from resilient_slurm.config import ConfigError, load_config
from resilient_slurm.healthcheck.config import HealthConfig


def write(tmp_path, text: str) -> str:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


def test_defaults_without_file(tmp_path):
    c = load_config(write(tmp_path, ""), env={})
    assert isinstance(c.health, HealthConfig)
    assert c.health.state_dir == "/var/lib/resilient-slurm"
    assert not hasattr(c.health, "simulate")  # hardware is never chosen by the config


def test_precedence_defaults_file_env_flags(tmp_path):
    path = write(tmp_path, "[health]\nwatchdog_s = 30\ntool_timeout_s = 3\n"
                           "temperature_warn_c = 80\n")
    env = {"RESILIENT_SLURM_HEALTH_TOOL_TIMEOUT_S": "4", "RESILIENT_SLURM_HEALTH_WATCHDOG_S": "20"}
    c = load_config(path, env=env, overrides={"health": {"watchdog_s": 10.0}})
    assert c.health.watchdog_s == 10.0  # flag beats env beats file
    assert c.health.tool_timeout_s == 4.0
    assert c.health.temperature_warn_c == 80.0  # file beats default
    assert c.health.nvml_timeout_s == HealthConfig().nvml_timeout_s
    assert c.source == path


def test_env_names_the_file(tmp_path):
    path = write(tmp_path, "[health]\nwatchdog_s = 12\n")
    c = load_config(env={"RESILIENT_SLURM_CONFIG": path})
    assert c.health.watchdog_s == 12.0


def test_flag_path_beats_env_path(tmp_path):
    a = write(tmp_path, "[health]\nwatchdog_s = 12\n")
    b = tmp_path / "b.toml"
    b.write_text("[health]\nwatchdog_s = 13\n")
    assert load_config(str(b), env={"RESILIENT_SLURM_CONFIG": a}).health.watchdog_s == 13.0


@pytest.mark.parametrize("text,key", [
    ("[health]\nwatchdogs = 3\n", "health.watchdogs"),
    ("[health]\nwatchdog_s = 'soon'\n", "health.watchdog_s"),
    ("[health]\nstorage_paths = [1]\n", "health.storage_paths[0]"),
    ("[health.checks.ecc]\nenable = false\n", "health.checks.ecc.enable"),
    ("[health.checks.ecc]\nenabled = 'no'\n", "health.checks.ecc.enabled"),
    ("[health.profiles.x]\ngpus = 'eight'\n", "health.profiles.x.gpus"),
    ("[health.xid_overrides.hopper]\n79 = 'explode'\n", "health.xid_overrides.hopper.79"),
    ("[health]\nkernel_log = 'syslog'\n", "health.kernel_log"),
    ("[health]\nwatchdog_s = -1\n", "health.watchdog_s"),
    ("[healthz]\n", "healthz"),
    ("[health]\necc_volatile_uncorrected_max = true\n", "health.ecc_volatile_uncorrected_max"),
])
def test_errors_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), env={})
    assert err.value.key == key
    assert key in str(err.value)


def test_env_bad_value_names_variable(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, ""), env={"RESILIENT_SLURM_HEALTH_WATCHDOG_S": "x"})
    assert "health.watchdog_s" in str(err.value)
    assert "RESILIENT_SLURM_HEALTH_WATCHDOG_S" in str(err.value)


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does-not-exist"):
        load_config(str(tmp_path / "does-not-exist.toml"), env={})


def test_invalid_toml(tmp_path):
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(write(tmp_path, "[health\n"), env={})


def test_nested_tables(tmp_path):
    path = write(tmp_path, """
[health]
storage_paths = ["/fsx"]
profile_patterns = { "gpu-*" = "p5.48xlarge" }
[health.checks.dcgm_health]
enabled = false
[health.profiles.mine]
gpus = 4
match = ["a*"]
[health.boot_noise]
hopper = [119]
""")
    h = load_config(path, env={}).health
    assert h.checks["dcgm_health"].enabled is False
    assert h.profiles["mine"].gpus == 4 and h.profiles["mine"].match == ["a*"]
    assert h.boot_noise == {"hopper": [119]}
    assert h.profile_patterns == {"gpu-*": "p5.48xlarge"}


def test_sections_are_a_registry(tmp_path):
    @dataclasses.dataclass
    class Extra:
        knob: int = 1

    cfgmod.register_section("extra_test")(Extra)
    try:
        c = load_config(write(tmp_path, "[extra_test]\nknob = 5\n"), env={})
        assert c.section("extra_test").knob == 5
        with pytest.raises(ConfigError, match="extra_test.nob"):
            load_config(write(tmp_path, "[extra_test]\nnob = 5\n"), env={})
    finally:
        cfgmod._SECTIONS.pop("extra_test")


def test_default_path_is_etc():
    assert cfgmod.DEFAULT_PATH == "/etc/resilient-slurm/config.toml"
    assert not os.environ.get("RESILIENT_SLURM_HEALTH_SIMULATE")
