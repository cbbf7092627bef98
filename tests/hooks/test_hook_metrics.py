"""The prolog and the HealthCheckProgram each write their own metrics file: a prolog run after
a health run leaves every one of the health program's series in place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from resilient_slurm_lab.hardware.simulate import install_scenario

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")


def _hook(func: str, config: Path) -> subprocess.CompletedProcess[str]:
    mod, fn = func.split(":")
    code = f"import sys; from {mod} import {fn}; sys.exit({fn}(['--config', {str(config)!r}]))"
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          env={"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7"}, timeout=120,
                          cwd="/")


def _series(path: Path) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items())))
            for f in text_string_to_metric_families(path.read_text()) for s in f.samples
            if "timestamp" not in s.name and "duration" not in s.name}


def _setup(tmp_path: Path, slurm_conf: str = "/nonexistent/slurm.conf") -> tuple[Path, Path]:
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    install_scenario(str(root / "nodes" / "n1"), "clear")
    config = root / "config.toml"
    config.write_text(
        f'[hooks]\nstate_dir = "{root}/nodes/{{node}}/hooks"\nevents_file = "{root}/ev.jsonl"\n'
        f'metrics_file = "{root}/prom/rhc.prom"\nslurm_bin_dir = "/nonexistent"\n'
        f'slurm_conf = "{slurm_conf}"\nverdict_file = ""\n'
        "prolog_budget_s = 10\nepilog_budget_s = 10\nhealth_budget_s = 10\n"
        f'[health]\nstate_dir = "{root}/nodes/{{node}}/health"\n'
        'profile = "p5.48xlarge"\n'
        "watchdog_s = 10\n")
    os.chmod(config, 0o644)
    return root, config


def test_prolog_keeps_the_health_programs_series(tmp_path: Path) -> None:
    root, config = _setup(tmp_path)
    _hook("resilient_slurm_lab.hardware.hooks:health_main", config)
    health = root / "prom" / "rhc.prom"
    before = _series(health)
    assert len(before) >= 19
    _hook("resilient_slurm_lab.hardware.hooks:prolog_main", config)
    prolog = root / "prom" / "rhc.prolog.prom"
    assert _series(health) == before  # all of the health program's series are still there
    assert {dict(labels)["source"] for _, labels in _series(prolog)} == {"prolog"}
    assert not _series(prolog) & before  # node_exporter never sees one series twice


def test_health_file_says_when_the_hook_last_succeeded_and_how_often_it_runs(
        tmp_path: Path) -> None:
    """The staleness signal: the health program's last successful run, its duration and the
    interval slurm.conf expects it at (HealthCheckInterval)."""
    import time

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nHealthCheckInterval=17\n")
    root, config = _setup(tmp_path, str(conf))
    from resilient_slurm import fsutil

    state = fsutil.private_dir(str(root / "nodes" / "n1" / "hooks"))
    fsutil.atomic_write_json(os.path.join(state, "streak.json"), {
        "drained": {"reason": "rhc:XID79 gpu3", "since": 1.0}, "drains_total": 2}, mode=0o600)
    before = time.time()
    assert _hook("resilient_slurm_lab.hardware.hooks:health_main", config).returncode == 0
    values = {s.name: s.value for f in text_string_to_metric_families(
        (root / "prom" / "rhc.prom").read_text()) for s in f.samples}
    assert before <= values["resilient_hook_last_success_timestamp_seconds"] <= time.time()
    assert 0 < values["resilient_hook_last_success_duration_seconds"] < 60
    assert values["resilient_hook_interval_seconds"] == 17
    # our drain standing on the node, our drains so far, the fleet guard's share
    samples = {(s.name, s.labels.get("cause")): s.value for f in text_string_to_metric_families(
        (root / "prom" / "rhc.prom").read_text()) for s in f.samples}
    assert samples[("resilient_node_drained", "XID79")] == 1
    assert samples[("resilient_node_drains_total", None)] == 2
    assert samples[("resilient_hook_max_drain_fraction", None)] == 0.1
