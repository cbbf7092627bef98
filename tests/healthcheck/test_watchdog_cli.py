"""The watchdog (a hung tool or NVML cannot stretch a run) and the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from click.testing import CliRunner

from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.hooks.health_cli import main
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import by_check, make_config, write_scenario

EVERYTHING_HANGS = """
[nvml]
behavior = "hang"
[kernel_log]
behavior = "hang"
[tools.dcgmi]
behavior = "hang"
[tools.fi_info]
behavior = "hang"
"""
CLI_WATCHDOG_S = 8
SLOW = "nvml_timeout_s = 60\ntool_timeout_s = 60\nkernel_log_timeout_s = 60\n"


def sleepers(mark: str) -> int:
    """The hung simulated tools (``sleep 3600``) started with ``mark`` in their environment:
    this test's own, never another test's running beside it (the suite runs on workers)."""
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read().split(b"\0")[:2] != [b"sleep", b"3600"]:
                    continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if f"RS_TEST_MARK={mark}".encode() in fh.read().split(b"\0"):
                    n += 1
        except OSError:
            pass
    return n


def _watch_sleepers(mark: str, seen: list[int], stop: threading.Event) -> None:
    while not stop.is_set():
        seen.append(sleepers(mark))
        time.sleep(0.2)


def test_watchdog_bounds_run_checks(tmp_path, monkeypatch):
    cfg = make_config(str(tmp_path), SLOW + "watchdog_s = 2\n")
    scen = write_scenario(str(tmp_path), "hangs", EVERYTHING_HANGS)
    mark = uuid.uuid4().hex
    monkeypatch.setenv("RS_TEST_MARK", mark)
    seen: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_sleepers, args=(mark, seen, stop), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    report = check_node(cfg, hardware=ScenarioHardware(scen), node="w")
    took = time.monotonic() - t0
    stop.set()
    watcher.join()
    # the hung tools sleep an hour: returning within a few seconds of the 2 s watchdog is the
    # cut (the slack is for a loaded machine, not the product's margin)
    assert took < 2.0 + 5.0, took
    assert report.exit_code == 3
    assert "kernlog" in report.abandoned
    assert by_check(report, "gpu_count")[0].code == "NVML_TIMEOUT"
    (xid,) = by_check(report, "xid")
    assert (xid.status, xid.code) == ("unknown", "WATCHDOG")
    assert by_check(report, "dcgm_health")[0].code in ("DCGMI_TIMEOUT", "WATCHDOG")
    time.sleep(0.5)
    assert max(seen) > 0  # the hung tools ran (and carried the mark)
    assert sleepers(mark) == 0  # the hung tools' process groups were killed


def test_cli_watchdog_holds_end_to_end(tmp_path):
    cfg = tmp_path / "c.toml"
    # The CLI's watchdog counts from its process start (the whole command keeps the budget):
    # 8 s, not 2, so an interpreter start on a loaded machine still leaves the hung tools
    # seconds to run and be seen (with 2 s, a CI run once saw none of them run).
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nwatchdog_s = {CLI_WATCHDOG_S}\n"
                   + SLOW)
    scen = write_scenario(str(tmp_path), "hangs", EVERYTHING_HANGS)
    mark = uuid.uuid4().hex
    seen: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_sleepers, args=(mark, seen, stop), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resilient_slurm.hooks.health_cli", "check",
                           "--simulate", scen, "--config", str(cfg), "--json"],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "RS_TEST_MARK": mark})
    took = time.monotonic() - t0
    stop.set()
    watcher.join()
    assert proc.returncode == 3, proc.stderr
    assert took < CLI_WATCHDOG_S + 8.0, took  # the slack is for a loaded machine
    assert json.loads(proc.stdout)["status"] == "unknown"
    time.sleep(0.5)
    assert max(seen) > 0  # the hung tools ran (and carried the mark)
    assert sleepers(mark) == 0


def run_cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, list(args), env=env or {}, catch_exceptions=False)


@pytest.fixture()
def cfgfile(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\nnvml_timeout_s = 1\n"
                 "tool_timeout_s = 1\n")
    return str(p)


def test_cli_exit_codes(cfgfile):
    assert run_cli("check", "--simulate", "healthy-p5", "--config", cfgfile).exit_code == 0
    assert run_cli("check", "--simulate", "boot-noise", "--config", cfgfile).exit_code == 0
    assert run_cli("check", "--simulate", "xid79", "--config", cfgfile).exit_code == 1
    assert run_cli("check", "--simulate", "dcgmi-missing", "--config", cfgfile).exit_code == 3


def test_cli_table_says_simulated(cfgfile):
    res = run_cli("check", "--simulate", "efa-port-down", "--config", cfgfile)
    assert "SIMULATED" in res.output
    line = [x for x in res.output.splitlines() if "EFA_PORT_DOWN" in x][0]
    assert line.startswith("FAIL") and "rdmap33s0:1 is DOWN" in line


def test_cli_json_and_metrics(cfgfile, tmp_path):
    metrics = tmp_path / "prom" / "health.prom"
    res = run_cli("check", "--simulate", "xid79", "--config", cfgfile, "--json",
                  "--metrics-file", str(metrics), "--only", "xid,gpu_count", "--node", "n7")
    data = json.loads(res.output)
    assert data["node"] == "n7" and data["status"] == "fail" and data["simulated"] is True
    assert {r["check"] for r in data["results"]} == {"profile", "xid", "gpu_count"}
    for r in data["results"]:
        assert set(r) >= {"check", "status", "code", "reason", "evidence", "duration_s"}
    text = metrics.read_text()
    assert ('resilient_health_status{check_set="periodic",node="n7",source="check",'
            'state="fail"} 1.0') in text
    assert ('resilient_health_check_code{check="xid",code="XID79",device="gpu3",node="n7",'
            'source="check"} 1.0') in text
    assert "resilient_health_simulated" in text
    assert not [f for f in os.listdir(metrics.parent) if f.startswith(".tmp-")]


def test_cli_config_errors_exit_2_naming_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[health]\nwatchdog = 3\n")
    res = CliRunner().invoke(main, ["check", "--simulate", "healthy-p5", "--config", str(bad)])
    assert res.exit_code == 2
    assert "health.watchdog" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["check", "--simulate", "healthy-p5"],
                             env={"RESILIENT_SLURM_CONFIG": str(bad)})
    assert res.exit_code == 2 and "health.watchdog" in res.output
    res = CliRunner().invoke(main, ["check", "--simulate", "healthy-p5", "--config", str(bad)[:-5]
                                    + "-missing.toml"])
    assert res.exit_code == 2


def test_cli_usage_errors_exit_2(cfgfile):
    assert run_cli("check", "--only", "nonsense", "--simulate", "healthy-p5",
                   "--config", cfgfile).exit_code == 2
    assert run_cli("check", "--simulate", "no-such", "--config", cfgfile).exit_code == 2
    assert CliRunner().invoke(main, ["check", "--bogus"]).exit_code == 2
    # Bare `resilient-health` is the HealthCheckProgram: without SLURMD_NODENAME it cannot
    # know its node, which is a usage error that says so.
    res = CliRunner().invoke(main, [], env={"SLURMD_NODENAME": ""})
    assert res.exit_code == 2 and "SLURMD_NODENAME" in res.output


def test_the_lab_runs_resilient_health_on_a_simulated_node(tmp_path):
    """The config cannot choose the hardware (an unknown key); the lab's ``resilient-health``
    runs on the node's scenario, ``{node}`` from SLURMD_NODENAME."""
    from resilient_slurm_lab.hardware.simulate import install_scenario

    install_scenario(str(tmp_path / "nodes" / "node2"), "efa-missing")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[health]\nstate_dir = '{tmp_path}/state'\n")
    bad = tmp_path / "bad.toml"
    bad.write_text(cfg.read_text() + f"simulate = '{tmp_path}/nodes/{{node}}/scenario.toml'\n")
    res = run_cli("check", "--config", str(bad), "--only", "efa")
    assert res.exit_code == 2 and "health.simulate" in res.output, res.output
    done = subprocess.run(
        [sys.executable, "-m", "resilient_slurm_lab.hardware.health", "--scenario",
         f"{tmp_path}/nodes/{{node}}/scenario.toml", "check", "--config", str(cfg), "--only",
         "efa"], env={**os.environ, "SLURMD_NODENAME": "node2"}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "EFA_COUNT" in done.stdout and "SIMULATED" in done.stdout


def test_the_labs_scenario_commands(tmp_path):
    from resilient_slurm_lab.hardware.cli import hardware

    res = CliRunner().invoke(hardware, ["install", str(tmp_path / "n"), "clear"])
    assert res.exit_code == 0 and res.output.strip().endswith("scenario.toml")
    assert "healthy-p5" in CliRunner().invoke(hardware, ["scenarios"]).output
    res = CliRunner().invoke(hardware, ["install", str(tmp_path / "n"), "no-such"])
    assert res.exit_code == 2 and "no shipped scenario" in res.output


def test_no_torch_and_lazy_pynvml():
    code = ("import sys, resilient_slurm.hooks.health_cli, resilient_slurm.healthcheck.engine\n"
            "from resilient_slurm.config import load_config\n"
            "from resilient_slurm.healthcheck.seams import check_node\n"
            "from resilient_slurm_lab.hardware.plugin import ScenarioHardware\n"
            "check_node(load_config('/dev/null', env={}), hardware=ScenarioHardware('healthy-p5'),"
            " node='x')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pynvml')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
