"""The comparison's plan (no cluster): schedules, arguments, which script runs which mechanism."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare  # noqa: E402
import render  # noqa: E402
import run_figures  # noqa: E402


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
        if mech in compare.LEVEL0:  # level 0's soft timeout finds its hang
            assert "--inprocess" in compare.train_args(wl, "/ck", True, mech, 20)
            knob = env["RESILIENT_INPROCESS_SOFT_TIMEOUT"]
            assert float(env["FT_HB_TIMEOUT"]) > float(env["RESILIENT_INPROCESS_HARD_TIMEOUT"])
        assert knob == "20", (mech, env)
        assert script.exists()
    assert compare.script_and_env("ft_launcher", 20, "/ev")[0].name == "ft-launcher.sbatch"
    text = compare.script_and_env("ft_launcher", 20, "/ev")[0].read_text()
    assert "scontrol requeue" in text  # the requeue-on-failure batch script, not a straw man


def test_the_spare_mechanism_holds_one_node_more_and_snapshots_every_step(tmp_path) -> None:
    """Issue 26's row: the same training nodes plus one hot spare (--spares 1 on an allocation
    one node larger), memory tiers on, otherwise resilient-launch's settings; and its step-time
    figure is the training's own per-step time."""
    wl = compare.workload("sparse")
    _, env, _ = compare.script_and_env(compare.SPARE, 20, "/ev")
    _, plain, _ = compare.script_and_env("resilient-launch", 20, "/ev")
    assert env["RESILIENT_LAUNCH_ARGS"] == "--spares 1 " + plain["RESILIENT_LAUNCH_ARGS"]
    assert compare.SPARES == {compare.SPARE: 1, compare.INPROCESS_SPARE: 1}
    args = compare.train_args(wl, "/ck", True, compare.SPARE, 20)
    args.remove("--memory-tiers")
    assert args == compare.train_args(wl, "/ck", True, "resilient-launch", 20)
    ev = tmp_path / "ev.jsonl"
    lines = [{"kind": "progress", "step": s, "step_time": t, "ts": float(s)}
             for s, t in ((1, 0.2), (2, 0.3), (2, 0.3), (3, 0.25), (4, 9.0), (5, 0.21))]
    ev.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert run_figures.step_median(str(ev)) == 0.25  # one per step (a commit repeats step 2)
    assert run_figures.step_median(str(tmp_path / "none.jsonl")) is None


def test_tier_cost_compares_only_the_window_both_runs_trained_in(tmp_path) -> None:
    """The fault-free run ends early, while the machine was loaded: its steps are slow. Only
    the steps both runs took in the same wall-time window are compared."""
    def write(name: str, rows: list[tuple[float, float]]) -> str:
        p = tmp_path / name
        p.write_text("".join(json.dumps({"kind": "progress", "step": i + 1, "ts": ts,
                                         "step_time": t}) + "\n"
                             for i, (ts, t) in enumerate(rows)))
        return str(p)

    free = write("free.jsonl", [(float(t), 0.30) for t in range(0, 40)])  # loaded: 300 ms
    tiers = write("tiers.jsonl", [(float(t), 0.33) for t in range(0, 40)]  # 10% dearer then
                  + [(float(t), 0.20) for t in range(40, 200)])  # alone later: fast
    got = run_figures.tier_cost(tiers, free)
    assert got is not None and got["cost"] == 0.1 and got["steps"] == [40, 40]
    assert got["window_s"] == 39.0
    assert run_figures.tier_cost(tiers, str(tmp_path / "none.jsonl")) is None
    assert run_figures.tier_cost(write("short.jsonl", [(1.0, 0.3)] * 3), free) is None  # too few


def test_swap_breakdown_splits_detection_relaunch_and_start() -> None:
    evs = [{"ts": 100.0, "kind": "fault", "source": "training", "type": "node"},
           {"ts": 101.0, "kind": "progress", "step": 5},  # a survivor's step before the stop
           {"ts": 130.0, "kind": "blame", "nodes": ["n2"]},
           {"ts": 131.0, "kind": "spare", "node": "n4", "out": "n2"},
           {"ts": 140.0, "kind": "cycle_start"},
           {"ts": 152.5, "kind": "progress", "step": 6}]
    assert run_figures.swap_breakdown(evs) == {
        "fault_to_blame_s": 30.0, "blame_to_cycle_start_s": 10.0,
        "cycle_start_to_first_step_s": 12.5, "total_s": 52.5}
    assert run_figures.swap_breakdown(evs[:3]) is None  # no spare swapped in: no breakdown
    assert run_figures.swap_breakdown([e for e in evs if e["kind"] != "fault"]) is None


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


def test_worker_pids_finds_only_that_jobs_worker_on_that_node(tmp_path) -> None:
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


def test_swap_breakdown_splits_the_stop_and_the_new_cycles_start() -> None:
    evs = [{"ts": 100.0, "kind": "fault", "source": "training", "type": "node"},
           {"ts": 103.0, "kind": "stop_cycle", "reason": "node fault: n2"},
           {"ts": 106.0, "kind": "blame", "nodes": ["n2"]},
           {"ts": 106.1, "kind": "spare", "node": "n4", "out": "n2"},
           {"ts": 106.2, "kind": "cycle_start"},
           {"ts": 109.0, "kind": "rendezvous", "node": "n1"},
           {"ts": 110.2, "kind": "rendezvous", "node": "n4"},
           {"ts": 113.0, "kind": "first_heartbeat", "rank": 0},
           {"ts": 114.2, "kind": "first_heartbeat", "rank": 1},
           {"ts": 115.0, "kind": "progress", "step": 6}]
    w = run_figures.swap_breakdown(evs)
    assert w == {"fault_to_blame_s": 6.0, "blame_to_cycle_start_s": 0.2, "fault_to_stop_s": 3.0,
                 "cycle_start_to_first_step_s": 8.8, "total_s": 15.0,
                 "cycle_start_to_rendezvous_s": 4.0, "to_first_heartbeat_s": 4.0,
                 "first_heartbeat_to_step_s": 0.8}
    line = render.swap_line("m", w)
    assert "the step stopped 3.0 s after the fault" in line
    assert "4.0 s to the last node's rendezvous join" in line and "0.8 s to the first step" in line


def test_the_inprocess_spare_mechanism_is_inprocess_on_one_node_more() -> None:
    """The level-0 spare row: --inprocess's settings and training arguments, plus --spares 1
    (the allocation one node larger: compare.submit adds SPARES)."""
    wl = compare.workload("sparse")
    _, env, _ = compare.script_and_env(compare.INPROCESS_SPARE, 20, "/ev")
    _, ip, _ = compare.script_and_env(compare.INPROCESS, 20, "/ev")
    assert env["RESILIENT_LAUNCH_ARGS"] == ip["RESILIENT_LAUNCH_ARGS"] + " --spares 1"
    assert compare.train_args(wl, "/ck", True, compare.INPROCESS_SPARE, 20) == \
        compare.train_args(wl, "/ck", True, compare.INPROCESS, 20)
