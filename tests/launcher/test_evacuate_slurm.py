"""Issue 40 item 4 acceptance (evacuate before the fault), production timing, as the job user,
on ``prod6_sandbox`` (the hooks' node watcher on every node): a 4-node allocation with
``resilient-launch --spares 1`` runs a 3-node job of the memory-tier script
(``foreign/train_tiers.py``: ``checkpoint.save`` every step). At step 30 one training node's
simulated GPU 4 reports a corrected-ECC count that jumped (``sandbox fault NODE
ecc-corrected-rising``): a precursor, not a failure. The node watcher publishes it (a job runs
there: no drain); the launcher stops the step, swaps the spare in (cause: precursor) and gives
the node back to Slurm; the watcher, seeing no job there, drains it for repair. 0 requeues,
world size still 3, every rank resumes at the last step rank 0 reported before the stop (0 lost
steps), each survivor at its rank of before from its own node's memory, the spare at the
victim's rank from the peer's copy, and the run ends with the fault-free weights digest.
Prints the time from the injection to the first step on the spare."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import launch_helpers  # type: ignore[import-not-found]  # tests/launcher is on sys.path
import pytest

from resilient_slurm.events import read_events
from tests.checkpoint import tier_helpers
from tests.conftest import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.train]

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext")

FOREIGN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "foreign")
BIN = os.path.dirname(sys.executable)
STEPS, AT_STEP = 90, 30  # 18 s of steps after the injection: room for a loaded machine
START = re.compile(r"\[script\] rank=(\d+) start step=(\d+) tier=(.+?) t=([\d.]+) node=([\w.-]+)")
STEP = re.compile(r"\[script\] step=(\d+) .* t=([\d.]+)")


def _starts(log: str) -> list[tuple[int, int, str, float, str]]:
    return [(int(r), int(s), t, float(ts), n) for r, s, t, ts, n in START.findall(log)]


def _sandbox(root: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "resilient_slurm.cli", "sandbox", *args, "--dir", root],
                   check=True, capture_output=True, timeout=60)


def test_a_precursor_moves_the_job_to_the_spare_before_any_fault(prod6, tmp_path):
    sbx, s, user = prod6
    reference = tier_helpers.digest(tier_helpers.on_nodes(
        str(tmp_path), ["a", "b", "c"], ["--steps", str(STEPS), "--step-time", "0"]))
    work = Path(user.make_dir(mode=0o755))
    line = [os.path.join(BIN, "resilient-launch"), "--spares=1", "--nproc-per-node=1",
            "--max-restarts=3", "--heartbeat-timeout=30", "--initial-heartbeat-timeout=120",
            "--term-timeout=3", f"--verdict-path={sbx.p('verdicts', '{node}.json')}",
            f"--checkpoint-dir={work}/ck", os.path.join(FOREIGN, "train_tiers.py"),
            f"--steps={STEPS}", "--step-time=0.3", f"--save-dir={work}/ck",
            "--durable-every=1000"]  # no disk checkpoint in this run: memory tiers only
    batch = work / "job.sbatch"
    batch.write_text(f"#!/bin/bash\nexport RESILIENT_SANDBOX_TIER1_DIR={work}/shm/{{node}}\nexec "
                     + " ".join(line) + "\n")
    os.chown(batch, user.uid, user.gid)
    res = user.run(sbx, ["sbatch", "--parsable", "--nodes=4", "--no-kill", "--requeue",
                         "--open-mode=append", f"--output={work}/slurm-%j.out",
                         f"--chdir={work}", "--job-name=rl-evacuate", str(batch)],
                   capture_output=True, timeout=60,
                   env={"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    out = work / f"slurm-{jid}.out"
    state = str(work / "ck" / ".resilient")
    wait_until(lambda: out.exists() and len(_starts(out.read_text(errors="replace"))) >= 3,
               300)
    first = {r: n for r, _, _, _, n in _starts(out.read_text())}
    batch_host = s.job(jid).extra.get("batch_host")
    victim = next(n for _, n in sorted(first.items()) if n != batch_host)
    wait_until(lambda: any(int(st) >= AT_STEP for st, _ in STEP.findall(out.read_text())), 300)
    _sandbox(sbx.root, "fault", victim, "ecc-corrected-rising")
    injected = time.time()
    try:
        job = launch_helpers.wait_job(s, jid, 600)
        log = out.read_text(errors="replace")
        assert job.state == "COMPLETED", log[-5000:]
        assert not launch_helpers.kinds(state, "requeue")
        assert job.restart_count == 0  # not requeued by Slurm either
        evac = launch_helpers.kinds(state, "evacuate")
        assert [(e["node"], e["outcome"], e["codes"]) for e in evac] == [
            (victim, "stopping", ["ECC_CORRECTED_RATE"])], evac
        # (a second stop_cycle, signalled false, may say that Slurm refused the step signal
        # because the step was already ending: launcher/step.py)
        stops = [e for e in launch_helpers.kinds(state, "stop_cycle")
                 if e.get("signalled") is not False]
        assert [e["reason"] for e in stops] == [f"precursor: {victim} ECC_CORRECTED_RATE"]
        assert not [e for e in launch_helpers.kinds(state, "fault")
                    if e.get("type") != "signal"]  # no fault ever reached the job
        swaps = [e for e in launch_helpers.kinds(state, "spare") if e.get("node")]
        assert [(e["out"], e["reason"]) for e in swaps] == [
            (victim, ["precursor ECC_CORRECTED_RATE: evacuated before a fault"])], swaps
        spare = swaps[0]["node"]
        assert spare not in first.values() and spare == evac[0]["spares"][0]
        assert [(e["node"], e["mode"]) for e in launch_helpers.kinds(state, "exclude")] == [
            (victim, "spare")]
        last = launch_helpers.kinds(state, "cycle_start")[-1]["nodes"]
        assert len(last) == 3 and spare in last and victim not in last, last
        # 0 lost steps: every rank resumes at the last step rank 0 finished before it stopped
        stop_ts = stops[0]["ts"]
        print(f"evacuation: precursor injected to the step's stop {stop_ts - injected:.1f} s")
        done = [int(st) for st, t in STEP.findall(log) if float(t) <= stop_ts]
        assert max(done) < STEPS, "the training ended before the step was stopped"
        again = [x for x in _starts(log) if x[1] > 0]
        assert sorted(r for r, *_ in again) == [0, 1, 2], again  # world size still 3
        # a step may finish while the stop is on its way (0.3 s steps): every rank resumes at
        # the last step rank 0 printed before the new cycle, or at the one after it, whose
        # snapshot was taken when the stop came before its line was printed
        restarted = min(t for *_, t, _n in again)
        before = max(int(st) for st, t in STEP.findall(log) if float(t) < restarted)
        (resumed,) = {st for _, st, *_ in again}
        assert before <= resumed <= before + 1, (again, before)
        assert before >= max(done) >= AT_STEP
        # Node ranks pinned (launcher/cycle/rank_pin.py): every survivor keeps its ranks and
        # restores from its own node's memory; the spare takes the victim's, from its copy on
        # a peer.
        by_rank = {r: (tier, node) for r, _, tier, _, node in again}
        assert by_rank == {r: ("peer copy", spare) if n == victim else ("own memory", n)
                           for r, n in first.items()}, (first, again)
        assert tier_helpers.digest(log) == reference
        # the node ends drained for repair, by the hooks, once the job left it
        wait_until(lambda: s.node(victim).drain, 60)
        node = s.node(victim)
        assert node.reason.startswith("rhc:ECC_CORRECTED_RATE gpu4"), node.describe()
        node_log = [e for e in read_events(sbx.p("log", "events.jsonl"))
                    if e.get("node") == victim and e.get("ts", 0) >= injected - 1]
        actions = [e["action"] for e in node_log if e["kind"] == "precursor"]
        assert actions[0] == "published" and "drain" in actions, actions
        drains = [e for e in node_log if e["kind"] == "drain"]
        assert drains and drains[0]["ts"] > stop_ts, drains  # not while the job ran there
        firsts = [float(t) for st, t in STEP.findall(log) if float(t) > stop_ts]
        print(f"evacuation: precursor injected to the first step on the spare "
              f"{firsts[0] - injected:.1f} s; drained "
              f"{drains[0]['ts'] - injected:.1f} s after the injection")
    finally:
        _sandbox(sbx.root, "fault", victim, "clear")  # a repaired node: new boot id
        if not s.node(victim).available:
            s.resume(victim)
