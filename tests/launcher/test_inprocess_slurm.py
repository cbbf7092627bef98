"""resilient-launch --inprocess on the real sandbox: three levels on one job.

3 nodes, one rank each, ``--min-nodes=2``. A first SIGKILL is handled in-process (level 0:
the survivors shrink to 2 ranks from the peer copy, no new process); a second leaves one rank,
below the minimum, so ft_launcher (level 1) restarts the workers on all three nodes, which
resume from the same memory tiers (resharded from 2 ranks onto 3, no step lost). The job
completes in its first cycle, unrequeued, with the digest of an uninterrupted run, and the
report names the level that handled each fault.

That is NVRx 0.4.1-0.5.x. From 0.6 ft_launcher takes only ``--ft-restart-policy=any-failed``
(and reads ``--nnodes MIN:MAX`` as hot spares), so level 1 cannot be wired and ``--inprocess``
refuses by design (docs/inprocess.md, "On each NVRx release"): on those releases each test
submits the same job and asserts that refusal, as the job sees it, instead of the recovery.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest

pytestmark = pytest.mark.slurm

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext.inprocess")

from launch_helpers import (  # type: ignore[import-not-found]  # noqa: E402
    fault_free,
    handled,
    kinds,
    log_of,
    submit,
    wait_job,
)

from tests.training.inprocess_harness import SHORT_TIMEOUTS  # noqa: E402

STEPS = 12
# Level 1's heartbeat timeouts above level 0's hard timeout + 10 s, as the plan requires: the
# job exports level 0's short sandbox timeouts (SHORT_TIMEOUTS, hard 20 s), which the
# launcher's check and the ranks both read.
LAUNCH = ["--inprocess", "--min-nodes=2", "--heartbeat-timeout=40",
          "--initial-heartbeat-timeout=180"]
NVRX = version("nvidia-resiliency-ext")
REFUSED = tuple(int(x) for x in NVRX.split(".")[:2]) >= (0, 6)


def assert_refused(slurm, jid: int, tmp_path, state: str) -> None:
    """NVRx >= 0.6: the job ends at once with resilient-launch's usage exit (2) and one line
    naming the installed release, why, and the two ways on; nothing was started."""
    job = wait_job(slurm, jid, timeout=180)
    log = log_of(tmp_path, jid)
    assert (job.state, job.exit_code, job.restart_count) == ("FAILED", 2, 0), log
    (line,) = [ln for ln in log.splitlines() if ln.startswith("resilient-launch: error:")]
    assert f"the installed {NVRX} has any-failed" in line, line
    assert "--ft-restart-policy=min-healthy" in line and "hot spares" in line, line
    assert "Run without --inprocess" in line, line
    assert "'nvidia-resiliency-ext>=0.4.1,<0.6'" in line, line
    assert "Traceback" not in log, log
    assert not kinds(state, "cycle_start"), "refused before any ft_launcher ran"


def test_inprocess_levels_under_resilient_launch(slurm, clean, tmp_path):
    jid, _, state = submit(
        slurm, clean, tmp_path, 3,
        LAUNCH,
        ["--inprocess", "--fault=sigkill@4@rank1", "--fault=sigkill@8@rank1"], steps=STEPS,
        exports=SHORT_TIMEOUTS)
    if REFUSED:
        assert_refused(slurm, jid, tmp_path, state)
        return
    digest = fault_free(3, STEPS, tmp_path)
    job = wait_job(slurm, jid, timeout=600)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 0
    assert digest in log
    assert len(kinds(state, "cycle_start")) == 1
    resumes = [e for e in kinds(state, "resume") if e.get("source") == "training"]
    level0 = [e for e in resumes if e.get("level") == "inprocess"]
    level1 = [e for e in resumes if e.get("restart") not in (None, "0")]
    assert len(level0) == 1 and level0[0]["source_state"] == "memory", resumes
    assert level0[0]["world_size"] == 2 and level0[0]["step"] == 3
    assert level0[0]["lost_nodes"], "level 0's record names the node the dead rank ran on"
    # level 1's fresh processes resume from the same memory tiers: the 2-rank set of step 7
    # (the last before the second SIGKILL) resharded onto all three nodes
    assert len(level1) == 1 and level1[0]["source_state"] == "memory", resumes
    assert level1[0]["world_size"] == 3 and level1[0]["step"] == 7, level1
    assert handled(state) == [("sigkill", "in-process restart (level 0, ranks 1 left out)"),
                              ("sigkill", "in-job restart (ft_launcher)")]


def test_node_fault_left_out_in_process_does_not_stop_the_step(slurm, clean, tmp_path):
    """A node fault (node3's simulated GPU is lost and its rank dies; its NVRx monitor lives
    on) under --inprocess: level 0 leaves node3 out from memory, and when the health program
    drains node3 the launcher records it (``left_out``) instead of stopping the step for a
    relaunch from disk. A later SIGKILL leaves 1 rank, below --min-nodes: ft_launcher (level
    1) restarts every node's worker, node3's included, so node3 is back in the step: the
    launcher stops the step at once, blames node3 and goes on without it (no endless level-1
    rounds on a node whose GPU is gone). No requeue, the fault-free digest."""
    # 56 steps of >= 0.3 s between the faults: longer than the health interval (10 s) plus
    # the launcher's state check (5 s), so the drain is seen before level 1 brings node3 back.
    steps = 80
    jid, _, state = submit(
        slurm, clean, tmp_path, 3,
        LAUNCH,
        ["--inprocess", "--fault=node@4@node3", "--fault=sigkill@60@rank0"],
        ("--nodelist=node[1-3]",), steps=steps, exports=SHORT_TIMEOUTS)
    if REFUSED:
        assert_refused(slurm, jid, tmp_path, state)
        return
    digest = fault_free(3, steps, tmp_path)
    job = wait_job(slurm, jid, timeout=600)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 0
    assert digest in log
    level0 = [e for e in kinds(state, "resume") if e.get("level") == "inprocess"]
    assert level0 and level0[0]["lost_nodes"] == ["node3"], level0
    assert [e["node"] for e in kinds(state, "left_out")] == ["node3"]
    (kill,) = [e for e in kinds(state, "fault") if e.get("type") == "sigkill"]
    stops = kinds(state, "stop_cycle")
    # (a second stop_cycle, signalled false, may say that the step did not end within the
    # node fault's stop grace and was killed: launcher/step.py)
    assert [s["ts"] > kill["ts"] and "node3" in s["reason"] for s in stops
            if "reason" in s and s.get("signalled") is not False] \
        == [True], stops  # the drain alone never stopped the step; node3's return did
    assert [(e["node"], e["mode"]) for e in kinds(state, "exclude")] == [("node3", "elastic")]
    assert kinds(state, "cycle_start")[-1]["nodes"] == ["node1", "node2"]
    lost = ",".join(str(r) for r in level0[0]["lost_ranks"])  # node3's rank (rendezvous order)
    assert handled(state)[0] == ("node", f"in-process restart (level 0, ranks {lost} left out)")


def test_spare_stands_by_in_level0_and_takes_a_lost_nodes_place(slurm, clean, tmp_path):
    """``--inprocess --spares 1`` on a 4-node allocation: every node runs a rank, 3 train and
    the last in the rendezvous's rank order stands by inside level 0 (torch imported, in the
    Wrapper). A node fault on training rank 1 (its GPU lost, its rank killed) is taken by the
    standby in the live processes: no new process, no new cycle, no requeue, the world still
    3 ranks, resumed at the step the dead rank finished last (its state from the peer node's
    copy), and the digest of a fault-free 3-rank run."""
    steps = 40
    jid, _, state = submit(
        slurm, clean, tmp_path, 4, [*LAUNCH, "--spares=1"],
        ["--inprocess", "--fault=node@6@rank1"], steps=steps, exports=SHORT_TIMEOUTS)
    if REFUSED:
        assert_refused(slurm, jid, tmp_path, state)
        return
    digest = fault_free(3, steps, tmp_path)
    job = wait_job(slurm, jid, timeout=600)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log[-5000:]
    assert job.restart_count == 0 and not kinds(state, "requeue")
    assert digest in log
    (cycle,) = kinds(state, "cycle_start")
    assert len(cycle["nodes"]) == 4, cycle  # the spare runs ranks from the start
    resumes = [e for e in kinds(state, "resume") if e.get("source") == "training"]
    first = [e for e in resumes if not e.get("iteration")]
    assert first and first[0]["world_size"] == 3, resumes
    (standby,) = first[0]["standby_nodes"]
    (swap,) = [e for e in resumes if e.get("level") == "inprocess"]
    assert swap["world_size"] == 3 and swap["source_state"] == "memory", swap
    assert swap["step"] == 5, "the dead rank finished step 5: 0 steps lost"
    (lost,) = swap["lost_nodes"]
    assert lost != standby and not swap.get("standby_nodes"), swap
    assert [e["node"] for e in kinds(state, "left_out")] in ([], [lost])
    assert not kinds(state, "stop_cycle"), "level 0 handled it; the step was never stopped"
    took = ",".join(map(str, swap["lost_ranks"]))
    assert handled(state)[0] == (
        "node", f"in-process restart (level 0, a standby took ranks {took}' place)"), handled(state)
    (fault,) = [e for e in kinds(state, "fault") if e.get("type") == "node"]
    (back,) = [e for e in kinds(state, "recovered") if e.get("iteration") == swap["iteration"]]
    print(f"\nin-process spare swap: the node fault to the first step after it "
          f"{back['ts'] - fault['ts']:.1f} s ({lost} -> {standby})")
