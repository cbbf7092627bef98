"""Precursors (hooks/precursor.py) in the node watcher and the health program, without Slurm:
simulated hardware, the real hook processes, Slurm pointed at nothing, so whether a job runs
on the node cannot be learnt and the node counts as busy: the precursor is published (status
``warn``, ``precursors``), never drained. The drain for repair once no job runs: the cluster
test (tests/launcher/test_evacuate_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from resilient_slurm import verdict_file
from resilient_slurm.events import read_events
from resilient_slurm.healthcheck.model import FAIL, OK, WARN, Report, Result
from resilient_slurm.hooks import precursor
from resilient_slurm_lab.hardware.simulate import install_scenario

from .conftest import hook_config, run_hook


def run_watch(config: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The watcher as its service runs it: root, a bare environment, ``python -I``."""
    code = ("import sys; from resilient_slurm_lab.hardware.hooks import watch_main; "
            f"sys.exit(watch_main(['--config', {config!r}, *sys.argv[1:]]))")
    return subprocess.run([sys.executable, "-I", "-c", code, *args],
                          env={"SLURMD_NODENAME": "n1"}, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def _root(config: str) -> str:
    return os.path.dirname(config)


def _events(config: str, **match: object) -> list[dict[str, object]]:
    path = os.path.join(_root(config), "events.jsonl")
    return [e for e in read_events(path) if all(e.get(k) == v for k, v in match.items())]


def test_a_pending_row_remap_under_a_job_is_published_as_a_precursor_not_drained(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True, extra="watch_interval_s = 0.2\n")
    install_scenario(os.path.join(_root(cfg), "nodes", "n1"), "row-remap-pending")
    done = run_watch(cfg, "--ticks", "3")
    assert done.returncode == 0, done.stderr
    path = os.path.join(_root(cfg), "verdicts", "n1.json")
    v = verdict_file.read(path)
    assert v is not None and v.status == "warn" and v.precursors == ("ROW_REMAP_PENDING",)
    record = json.loads(open(path).read())
    assert record["healthy"] is True and record["codes"] == []  # an older reader: healthy warn
    assert record["reason"].startswith("precursor: gpu2: row remap pending")
    pre = _events(cfg, kind="precursor", source="watch")
    assert [(e["codes"], e["action"], e["devices"]) for e in pre] == [
        (["ROW_REMAP_PENDING"], "published", ["gpu2"])]  # 3 ticks, said once
    assert not _events(cfg, kind="action_failed")  # no drain was even tried
    assert not _events(cfg, kind="drain")


def test_a_rising_corrected_ecc_count_is_a_precursor_from_the_second_sample(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True, extra="watch_interval_s = 0.2\n")
    node = os.path.join(_root(cfg), "nodes", "n1")
    install_scenario(node, "healthy-p5")
    assert run_watch(cfg, "--ticks", "2").returncode == 0  # the samples: 0 everywhere
    path = os.path.join(_root(cfg), "verdicts", "n1.json")
    assert not os.path.exists(path)
    install_scenario(node, "ecc-corrected-rising")
    done = run_watch(cfg, "--ticks", "2")
    assert done.returncode == 0, done.stderr
    v = verdict_file.read(path)
    assert v is not None and v.status == "warn" and v.precursors == ("ECC_CORRECTED_RATE",)
    assert [e["devices"] for e in _events(cfg, kind="precursor")] == [["gpu4"]]


def test_rising_nvlink_crc_errors_are_a_precursor_for_the_health_program_too(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True)
    node = os.path.join(_root(cfg), "nodes", "n1")
    install_scenario(node, "healthy-p5")
    assert run_hook("health", cfg).returncode == 0  # the first samples
    install_scenario(node, "nvlink-crc-rising")
    done = run_hook("health", cfg)
    assert done.returncode == 0, done.stderr
    v = verdict_file.read(os.path.join(_root(cfg), "verdicts", "n1.json"))
    assert v is not None and v.status == "warn" and v.precursors == ("NVLINK_CRC_RATE",)
    [pre] = _events(cfg, kind="precursor", source="health")
    assert (pre["devices"], pre["action"]) == (["gpu1"], "published")


def test_the_health_program_publishes_a_precursor_too(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True)
    install_scenario(os.path.join(_root(cfg), "nodes", "n1"), "row-remap-pending")
    done = run_hook("health", cfg)
    assert done.returncode == 0, done.stderr  # a precursor is no failure
    v = verdict_file.read(os.path.join(_root(cfg), "verdicts", "n1.json"))
    assert v is not None and v.status == "warn" and v.precursors == ("ROW_REMAP_PENDING",)
    assert [e["action"] for e in _events(cfg, kind="precursor", source="health")] == [
        "published"]


def _r(code: str, status: str, device: str = "gpu1") -> Result:
    return Result("row_remap", status, code, f"{device}: x", device=device,
                  action="reset_gpu" if status == FAIL else None)


def test_split_and_repair_keep_real_failures_and_hold_the_precursor():
    report = Report("n1", results=[_r("ROW_REMAP_PENDING", FAIL), _r("ECC_DBE", FAIL, "gpu2"),
                                   _r("OK", OK, "gpu3")])
    now, found = precursor.split(report, ["ROW_REMAP_PENDING"])
    assert [r.code for r in found] == ["ROW_REMAP_PENDING"]
    assert now.status == FAIL and [r.code for r in now.failing()] == ["ECC_DBE"]  # fail wins
    only, found = precursor.split(Report("n1", results=[_r("ROW_REMAP_PENDING", FAIL)]),
                                  ["ROW_REMAP_PENDING"])
    assert only.status == WARN
    repair = precursor.for_repair(only, found)
    assert repair.status == FAIL
    [held] = repair.failing()
    assert (held.code, held.action, held.hold) == ("ROW_REMAP_PENDING", "reset_gpu", True)
    rate = Result("error_rates", WARN, "ECC_CORRECTED_RATE", "gpu4: fast", device="gpu4")
    now, found = precursor.split(Report("n1", results=[rate]), ["ECC_CORRECTED_RATE"])
    assert [(r.action, r.hold) for r in precursor.for_repair(now, found).failing()] == [
        ("drain", True)]
    assert precursor.split(report, [])[1] == []  # an empty list: no precursors
