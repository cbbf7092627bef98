"""Command lines, allocation parsing and NVRx flag detection (pure, no Slurm)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.shim.node import read_addrs, substitute

HELP_041 = """usage: ft_launcher [-h] [--nnodes NNODES]
  --local-addr LOCAL_ADDR, --local_addr LOCAL_ADDR
  --ft-initial-rank-heartbeat-timeout X, --ft-param-initial_rank_heartbeat_timeout X
  --ft-rank-heartbeat-timeout X
  --ft-enable-nic-monitor FT_ENABLE_NIC_MONITOR
  --ignore-missing-fault-tol-cfg
  --term-timeout T --workers-stop-timeout T --monitor-interval M --log-dir D
"""
HELP_NEW = """usage: ft_launcher
  --local-addr A
  --ft-param-initial_rank_heartbeat_timeout X
  --ft-param-rank_heartbeat_timeout X
  --term-timeout T
"""


def feats(text: str) -> plan.Features:
    return plan.Features(plan.parse_help(text), "x")


def test_allocation_from_env() -> None:
    a = plan.Allocation.from_env({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]",
                                  "SLURM_RESTART_COUNT": "2", "SLURM_CLUSTER_NAME": "c"})
    assert a.nodes == ("node1", "node2", "node3") and a.restart_count == 2 and a.job_id == 42


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_ID": "1"}, {"SLURM_JOB_NODELIST": "n1"},
                                 {"SLURM_JOB_ID": "x", "SLURM_JOB_NODELIST": "n1"},
                                 {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-"}])
def test_allocation_missing_is_plan_error(env: dict[str, str]) -> None:
    with pytest.raises(plan.PlanError):
        plan.Allocation.from_env(env)


def test_parse_help_finds_long_flags() -> None:
    flags = plan.parse_help(HELP_041)
    assert "--ft-enable-nic-monitor" in flags and "--local_addr" in flags
    assert "--nnodes" in flags and "-h" not in flags


def test_flags_follow_release() -> None:
    old, new = feats(HELP_041), feats(HELP_NEW)
    assert old.flag("heartbeat") == "--ft-rank-heartbeat-timeout"
    assert new.flag("heartbeat") == "--ft-param-rank_heartbeat_timeout"
    assert new.flag("nic_monitor") is None and new.flag("ignore_missing_cfg") is None


def test_ft_command_old_and_new() -> None:
    opts = plan.LaunchOptions(script="t.py", script_args=("--a", "1"), heartbeat_timeout=8,
                              initial_heartbeat_timeout=60.5, nproc_per_node="2")
    argv = plan.ft_command(opts, feats(HELP_041), 3, "10.0.0.1:2345", "rid")
    assert argv[:7] == ["ft_launcher", "--nnodes=3", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=10.0.0.1:2345", "--rdzv-id=rid", "--max-restarts=3"]
    assert "--ft-rank-heartbeat-timeout=8" in argv
    assert "--ft-initial-rank-heartbeat-timeout=60.5" in argv
    assert "--ft-enable-nic-monitor=false" in argv and "--local-addr={local_addr}" in argv
    assert argv[-3:] == ["t.py", "--a", "1"]
    new = plan.ft_command(opts, feats(HELP_NEW), 3, "h:1", "rid")
    assert "--ft-param-rank_heartbeat_timeout=8" in new
    assert not any(a.startswith("--ft-enable-nic") for a in new)


def test_passthrough_wins_and_module() -> None:
    opts = plan.LaunchOptions(script="pkg.train", module=True,
                              ft_args=("--ft-rank-heartbeat-timeout=99",))
    argv = plan.ft_command(opts, feats(HELP_041), 1, "h:1", "r")
    assert argv.count("--ft-rank-heartbeat-timeout=99") == 1
    assert not any(a.startswith("--ft-rank-heartbeat-timeout=60") for a in argv)
    assert argv[-2:] == ["-m", "pkg.train"]


def test_rdzv_port_fresh_per_cycle_and_stable() -> None:
    a = plan.Allocation(job_id=7, nodes=("n1",), cluster="c")
    ports = {plan.rdzv_port(a, c) for c in range(1, 20)}
    # outside Linux's default ephemeral range 32768-60999 (where outgoing connections take
    # their ports), in the larger free stretch around it
    assert len(ports) >= 18 and all(10000 <= p < 32768 for p in ports)
    high = {plan.rdzv_port(a, c, (10000, 30000)) for c in range(1, 20)}
    assert all(30000 < p <= 65535 for p in high)
    assert plan.rdzv_port(a, 3) == plan.rdzv_port(a, 3)
    assert plan.rdzv_id(a, 2) == "rs-7-r0-c2"


def test_plan_cycle_srun_line(tmp_path) -> None:
    a = plan.Allocation(job_id=9, nodes=("node1", "node2", "node3"))
    cycle = plan.plan_cycle(a, plan.LaunchOptions(script="t.py"), feats(HELP_041),
                          ["node1", "node2"], {"node1": "10.0.0.1", "node2": "10.0.0.2"}, 1,
                          str(tmp_path))
    argv = list(cycle.argv)
    assert argv[0] == "srun" and "--ntasks=2" in argv and "--ntasks-per-node=1" in argv
    assert not any(a.startswith("--nodes") for a in argv)  # 24.11+: not beside arbitrary
    assert "--nodelist=node1,node2" in argv and "--jobid=9" in argv
    assert cycle.endpoint.startswith("10.0.0.1:")
    files = dict(cycle.files)
    addrs_file = files and next(p for p in files if p.endswith("addrs.json"))
    assert f"--addrs-file={addrs_file}" in argv
    assert json.loads(files[addrs_file]) == {"node1": "10.0.0.1", "node2": "10.0.0.2"}
    assert argv.index("--") < argv.index("ft_launcher")
    with pytest.raises(plan.PlanError):
        plan.plan_cycle(a, plan.LaunchOptions(script="t.py"), feats(HELP_041), [], {}, 1, "d")


def test_nodes_sharing_an_address_tell_nvrx_it_is_meant(tmp_path) -> None:
    # NVRx 0.7 closes the rendezvous when two ft_launchers share an address (seen on the
    # Slurm 26.05 stage, where the sandbox's nodes are all 127.0.0.1) unless told it is meant.
    a = plan.Allocation(job_id=9, nodes=("node1", "node2", "node3"))
    opts = plan.LaunchOptions(script="t.py")
    shared = plan.plan_cycle(a, opts, feats(HELP_NEW), ["node1", "node2"],
                             {"node1": "127.0.0.1", "node2": "127.0.0.1"}, 1, str(tmp_path))
    assert dict(shared.env) == {"NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1"}
    for addrs in ({"node1": "10.0.0.1", "node2": "10.0.0.2"}, {"node1": "10.0.0.1"}, {}):
        distinct = plan.plan_cycle(a, opts, feats(HELP_NEW), ["node1", "node2"], addrs, 1,
                                   str(tmp_path))
        assert distinct.env == (), addrs


def test_node_shim_substitution() -> None:
    assert read_addrs("/nonexistent/addrs.json") == {}
    cmd = ["ft", "--local-addr={local_addr}", "--log-dir=/x/{node}", "s.py"]
    assert substitute(cmd, "n1", "1.2.3.4") == ["ft", "--local-addr=1.2.3.4", "--log-dir=/x/n1",
                                                "s.py"]
    assert substitute(cmd, "n2", "") == ["ft", "--log-dir=/x/n2", "s.py"]


def test_node_shim_records_exit(tmp_path, monkeypatch) -> None:
    import json
    import sys

    from resilient_slurm.launcher.shim import node

    monkeypatch.setenv("SLURMD_NODENAME", "nodeX")
    rc = node.main([f"--record-dir={tmp_path}", "--capture", "--",
                    sys.executable, "-c", "print('hi'); raise SystemExit(3)"])
    rec = json.loads((tmp_path / "nodeX.json").read_text())
    assert rc == 3 and rec["rc"] == 3 and rec["stdout"].strip() == "hi"
    rc = node.main([f"--record-dir={tmp_path}", "--", "/nonexistent/prog"])
    assert rc == 127


def test_resized_env_matches_the_released_allocation() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NODELIST": "n[1-4]", "SLURM_NNODES": "4",
           "SLURM_JOB_NUM_NODES": "4", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "1(x4)",
           "SLURM_JOB_CPUS_PER_NODE": "4(x2),8(x2)", "HOME": "/h"}
    out = plan.resized_env(env, ["n1", "n2", "n3", "n4"], ["n1", "n3", "n4"])
    assert out["SLURM_JOB_NODELIST"] == out["SLURM_NODELIST"] == "n[1,3-4]"
    assert out["SLURM_NNODES"] == out["SLURM_JOB_NUM_NODES"] == "3"
    assert out["SLURM_JOB_CPUS_PER_NODE"] == "4,8(x2)"
    assert "SLURM_NTASKS" not in out and "SLURM_TASKS_PER_NODE" not in out
    assert out["HOME"] == "/h" and env["SLURM_NNODES"] == "4"  # the input is left alone
    odd = plan.resized_env({**env, "SLURM_JOB_CPUS_PER_NODE": "weird"}, ["n1", "n2"], ["n1"])
    assert "SLURM_JOB_CPUS_PER_NODE" not in odd


# What NVRx 0.4.1's ``ft_launcher --help --ignore-missing-fault-tol-cfg ...`` prints on stderr.
DEPRECATION_041 = """launcher.py:1091: UserWarning: Argument --ignore-missing-fault-tol-cfg is \
deprecated and will be removed in NVRx v0.5
  warnings.warn(f"Argument {arg} is deprecated and will be removed in NVRx v0.5")
