"""The node watcher (``resilient-health watch``, hooks/watch.py) without Slurm: simulated
hardware, the real watcher process, Slurm pointed at nothing (a drain then fails, recorded as
``action_failed``). What it publishes, what it leaves alone, its arguments. On the real
sandbox (drains, never a resume): test_watch_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from resilient_slurm import verdict_file
from resilient_slurm.events import read_events
from resilient_slurm.hooks.exits import EXIT_HOOK_ERROR
from resilient_slurm.hooks.health_cli import main as health_cli
from resilient_slurm_lab.hardware.simulate import install_scenario

from .conftest import hook_config


def run_watch(config: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The watcher as its service runs it: root, a bare environment, ``python -I``."""
    code = ("import sys; from resilient_slurm_lab.hardware.hooks import watch_main; "
            f"sys.exit(watch_main(['--config', {config!r}, *sys.argv[1:]]))")
    return subprocess.run([sys.executable, "-I", "-c", code, *args],
                          env={"SLURMD_NODENAME": "n1"}, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def _root(config: str) -> str:
    return os.path.dirname(config)


def _events(config: str, **match):
    path = os.path.join(_root(config), "events.jsonl")
    return [e for e in read_events(path) if all(e.get(k) == v for k, v in match.items())]


def test_a_healthy_node_gets_nothing_published(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True, extra="watch_interval_s = 0.2\n")
    done = run_watch(cfg, "--ticks", "3")
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(os.path.join(_root(cfg), "verdicts", "n1.json"))  # escalate only
    assert [e["cause"] for e in _events(cfg, kind="watch_start")] == [
        "every 0.2 s: gpu_count, ecc, row_remap, recovery_action, error_rates"]
    assert not _events(cfg, kind="verdict")


def test_a_lost_gpu_is_published_once_and_the_kernel_log_position_is_left(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True, extra="watch_interval_s = 0.2\n")
    node_dir = os.path.join(_root(cfg), "nodes", "n1")
    install_scenario(node_dir, "xid79")
    health_state = os.path.join(node_dir, "health")
    before = sorted(os.listdir(health_state)) if os.path.isdir(health_state) else []
    done = run_watch(cfg, "--ticks", "4")
    assert done.returncode == 0, done.stderr
    path = os.path.join(_root(cfg), "verdicts", "n1.json")
    v = verdict_file.read(path)
    assert v is not None and v.status == "fail" and "GPU_LOST" in v.codes
    assert json.loads(open(path).read())["source"] == "watch"
    verdicts = _events(cfg, kind="verdict", source="watch")
    assert len(verdicts) == 1 and verdicts[0]["status"] == "fail"  # 4 ticks, one failure
    # the drain was tried (Slurm is pointed at nothing here) and said so
    assert _events(cfg, kind="action_failed", source="watch")
    # no kernel-log check: the health program's saved read position is not written
    after = sorted(os.listdir(health_state)) if os.path.isdir(health_state) else []
    assert after == before


def test_unknown_is_never_acted_on(tmp_path):
    cfg = hook_config(tmp_path, verdicts=True,
                      extra="watch_interval_s = 0.2\nwatch_budget_s = 2\n")
    install_scenario(os.path.join(_root(cfg), "nodes", "n1"), "nvml-hang")
    done = run_watch(cfg, "--ticks", "2", timeout=90)
    assert not _events(cfg, kind="verdict")
    assert not os.path.exists(os.path.join(_root(cfg), "verdicts", "n1.json"))
    # NVML left wedged in a thread: the watcher ends for a fresh process (its service restarts it)
    assert done.returncode == EXIT_HOOK_ERROR and "wedged" in done.stderr, done.stderr


def test_bad_watch_settings_are_usage_errors(tmp_path):
    cfg = hook_config(tmp_path, extra='watch_checks = ["gpu_count", "nope"]\n')
    done = run_watch(cfg, "--ticks", "1")
    assert done.returncode == 2 and "hooks.watch_checks" in done.stderr and "nope" in done.stderr
    (tmp_path / "b").mkdir()
    cfg2 = hook_config(tmp_path / "b", extra="watch_interval_s = 0.01\n")
    done = run_watch(cfg2, "--ticks", "1")
    assert done.returncode == 2 and "watch_interval_s" in done.stderr
    done = run_watch(cfg, "--ticks", "0")
    assert done.returncode == 2 and "--ticks" in done.stderr


def test_help_teaches_what_it_does():
    out = CliRunner().invoke(health_cli, ["watch", "--help"])
    assert out.exit_code == 0
    for word in ("root service", "never resumes", "unknown", "watch_interval_s", "systemd"):
        assert word in out.output
