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
    for mech in compare.MECHS:
        script, env, _ = compare.script_and_env(mech, 20, "/ev")
        knob = env.get("PG_TIMEOUT") or env.get("FT_HB_TIMEOUT")
        assert knob == "20", (mech, env)
        assert script.exists()
    assert compare.script_and_env("ft_launcher", 20, "/ev")[0].name == "ft-launcher.sbatch"
    text = compare.script_and_env("ft_launcher", 20, "/ev")[0].read_text()
    assert "scontrol requeue" in text  # the requeue-on-failure batch script, not a straw man


def test_worker_pids_finds_only_that_jobs_worker_on_that_node(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess

    script = tmp_path / "gated_train.py"
    script.write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "SLURM_JOB_ID": "424242", "SLURMD_NODENAME": "nodeX"}
    p = subprocess.Popen([sys.executable, "-u", str(script)], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "gated_train.py"], env=env)  # not the script python runs
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not compare.worker_pids(424242, "nodeX"):
            time.sleep(0.1)
        assert compare.worker_pids(424242, "nodeX") == [p.pid]
        assert compare.worker_pids(424242, "nodeY") == []
        assert compare.worker_pids(424243, "nodeX") == []
    finally:
        p.kill()
        other.kill()
        p.wait()
        other.wait()