launcher.py:1091: UserWarning: Argument --ft-param-initial_rank_heartbeat_timeout is deprecated \
and will be removed in NVRx v0.5
"""


def test_deprecated_flags_are_never_passed() -> None:
    f = plan.Features(plan.parse_help(HELP_041), "0.4.1", plan.parse_deprecated(DEPRECATION_041))
    assert f.deprecated == {"--ignore-missing-fault-tol-cfg",
                            "--ft-param-initial_rank_heartbeat_timeout"}
    argv = plan.ft_command(plan.LaunchOptions(script="t.py", initial_heartbeat_timeout=300),
                           f, 2, "h:1", "r")
    assert not set(argv) & f.deprecated
    assert not any(a.startswith(tuple(f.deprecated)) for a in argv)
    assert "--ft-initial-rank-heartbeat-timeout=300" in argv  # the current spelling instead


def test_monitor_interval_is_ft_launchers_own() -> None:
    argv = plan.ft_command(plan.LaunchOptions(script="t.py"), feats(HELP_041), 2, "h:1", "r")
    assert not any(a.startswith("--monitor-interval") for a in argv)


@pytest.mark.train
def test_detect_features_on_the_installed_nvrx() -> None:
    import shutil
    import sys

    exe = shutil.which("ft_launcher") or os.path.join(os.path.dirname(sys.executable),
                                                      "ft_launcher")
    if not os.path.exists(exe):
        pytest.skip("nvidia-resiliency-ext not installed")
    f = plan.detect_features(exe)
    assert f.flag("heartbeat") and f.flag("term_timeout")
    argv = plan.ft_command(plan.LaunchOptions(script="t.py"), f, 1, "h:1", "r")
    # run the very flags we pass (less the script): no deprecation warning from NVRx
    out = subprocess.run([exe, "--help", *argv[1:-1]], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0 and "deprecated" not in out.stderr.replace("pynvml package is "
                                                                          "deprecated", "")


def test_ft_launchers_budget_leaves_the_job_budget_to_the_supervisor() -> None:
    assert plan.ft_restart_budget(0) == 0
    assert plan.ft_restart_budget(3) == 4


def test_heartbeat_timeouts_are_nvrx_defaults_unless_the_user_sets_them():
    """No forced 60 s / 300 s: without the user's values ft_launcher keeps NVRx's own (the
    instrumentation then derives them from the observed steps)."""
    f = plan.Features(plan.parse_help(HELP_041), "0.4.1")
    argv = plan.ft_command(plan.LaunchOptions(script="t.py"), f, 2, "h:1", "r")
    assert not any("heartbeat" in a for a in argv)
    opts = plan.LaunchOptions(script="t.py")
    assert (opts.heartbeat_s, opts.initial_heartbeat_s) == (2700.0, 3600.0)
    argv = plan.ft_command(plan.LaunchOptions(script="t.py", heartbeat_timeout=120), f, 2,
                           "h:1", "r")
    assert "--ft-rank-heartbeat-timeout=120" in argv
    assert not any("initial" in a for a in argv)
