"""Issue 23 item 5: a failure holds until the check that found it passes again.

Pure rules of ``hooks/holds.py``, the health program re-running a held epilog check, and the
admin's ``resilient-health clear-hold``. The drained-node behaviour on the real sandbox is in
test_holds_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from resilient_slurm import fsutil
from resilient_slurm.events import read_events
from resilient_slurm.healthcheck.model import Report, Result
from resilient_slurm.hooks import holds
from resilient_slurm.hooks.health_cli import main as health_cli
from resilient_slurm_lab.hardware.hooks import NODE
from resilient_slurm_lab.hardware.simulate import install_scenario

from ..conftest import wait_until
from ..healthcheck.helpers import write_scenario
from .conftest import hook_config, run_hook


def leftover(gpu: int = 3) -> Result:
    return Result("gpu_procs", "fail", "GPU_PROCS_LEFT", "1 process(es) still on the GPU",
                  f"gpu{gpu} pids=4242", action="drain", device=f"gpu{gpu}")


def ok(check: str) -> Result:
    return Result(check, "ok", "OK", "fine")


def test_a_hold_ends_only_when_its_check_passes_on_its_gpus():
    held = holds.record([], Report("n1", [leftover(3), ok("ecc")]), "epilog", "b1", (2, 3))
    assert [(h["check"], h["gpus"], h["source"], h["once"]) for h in held] == [
        ("gpu_procs", [3], "epilog", False)]
    periodic = Report("n1", [ok("ecc"), ok("xid"), ok("temperature")])
    kept, gone = holds.release(held, periodic, "b1", None)
    assert kept == held and gone == []  # healthy periodic runs do not look at processes
    other = Report("n1", [ok("gpu_procs")])
    assert holds.release(held, other, "b1", (0, 1))[0] == held  # another job's GPUs
    kept, gone = holds.release(held, other, "b1", (3,))
    assert kept == [] and "passed again" in gone[0][1]
    kept, gone = holds.release(held, periodic, "b2", None)
    assert kept == [] and "rebooted" in gone[0][1]


def test_kernel_log_evidence_holds_until_reboot_and_state_checks_are_rechecked():
    xid = Result("xid", "fail", "XID79", "fell off the bus", "gpu3", action="reboot",
                 device="gpu3", hold=True)
    held = holds.record([], Report("n1", [xid, leftover(3)]), "epilog", "b1", None)
    assert {h["check"]: h["once"] for h in held} == {"xid": True, "gpu_procs": False}
    kept, _ = holds.release(held, Report("n1", [ok("xid"), ok("gpu_procs")]), "b1", None)
    assert [h["check"] for h in kept] == ["xid"]  # the Xid is not reported twice
    groups = holds.recheck_groups(held, ["xid", "ecc"])
    assert groups == [(["gpu_procs"], [3])]  # once-holds and periodic checks: not re-run
    diag = holds.record([], Report("n1", [Result("dcgm_diag", "fail", "DCGM_DIAG_FAIL", "x")]),
                        "epilog", "b1", (0, 1))
    assert diag[0]["gpus"] == [0, 1] and holds.recheck_groups(diag, []) == []  # too long


def test_old_single_hold_record_is_read_as_a_kernel_log_hold():
    held = holds.load({"hold": {"code": "XID79 gpu3", "boot_id": "b1", "since": 1.0}})
    assert held[0]["once"] and held[0]["code"] == "XID79 gpu3"


def _state(tmp_path) -> str:
    return str(tmp_path / "root" / "nodes" / "n1" / "hooks" / "streak.json")


def _plant(tmp_path, held: list[dict]) -> None:
    path = _state(tmp_path)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"holds": held, "drained": {"reason": "rhc:GPU_PROCS_LEFT gpu3"}}, fh)


def test_health_program_reruns_a_held_epilog_check_on_its_gpus(tmp_path):
    """Old code: the health run never looks at processes again and reports the node healthy
    (exit 0), so it resumes it after `resume_after` runs with the process still there."""
    config = hook_config(tmp_path, verdicts=True)
    scen = write_scenario(str(tmp_path / "s"), "left", "[gpus.3]\nprocesses = [4242]\n"
                          "[gpus.5]\nprocesses = [777]\n")
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), scen)
    _plant(tmp_path, holds.record([], Report("n1", [leftover(3)]), "epilog", None, None))
    done = run_hook("health", config)
    assert done.returncode == 1, done.stderr
    (verdict,) = [e for e in read_events(str(tmp_path / "root" / "events.jsonl"))
                  if e["kind"] == "verdict"]
    bad = [(r["check"], r.get("device")) for r in verdict["evidence"]]
    assert bad == [("gpu_procs", "gpu3")]  # GPU 5's process is another job's: not looked at
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), "clear")
    assert run_hook("health", config).returncode == 0
    released = [e for e in read_events(str(tmp_path / "root" / "events.jsonl"))
                if e["kind"] == "hold_released"]
    assert released and released[-1]["check"] == "gpu_procs"
    assert "holds" not in json.load(open(_state(tmp_path)))


def test_a_hold_cleared_while_the_health_run_rechecks_it_stays_cleared(tmp_path):
    """The admin's clear-hold lands after a health run re-ran the held check (the process is
    still there: the admin vouched for the node) and before the run decides. Old code: the
    run's stale failure kept the node unhealthy (exit 1, healthy streak reset) and, with Slurm
    reachable, recorded the hold again, so the node stayed drained (seen on a loaded sandbox,
    where slurmd's own periodic run straddled clear-hold). The test holds the node lock to
    pin that order: the run has published its verdict and waits for the lock to decide."""
    config = hook_config(tmp_path, extra="lock_timeout_s = 30\n")
    scen = write_scenario(str(tmp_path / "s"), "left", "[gpus.3]\nprocesses = [4242]\n")
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), scen)
    _plant(tmp_path, holds.record([], Report("n1", [leftover(3)]), "epilog", None, None))
    events_path = str(tmp_path / "root" / "events.jsonl")
    lock = os.path.join(os.path.dirname(_state(tmp_path)), "lock")
    with fsutil.locked(lock):
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", "import sys; from resilient_slurm_lab.hardware.hooks "
             f"import health_main; sys.exit(health_main(['--config', {config!r}]))"],
            env={"SLURMD_NODENAME": "n1"}, cwd="/", stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        wait_until(lambda: [e for e in read_events(events_path) if e["kind"] == "verdict"],
                   timeout=25)  # then it waits for the lock (up to lock_timeout_s, 30 s)
        (verdict,) = [e for e in read_events(events_path) if e["kind"] == "verdict"]
        assert verdict["code"] == "GPU_PROCS_LEFT"  # re-ran, still failing
        state = json.load(open(_state(tmp_path)))
        holds.store(state, [])  # what clear-hold writes under this lock
        fsutil.atomic_write_json(_state(tmp_path), state, mode=0o600)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "ended while this run re-ran it" in err
    after = json.load(open(_state(tmp_path)))
    assert "holds" not in after and after["healthy_streak"] == 1


def test_clear_hold_ends_holds_and_says_what_happens_next(tmp_path):
    config = hook_config(tmp_path)
    diag = Result("dcgm_diag", "fail", "DCGM_DIAG_FAIL", "memory test failed", device="gpu1")
    _plant(tmp_path, holds.record([], Report("n1", [diag, leftover(3)]), "epilog", "b", None))
    run = CliRunner().invoke
    shown = run(health_cli, ["holds", "--node", "n1", "--config", config])
    assert shown.exit_code == 0 and "dcgm_diag DCGM_DIAG_FAIL gpu1 (epilog)" in shown.output
    bad = run(health_cli, ["clear-hold", "--node", "n1", "--config", config, "--check", "ecc"])
    assert bad.exit_code == 2 and "no hold for ecc" in bad.output
    done = run(health_cli, ["clear-hold", "--node", "n1", "--config", config,
                            "--check", "dcgm_diag"])
    assert done.exit_code == 0, done.output
    assert "cleared hold dcgm_diag" in done.output and "1 hold(s) left" in done.output
    done = run(health_cli, ["clear-hold", "--node", "n1", "--config", config])
    assert done.exit_code == 0 and "resumes it after" in done.output
    assert "holds" not in json.load(open(_state(tmp_path)))
    by = [e.get("by") for e in read_events(str(tmp_path / "root" / "events.jsonl"))
          if e["kind"] == "hold_released"]
    assert by == ["admin", "admin"]


def test_clear_hold_recheck_keeps_a_check_that_still_fails(tmp_path):
    config = hook_config(tmp_path)
    scen = write_scenario(str(tmp_path / "s"), "left", "[gpus.3]\nprocesses = [4242]\n")
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), scen)
    _plant(tmp_path, holds.record([], Report("n1", [leftover(3)]), "epilog", None, None))
    def run(cli, argv):  # as the sandbox runs it: on the node's simulated hardware
        return CliRunner().invoke(cli, argv, obj=NODE)

    args = ["clear-hold", "--node", "n1", "--config", config, "--recheck"]
    still = run(health_cli, args)
    assert still.exit_code == 1 and "kept hold gpu_procs" in still.output, still.output
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), "clear")
    passed = run(health_cli, args)
    assert passed.exit_code == 0 and "gpu_procs passed again" in passed.output, passed.output


def test_gpu_proc_left_scenario_is_an_epilog_only_failure():
    """`resilient-health check --simulate gpu-proc-left`: the periodic set passes, the epilog
    set finds the process (why the health program must re-run it while it holds)."""
    run = CliRunner().invoke
    periodic = run(health_cli, ["check", "--simulate", "gpu-proc-left", "--node", "n1"])
    assert periodic.exit_code == 0, periodic.output
    epilog = run(health_cli, ["check", "--simulate", "gpu-proc-left", "--node", "n1",
                              "--set", "epilog", "--json"])
    assert epilog.exit_code == 1
    bad = [(r["check"], r["code"], r.get("device")) for r in json.loads(epilog.output)["results"]
           if r["status"] == "fail"]
    assert bad == [("gpu_procs", "GPU_PROCS_LEFT", "gpu3")]
