"""The lab's NVML hang (``--nvml-hang CALL`` of ``python -m resilient_slurm_lab.hardware.health``):
the GPU proof uses it on a real driver; here it wraps the simulated backend at the same seam.
The product's ``resilient-health check`` has no fault injection of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from resilient_slurm.healthcheck.gpu import gather_gpus
from resilient_slurm_lab.hardware.fakes import HangingNvml
from resilient_slurm_lab.hardware.plugin import hang_call
from resilient_slurm_lab.hardware.simulate import Scenario, scenario_path

WATCHDOG_S = 10  # counts from process start: room for a loaded start


def _check(tmp_path, hang: str | None) -> tuple[subprocess.CompletedProcess[str], float]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nnvml_timeout_s = 1\n"
                   f"watchdog_s = {WATCHDOG_S}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESILIENT_")}
    lab = ["--nvml-hang", hang] if hang is not None else []
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resilient_slurm_lab.hardware.health",
                           "--scenario", "healthy-p5", *lab, "check", "--json", "--config",
                           str(cfg)], capture_output=True, text=True, timeout=60, env=env)
    return proc, time.monotonic() - t0


def test_a_hung_nvml_call_makes_nvml_checks_unknown_within_the_watchdog(tmp_path) -> None:
    clean, _ = _check(tmp_path, None)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    proc, took = _check(tmp_path, "temperature")
    assert proc.returncode == 3, proc.stderr
    assert took < WATCHDOG_S + 8.0, took  # the hang is an hour; the slack is an interpreter start
    report = json.loads(proc.stdout)
    assert report["status"] == "unknown"
    gpu = [r for r in report["results"] if r["check"] == "temperature"]
    assert [(r["status"], r["code"]) for r in gpu] == [("unknown", "NVML_TIMEOUT")]
    assert "temperature(gpu0)" in gpu[0]["reason"]
    xid = [r for r in report["results"] if r["check"] == "xid"]
    assert xid[0]["status"] == "ok"  # only the NVML seam hangs


def test_the_hang_names_another_call(tmp_path) -> None:
    proc, _ = _check(tmp_path, "init")
    assert proc.returncode == 3
    assert "hung in nvmlInit" in proc.stdout


@pytest.mark.parametrize("value", ["nonesuch", "_h"])
def test_an_unknown_call_is_a_usage_error(tmp_path, value) -> None:
    proc, _ = _check(tmp_path, value)
    assert proc.returncode == 2
    assert "no NVML seam call" in proc.stderr and "Traceback" not in proc.stderr


def test_the_product_check_takes_no_fault_from_the_environment(tmp_path) -> None:
    """``RESILIENT_HEALTH_NVML_FAULT`` is gone: nothing in a production command's environment
    can make NVML hang."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nnvml_timeout_s = 1\n")
    env = {**os.environ, "RESILIENT_HEALTH_NVML_FAULT": "hang"}
    base = [sys.executable, "-m", "resilient_slurm.hooks.health_cli", "check"]
    done = subprocess.run([*base, "--simulate", "healthy-p5", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    help_text = subprocess.run([*base, "--help"], capture_output=True, text=True, timeout=60)
    assert "NVML_FAULT" not in help_text.stdout


def test_wrapper_passes_other_calls_through() -> None:
    backend = Scenario(scenario_path("healthy-p5")).gpu_backend()
    assert hang_call("temperature") == "temperature"
    snap = gather_gpus(HangingNvml(backend, "memory_used_mib"), 0.5, fields={"temperature"})
    assert snap.usable and snap.gpus[0].values["temperature"] == 38
    snap = gather_gpus(HangingNvml(backend, "memory_used_mib"), 0.5, fields={"memory"})
    assert (snap.state, snap.hung_call) == ("timeout", "memory(gpu0)")
