"""The CLI's env-selected NVML hang (``RESILIENT_HEALTH_NVML_FAULT``): the GPU proof uses it on
a real driver; here it wraps the simulated backend at the same seam."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from resilient_slurm.healthcheck.fakes import HangingNvml, nvml_fault
from resilient_slurm.healthcheck.gpu import gather_gpus
from resilient_slurm.healthcheck.simulate import Scenario, scenario_path

WATCHDOG_S = 10  # counts from process start: room for a loaded start


def _check(tmp_path, fault: str | None) -> tuple[subprocess.CompletedProcess[str], float]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nnvml_timeout_s = 1\n"
                   f"watchdog_s = {WATCHDOG_S}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESILIENT_")}
    if fault is not None:
        env["RESILIENT_HEALTH_NVML_FAULT"] = fault
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resilient_slurm.hooks.health_cli", "check",
                           "--json", "--simulate", "healthy-p5", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60, env=env)
    return proc, time.monotonic() - t0


def test_env_fault_makes_nvml_checks_unknown_within_the_watchdog(tmp_path) -> None:
    clean, _ = _check(tmp_path, None)
    assert clean.returncode == 0, clean.stdout
    proc, took = _check(tmp_path, "hang")
    assert proc.returncode == 3, proc.stderr
    assert took < WATCHDOG_S + 8.0, took  # the hang is an hour; the slack is an interpreter start
    report = json.loads(proc.stdout)
    assert report["status"] == "unknown"
    gpu = [r for r in report["results"] if r["check"] == "temperature"]
    assert [(r["status"], r["code"]) for r in gpu] == [("unknown", "NVML_TIMEOUT")]
    assert "temperature(gpu0)" in gpu[0]["reason"]
    xid = [r for r in report["results"] if r["check"] == "xid"]
    assert xid[0]["status"] == "ok"  # only the NVML seam hangs


def test_env_fault_names_another_call(tmp_path) -> None:
    proc, _ = _check(tmp_path, "hang:init")
    assert proc.returncode == 3
    assert "hung in nvmlInit" in proc.stdout


@pytest.mark.parametrize("value", ["crash", "hang:nonesuch", "hang:_h"])
def test_bad_fault_value_is_a_usage_error(tmp_path, value) -> None:
    proc, _ = _check(tmp_path, value)
    assert proc.returncode == 2
    assert "RESILIENT_HEALTH_NVML_FAULT" in proc.stderr and "Traceback" not in proc.stderr


def test_wrapper_passes_other_calls_through() -> None:
    backend = Scenario(scenario_path("healthy-p5")).gpu_backend()
    assert nvml_fault("hang") == "temperature" and nvml_fault("") is None
    snap = gather_gpus(HangingNvml(backend, "memory_used_mib"), 0.5, fields={"temperature"})
    assert snap.usable and snap.gpus[0].values["temperature"] == 38
    snap = gather_gpus(HangingNvml(backend, "memory_used_mib"), 0.5, fields={"memory"})
    assert (snap.state, snap.hung_call) == ("timeout", "memory(gpu0)")
