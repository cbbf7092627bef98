"""The comparison's plan (no cluster): schedules, arguments, which script runs which mechanism."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare  # noqa: E402


def test_sparse_schedule_has_one_fault_of_each_type_over_300_steps() -> None:
    wl = compare.workload("sparse")
    assert wl.steps >= 300 and wl.fault_seed == compare.sparse_seed(wl.steps, wl.nodes)
    assert sorted(f.type for f in wl.schedule()) == ["exception", "hang", "node", "sigkill"]


def test_dense_schedule_is_todays() -> None:
    got = [f"{f.type}@{f.step}" for f in compare.workload("dense").schedule()]
    assert got == ["node@12", "hang@22", "sigkill@29", "exception@36", "sigkill@56"]


def test_node_fault_is_the_harness_others_are_targeted() -> None:
    wl = compare.workload("sparse")
    args = compare.train_args(wl, "/ck", faults=True)
    faults = [args[i + 1] for i, a in enumerate(args) if a == "--fault"]
    assert faults == ["sigkill@140@rank1", "exception@245@rank2", "hang@285@rank2"]
    assert "--fault-count" not in args and "--fault" not in compare.train_args(wl, "/ck", False)


def test_same_hang_timeout_for_every_mechanism() -> None:
    wl = compare.workload("dense")
    for mech in compare.MECHS:
        script, env, _ = compare.script_and_env(mech, 20, "/ev")
        knob = env.get("PG_TIMEOUT") or env.get("FT_HB_TIMEOUT")
        if mech == compare.INPROCESS:  # level 0's soft timeout finds its hang
            args = compare.train_args(wl, "/ck", True, mech, 20)
            knob = args[args.index("--soft-timeout") + 1]
            assert float(env["FT_HB_TIMEOUT"]) > float(args[args.index("--hard-timeout") + 1])
        assert knob == "20", (mech, env)
        assert script.exists()
    assert compare.script_and_env("ft_launcher", 20, "/ev")[0].name == "ft-launcher.sbatch"
    text = compare.script_and_env("ft_launcher", 20, "/ev")[0].read_text()
    assert "scontrol requeue" in text  # the requeue-on-failure batch script, not a straw man


AGENT = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-u", sys.argv[1]])
print(worker.pid, flush=True)
worker.wait()
"""
WORKER = """
import os, time
if os.fork() == 0:  # a daemon the worker forks (as NVRx's in-process monitor): no GPU user
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_worker_pids_finds_only_that_jobs_worker_on_that_node(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The training worker the agent started, on that job and node: not its forked daemon,
    not a process that only names the script, not another job's or node's."""
    import os
    import subprocess
    import time

    (tmp_path / "gated_train.py").write_text(WORKER)
    (tmp_path / "ft_launcher").write_text(AGENT)
    env = {**os.environ, "SLURM_JOB_ID": "424242", "SLURMD_NODENAME": "nodeX"}
    agent = subprocess.Popen([sys.executable, str(tmp_path / "ft_launcher"),
                              str(tmp_path / "gated_train.py")], env=env,
                             stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "gated_train.py"], env=env)  # not the script python runs
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not compare.worker_pids(424242, "nodeX"):
            time.sleep(0.1)
        time.sleep(0.5)  # the forked daemon is up too
        assert compare.worker_pids(424242, "nodeX") == [worker]
        assert compare.worker_pids(424242, "nodeY") == []
        assert compare.worker_pids(424243, "nodeX") == []
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(agent.pid)], check=False)  # our own tree
        for proc in (agent, other):
            proc.kill()
            proc.wait()
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path / "gated_train.py")], check=False)
