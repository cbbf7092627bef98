"""Issue 26 acceptance (hot spares), production timing, as the job user, on ``prod6_sandbox``:
a 4-node allocation with ``resilient-launch --spares 1`` runs a 3-node job of the memory-tier
script (``foreign/train_tiers.py``: ``checkpoint.save`` every step, no disk checkpoint yet:
the durable interval is longer than the run). At step 30 one training node is lost (its rank
stops mid-step, then ``sandbox node kill`` takes the node: slurmd, step daemons, processes).
The spare takes its place inside the allocation: 0 requeues, world size still 3, every rank
resumes at step 29 (the last step every rank finished: 0 lost steps), each survivor at its
rank of before from its own node's memory (tier 1), the spare at the lost node's rank from the
peer's copy (tier 2), and the run ends with the fault-free weights digest. Prints the swap
time (node loss to the first step after it).

Where the installed ft_launcher has NVRx's own hot spares (NVRx >= 0.6: the Debian-root
stages), the spare is a gated NVRx standby in the same step (``launcher/shim/standby.py``): no
second srun step, the standby promoted in NVRx's next rendezvous round (``spare`` with
``via: standby``), 0 lost steps, the promoted node's rank restored from a peer's copy. On NVRx
0.4.1 (the main stage) the swap is a new cycle with every rank pinned, as above."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import launch_helpers  # type: ignore[import-not-found]  # tests/launcher is on sys.path
import pytest

from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.shim import standby
from resilient_slurm_lab.sandbox import lifecycle
from tests.checkpoint import tier_helpers

pytestmark = [pytest.mark.slurm, pytest.mark.train]

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext")

FOREIGN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "foreign")
BIN = os.path.dirname(sys.executable)
STEPS, FAULT_STEP = 45, 30
START = re.compile(r"\[script\] rank=(\d+) start step=(\d+) tier=(.+?) t=([\d.]+) node=([\w.-]+)")


def _starts(log: str) -> list[tuple[int, int, str, float, str]]:
    return [(int(r), int(s), t, float(ts), n) for r, s, t, ts, n in START.findall(log)]


def _wait_log(path: Path, pattern: str, timeout: float) -> re.Match[str]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not in {path} after {timeout}s:\n"
                         + (path.read_text(errors="replace")[-3000:] if path.exists() else ""))


def test_spare_takes_a_lost_nodes_place_with_zero_lost_steps(prod6, tmp_path):
    sbx, s, user = prod6
    native = standby.native(plan.detect_features(os.path.join(BIN, "ft_launcher")).flags)
    reference = tier_helpers.digest(tier_helpers.on_nodes(
        str(tmp_path), ["a", "b", "c"], ["--steps", str(STEPS), "--step-time", "0"]))
    work = Path(user.make_dir(mode=0o755))
    faults = Path(user.make_dir(str(work / "faults")))
    line = [os.path.join(BIN, "resilient-launch"), "--spares=1", "--nproc-per-node=1",
            "--max-restarts=3", "--heartbeat-timeout=30", "--initial-heartbeat-timeout=120",
            "--term-timeout=3", f"--verdict-path={sbx.p('verdicts', '{node}.json')}",
            f"--checkpoint-dir={work}/ck", os.path.join(FOREIGN, "train_tiers.py"),
            f"--steps={STEPS}", "--step-time=0.2", f"--save-dir={work}/ck",
            "--durable-every=1000",  # no disk checkpoint in this run
            *[f"--fault=hang@{FAULT_STEP}:{r}" for r in range(3)], f"--fault-dir={faults}"]
    batch = work / "job.sbatch"
    batch.write_text(f"#!/bin/bash\nexport RESILIENT_SANDBOX_TIER1_DIR={work}/shm/{{node}}\nexec "
                     + " ".join(line) + "\n")
    os.chown(batch, user.uid, user.gid)
    res = user.run(sbx, ["sbatch", "--parsable", "--nodes=4", "--no-kill", "--requeue",
                         "--open-mode=append", f"--output={work}/slurm-%j.out",
                         f"--chdir={work}", "--job-name=rl-spare", str(batch)],
                   capture_output=True, timeout=60,
                   env={"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    out = work / f"slurm-{jid}.out"
    state = str(work / "ck" / ".resilient")
    _wait_log(out, r"(?s)(\[script\] rank=\d+ start step=0 .*){3}", 300)
    first = {r: n for r, _, _, _, n in _starts(out.read_text())}
    job = s.job(jid)
    batch_host = job.extra.get("batch_host")
    # not the batch host (it cannot leave), not rank 0's node (it hosts the rendezvous store)
    victim_rank = next(r for r, n in sorted(first.items()) if n != batch_host and r > 0)
    victim = first[victim_rank]
    for r in range(3):  # only the victim's rank stops at step 30 (a fault fires once per job)
        if r != victim_rank:
            (faults / f"hang-{FAULT_STEP}-{r}").touch()
    _wait_log(out, rf"\[script\] fault=hang step={FAULT_STEP} rank={victim_rank} ", 300)
    lifecycle.node_kill(sbx.root, victim)
    killed_at = time.time()
    try:
        job = launch_helpers.wait_job(s, jid, 900)
        log = out.read_text(errors="replace")
        assert job.state == "COMPLETED", log[-5000:]
        starts = [(e.get("restart_count"), e.get("allocation"), e.get("nodes"))
                  for e in launch_helpers.kinds(state, "launch_start")]
        why = (f"victim {victim} (rank {victim_rank}), batch host {batch_host}; launch_start "
               f"{starts}; blame {launch_helpers.kinds(state, 'blame')[:2]}")
        assert not launch_helpers.kinds(state, "requeue"), why
        assert job.restart_count == 0, why  # not requeued by Slurm either
        swaps = [e for e in launch_helpers.kinds(state, "spare") if e.get("node")]
        assert [e["out"] for e in swaps] == [victim], swaps
        spare = swaps[0]["node"]
        assert spare not in first.values()  # the standby, not one of the training nodes
        cycles = launch_helpers.kinds(state, "cycle_start")
        last = cycles[-1]["nodes"]
        if native:  # one srun step on all 4 nodes: NVRx promoted its gated standby in it
            assert len(cycles) == 1 and len(last) == 4 and spare in last, cycles
            assert swaps[0].get("via") == "standby", swaps
            assert "--nnodes=3:4" in cycles[0]["argv"], cycles[0]["argv"]
            assert not launch_helpers.kinds(state, "stop_cycle"), why
        else:  # a new srun step on 3 nodes
            assert len(last) == 3 and spare in last and victim not in last, last
            assert "via" not in swaps[0], swaps
        assert [(e["node"], e["mode"]) for e in launch_helpers.kinds(state, "exclude")] == [
            (victim, "standby" if native else "spare")]
        assert f"spare {spare} in for {victim}" in log
        again = [x for x in _starts(log) if x[1] > 0]
        assert sorted(r for r, *_ in again) == [0, 1, 2], again  # world size still 3
        # 0 lost steps: step 30 never finished on the victim's rank; 29 did everywhere
        assert {st for _, st, *_ in again} == {FAULT_STEP - 1}, again
        # Node ranks pinned (launcher/cycle/rank_pin.py): every survivor runs its ranks of the first
        # cycle and restores them from its own node's memory (tier 1); the spare runs exactly
        # the victim's and restores the victim's state from its copy on a peer (tier 2).
        by_rank = {r: (tier, node) for r, _, tier, _, node in again}
        if native:  # NVRx ranks by task: the survivors in order, the promoted standby last
            order = [n for _, n in sorted(first.items()) if n != victim] + [spare]
            assert {r: n for r, (_, n) in by_rank.items()} == dict(enumerate(order)), by_rank
            assert by_rank[2] == ("peer copy", spare), by_rank
            assert all(tier == "own memory" for r, (tier, n) in by_rank.items()
                       if first.get(r) == n), by_rank  # a survivor at its rank of before
        else:
            assert by_rank == {r: ("peer copy", spare) if r == victim_rank
                               else ("own memory", n) for r, n in first.items()}, (first, again)
        assert tier_helpers.digest(log) == reference
        steps = [float(t) for st, t in re.findall(r"\[script\] step=(\d+) .* t=([\d.]+)", log)
                 if int(st) == FAULT_STEP and float(t) > killed_at]
        assert steps, log[-3000:]
        # The launcher stops the step once Slurm flags the node (NVRx 0.4.1); from NVRx 0.6
        # the survivors stop by themselves first, and the cycle's end is the stop.
        stops = launch_helpers.kinds(state, "stop_cycle") or launch_helpers.kinds(
            state, "rendezvous" if native else "cycle_end")
        stop = min(e["ts"] for e in stops if e["ts"] > killed_at - 5)
        flagged = [e["ts"] for e in launch_helpers.kinds(state, "fault")
                   if e.get("type") == "node-flagged"]
        seen = (f"Slurm flags the node {flagged[0] - killed_at:.1f} s after the kill"
                if flagged else "the survivors stop before Slurm flags the node")
        ended = "NVRx's next round closed" if native else "the step ends"
        print(f"swap time (node kill to the first step after the swap): "
              f"{steps[0] - killed_at:.1f} s: {seen}, {ended} {stop - killed_at:.1f} s "
              f"after the kill, first step on the spare {steps[0] - stop:.1f} s after that")
    finally:
        lifecycle.node_start(sbx.root, victim)
        if not s.node(victim).available:
            s.resume(victim)
