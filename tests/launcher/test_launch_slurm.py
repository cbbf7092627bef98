"""resilient-launch on a real 4-node sandbox: in-job restart, hang detection, elastic exclusion,
requeue with exclusion, no-progress verdict, time-limit signal. Each run trains the real
``sbatch/train_fsdp.py`` (FSDP2 on gloo, async checkpoints, NVRx heartbeats, targeted faults)
and must end with the same weights digest as a fault-free run of the same job, computed here by
one process over the same virtual shards (the sum of the shards' gradients does not depend on
the world size; see ``resilient_slurm.training.ordered_reduce``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from launch_helpers import (  # type: ignore[import-not-found]
    BIN,
    COMMON,
    FAULTS_TRAIN,
    HEARTBEAT_TIMEOUT,
    REQUEUED_ARGS,
    REQUEUED_SLEEP,
    TERMINAL,
    fault_free,
    handled,
    kinds,
    log_of,
    submit,
    wait_job,
    wait_step,
)
from prometheus_client.parser import text_string_to_metric_families

from resilient_slurm.launcher import supervisor as sup
from resilient_slurm.launcher.recovery import exits
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

pytest.importorskip("torch")

# Steps that stand for a detection's time (a fault must be found before the job ends): twice
# COMMON's 0.3 s, so half the steps give the same least duration at half their own cost on a
# loaded host (3 ranks on 2 cores add ~0.35 s to every step).
SLOW_STEPS = ["--step-sleep=0.6"]


def test_exception_and_hang_restart_in_job(slurm, clean, tmp_path):
    # --max-restarts 3: the two faults, and one restart of headroom for a fault the test did
    # not inject (handled(..., injected))
    jid, _, state = submit(slurm, clean, tmp_path, 2, ["--max-restarts=3"],
                           ["--fault=exception@3", "--fault=hang@7"])
    digest = fault_free(2, 10, tmp_path)
    job = wait_job(slurm, jid)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 0
    assert digest in log
    assert [e["verdict"] for e in kinds(state, "verdict")] == ["completed"]
    assert len(kinds(state, "cycle_start")) == 1  # both handled by ft_launcher, in-job
    faults = {e.get("type"): e for e in kinds(state, "fault")}
    assert set(faults) == {"exception", "hang"}
    resumes = [e for e in kinds(state, "resume") if e.get("source") == "training"]
    assert len(resumes) >= 3
    after_hang = [e for e in resumes if e["ts"] > faults["hang"]["ts"]]
    assert after_hang, "no resume after the hang"
    # Found by NVRx's rank monitor (its report, relayed by the node shim) within the heartbeat
    # timeout + 5 s of the last heartbeat, which is at or before the hang's fault event.
    found = [e for e in kinds(state, "hang_detected") if e["ts"] > faults["hang"]["ts"]]
    assert found, log
    detect = found[0]["ts"] - faults["hang"]["ts"]
    assert HEARTBEAT_TIMEOUT - 1 <= detect <= HEARTBEAT_TIMEOUT + 5, detect
    assert found[0]["waited_s"] == HEARTBEAT_TIMEOUT
    assert after_hang[0]["ts"] > found[0]["ts"]
    assert handled(state, frozenset({"exception", "hang"})) == [
        ("exception", "in-job restart (ft_launcher)"),
        ("hang", "in-job restart (ft_launcher, missing heartbeats)")]


def test_node_fault_elastic(slurm, clean, tmp_path):
    # Long enough for the HealthCheckProgram (every 10 s here) to see the bad GPU and drain:
    # the launcher learns of the fault from the hooks, not from the injector.
    # SLOW_STEPS: 40 steps of at least 0.6 s, as long as 80 of 0.3 s at half the steps' cost.
    jid, _, state = submit(slurm, clean, tmp_path, 3, ["--min-nodes=2"],
                           ["--fault=node@5@node3", *SLOW_STEPS], ("--nodelist=node[1-3]",),
                           steps=40)
    digest = fault_free(3, 40, tmp_path)  # 3 virtual shards, computed on 2 nodes after node3
    job = wait_job(slurm, jid)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 0
    blames = kinds(state, "blame")
    assert blames and "node3" in blames[0]["blamed"], blames
    excl = kinds(state, "exclude")
    assert [(e["node"], e["mode"]) for e in excl] == [("node3", "elastic")]
    cycles = kinds(state, "cycle_start")
    assert cycles[-1]["nodes"] == ["node1", "node2"]
    # node3 went back to Slurm (the allocation shrank) instead of idling in the job
    assert [(e["nodes"], e["done"]) for e in kinds(state, "release")] == [(["node3"], True)]
    assert job.nodes == ("node1", "node2")
    assert kinds(state, "verdict")[-1]["verdict"] == "completed"
    assert digest in log
    assert any("resharded save" in line for line in log.splitlines())
    out = subprocess.run([os.path.join(BIN, "resilient-slurm"), "report", state],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "node=node3" in out and "handled by: elastic relaunch without node3" in out


def test_node_fault_requeue(slurm, clean, tmp_path):
    # A required node list that names node3: the requeue must drop node3 from it, or the job
    # would pend forever (ReqNodeList and ExcNodeList in conflict).
    metrics, index = tmp_path / "textfile", tmp_path / "jobs.jsonl"
    metrics.mkdir()
    jid, _, state = submit(slurm, clean, tmp_path, 3, ["--min-nodes=3", "--max-requeues=2",
                                                       f"--metrics-dir={metrics}",
                                                       f"--job-index={index}"],
                           ["--fault=node@5@node3", *SLOW_STEPS], ("--nodelist=node[1-3]",),
                           steps=40, fast_after_requeue=True)
    digest = fault_free(3, 40, tmp_path)
    job = wait_job(slurm, jid, timeout=360)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 1
    assert "node3" in job.excluded
    assert "node3" not in job.nodes and "node3" not in job.required
    assert len(job.nodes) == 3
    shown = subprocess.run(["scontrol", "show", "job", str(jid)], capture_output=True,
                           text=True, timeout=30, check=True,
                           env={**os.environ, "SLURM_CONF": clean.conf}).stdout
    assert "ExcNodeList=node3" in shown and "Restarts=1" in shown, shown
    rq = kinds(state, "requeue")
    assert len(rq) == 1 and rq[0]["excluded"] == ["node3"]
    verdicts = [e["verdict"] for e in kinds(state, "verdict")]
    assert verdicts == ["completed"]
    assert digest in log
    assert handled(state) == [("node", "requeue excluding node3")]
    # the jobs index (one line per start) and the job's textfile for node_exporter
    starts = [json.loads(x) for x in index.read_text().splitlines()]
    assert [(x["job"], x["state_dir"]) for x in starts] == [(jid, state)] * 2
    lost = {}
    for fam in text_string_to_metric_families((metrics / f"resilient_job_{jid}.prom").read_text()):
        for x in fam.samples:
            if x.name == "resilient_job_node_lost_gpu_seconds":
                lost[(x.labels["node"], x.labels["cause"])] = x.value
    assert lost[("node3", "requeue_wait")] > 0 and lost[("node3", "recovery")] > 0, lost
    # the fleet ledger over the node log and the index names node3, with the job's own figure
    fleet = json.loads(subprocess.run(
        [os.path.join(BIN, "resilient-slurm"), "fleet", "--config", "/dev/null", "--events",
         clean.p("log", "events.jsonl"), "--jobs-index", str(index), "--json"],
        capture_output=True, text=True, timeout=120, check=True).stdout)
    assert fleet["worst_node"] == "node3", fleet["nodes"]
    own = json.loads(subprocess.run([os.path.join(BIN, "resilient-slurm"), "report", state,
                                     "--json"], capture_output=True, text=True, timeout=120,
                                    check=True).stdout)["badput"]
    job_node3 = sum(f["gpu_hours"] for f in own["faults"] if f["node"] == "node3")
    assert abs(fleet["nodes"]["node3"]["lost_gpu_hours"] - job_node3) <= 0.05 * job_node3


def test_deterministic_crash_verdict(slurm, clean, tmp_path):
    jid, _, state = submit(slurm, clean, tmp_path, 2,
                           ["--max-requeues=2", "--no-progress-limit=1", "--max-restarts=0"],
                           ["--fault=crash@5"])
    job = wait_job(slurm, jid, timeout=360)
    log = log_of(tmp_path, jid)
    assert job.state == "FAILED", log
    assert job.restart_count <= 2
    v = kinds(state, "verdict")
    assert v[-1]["verdict"] == "no-progress" and v[-1]["exit_code"] == exits.EXIT_NO_PROGRESS
    assert f"(exit {exits.EXIT_NO_PROGRESS})" in log
    assert any(e.get("type") == "cycle-failed" for e in kinds(state, "fault"))
    assert all(e.get("restart_count", 0) <= 2 for e in kinds(state, "launch_start"))
    rows = handled(state)
    assert ("crash", "requeue") in rows
    assert rows[-1][1] == f"verdict no-progress (exit {exits.EXIT_NO_PROGRESS})"


def scancel(sandbox, *args: str) -> None:
    subprocess.run(["scancel", *args], check=True, timeout=30, capture_output=True,
                   env={**os.environ, "SLURM_CONF": sandbox.conf})



def test_time_limit_signal_saves_requeues_and_resumes(slurm, clean, tmp_path):
    # No periodic checkpoint in the run: what resumes is what the stop saved.
    jid, _, state = submit(slurm, clean, tmp_path, 2, ["--max-requeues=1", "--term-timeout=30"],
                           ["--checkpoint-every=1000"], steps=40, fast_after_requeue=True)
    wait_step(state, 15)
    scancel(clean, "-b", "-s", "USR1", str(jid))  # what --signal=B:USR1@T delivers
    digest = fault_free(2, 40, tmp_path)  # after the signal: on a loaded host the reference
    #                                        run outlasted the job's 40 steps (both stages)
    job = wait_job(slurm, jid, timeout=300)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 1
    stopped = kinds(state, "stopped")
    assert stopped and len({e["step"] for e in stopped}) == 1, stopped
    saved = stopped[0]["step"]
    assert saved >= 15
    rq = kinds(state, "requeue")
    assert len(rq) == 1 and "SIGUSR1" in rq[0]["reason"]
    resumes = [e["step"] for e in kinds(state, "resume") if e.get("requeue") == "1"]
    assert resumes and set(resumes) == {saved}, (saved, resumes)  # exactly the saved step
    assert digest in log
    assert handled(state) == [("signal", "requeue")]


def test_step_usr1_without_b_saves_requeues_and_resumes(slurm, clean, tmp_path):
    """--signal=USR1@T without B: (here scancel -s USR1 without -b) reaches the step's tasks,
    not the batch shell: the node shim and ft_launcher survive it, the training saves at that
    step, the job is requeued and resumes from exactly that step."""
    jid, _, state = submit(slurm, clean, tmp_path, 2, ["--max-requeues=1", "--term-timeout=30"],
                           ["--checkpoint-every=1000"], steps=40, fast_after_requeue=True)
    wait_step(state, 15)
    scancel(clean, "-s", "USR1", str(jid))  # the job's steps, not its batch step
    digest = fault_free(2, 40, tmp_path)  # after the signal: on a loaded host the reference
    #                                        run outlasted the job's 40 steps (both stages)
    job = wait_job(slurm, jid, timeout=300)
    log = log_of(tmp_path, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 1
    stopped = kinds(state, "stopped")
    assert stopped and len({e["step"] for e in stopped}) == 1, stopped
    saved = stopped[0]["step"]
    assert saved >= 15
    rq = kinds(state, "requeue")
    assert len(rq) == 1 and "SIGUSR1" in rq[0]["reason"]
    resumes = [e["step"] for e in kinds(state, "resume") if e.get("requeue") == "1"]
    assert resumes and set(resumes) == {saved}, (saved, resumes)
    assert digest in log
    assert handled(state) == [("signal", "requeue")]
    assert kinds(state, "step_signal"), log


def test_scancel_saves_and_is_not_requeued(slurm, clean, tmp_path):
    jid, ckpt, state = submit(slurm, clean, tmp_path, 2, ["--max-requeues=2"],
                              ["--checkpoint-every=1000"], steps=200)
    wait_step(state, 10)
    scancel(clean, str(jid))
    job = wait_job(slurm, jid, timeout=120)
    assert job.state == "CANCELLED" and job.restart_count == 0
    # the launcher writes its verdict as it ends, which can come after Slurm says CANCELLED
    # (a loaded host once missed it after a fixed 2 s)
    wait_until(lambda: kinds(state, "verdict"), timeout=30)
    stopped = kinds(state, "stopped")
    assert stopped and stopped[0]["step"] >= 10, kinds(state, "verdict")
    from resilient_slurm.checkpoint.layout import latest_committed_step

    assert latest_committed_step(ckpt) == stopped[0]["step"]  # the stop's save committed
    assert not kinds(state, "requeue")
    v = kinds(state, "verdict")
    assert [(e["verdict"], e["exit_code"]) for e in v] == [("terminated", exits.EXIT_TERMINATED)]


def _slurmctld_pid(sandbox) -> int:
    """This sandbox's own slurmctld (never another helper's)."""
    from resilient_slurm_lab.sandbox.lifecycle import read_json_safe, recorded_pids

    for pid in recorded_pids(read_json_safe(sandbox) or {}):
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii") as fh:
                if fh.read().strip() == "slurmctld":
                    return pid
        except OSError:
            continue
    raise AssertionError("no slurmctld recorded for this sandbox")


def test_node_fault_then_requeue_with_the_controller_stalled(slurm, clean, tmp_path):
    """A node fault that nobody announces (the simulated GPU of a node turns bad under the
    training; only the HealthCheckProgram notices) forces a requeue, and the controller stalls
    right as the requeue starts, for longer than KillWait: the job must end requeued or with
    a verdict, never held."""
    from resilient_slurm_lab.hardware.simulate import install_scenario

    # No required node list: with one, an update the stalled controller never took would
    # leave the job pending on the drained node (visible, not held, but not what this tests).
    jid, _, state = submit(slurm, clean, tmp_path, 2, ["--min-nodes=2", "--max-requeues=1"],
                           SLOW_STEPS, steps=40, fast_after_requeue=True)
    wait_step(state, 5)
    bad = next(n for n in slurm.job(jid).nodes if n != slurm.job(jid).extra.get("batch_host"))
    install_scenario(clean.node_dir(bad), "xid79")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not kinds(state, "requeue"):
        time.sleep(0.05)
    assert kinds(state, "requeue"), log_of(tmp_path, jid)
    ctld = _slurmctld_pid(clean)
    os.kill(ctld, signal.SIGSTOP)
    try:
        time.sleep(15)  # KillWait is 5 s here: the launcher is gone before the controller wakes
    finally:
        os.kill(ctld, signal.SIGCONT)
    held = []
    end = time.monotonic() + 300
    job = slurm.job(jid)
    while time.monotonic() < end and job.state not in TERMINAL:
        job = slurm.job(jid)
        if job.held:
            held.append(job.state)
            if len(held) > 20:
                break
        time.sleep(1)
    log = log_of(tmp_path, jid)
    assert not held, (held, log)
    blames = kinds(state, "blame")
    assert blames and list(blames[0]["blamed"]) == [bad], blames
    assert not any(e.get("type") == "node" for e in kinds(state, "fault")), "an announcement"
    verdicts = [e["verdict"] for e in kinds(state, "verdict")]
    # The launcher had KillWait to requeue: it requeued, or said it could not confirm it.
    assert set(verdicts[:-1]) <= {"requeue-unconfirmed"}, verdicts
    if job.state == "COMPLETED":  # the requeue took effect (perhaps once the controller woke)
        assert job.restart_count == 1 and bad not in job.nodes
        assert verdicts[-1] == "completed"
        resumed = [e["step"] for e in kinds(state, "resume") if e.get("requeue") == "1"]
        saved = [e["step"] for e in kinds(state, "stopped")]
        assert saved and set(resumed) == {saved[0]}, (saved, resumed)
        assert fault_free(2, 40, tmp_path) in log
    else:  # the requeue never happened: the launcher said so
        assert job.state == "FAILED" and verdicts in (["budget-exhausted"],
                                                      ["requeue-unconfirmed"]), (job, log)


# -- production timing, jobs of the unprivileged user -------------------------------------------
# KillWait=30, cred_expire=120 (a requeued job waits two minutes), HealthCheckInterval=30, the
# kernel logs readable by root only, the job submitted and signalled by ``rsjob``.


def submit_as_user(prod, nodes: int, launch: list[str], train: list[str],
                   steps: int) -> tuple[int, str, str, str]:
    """The job user's job; its steps sleep REQUEUED_STEP_SLEEP s once Slurm requeued it."""
    sbx, _, user = prod
    work = user.make_dir(mode=0o755)
    ckpt = os.path.join(work, "ckpt")
    argv = [os.path.join(BIN, "resilient-launch"), "--nproc-per-node=1", "--max-restarts=2",
            f"--heartbeat-timeout={HEARTBEAT_TIMEOUT}", "--initial-heartbeat-timeout=120",
            "--term-timeout=20", f"--verdict-path={sbx.p('verdicts', '{node}.json')}",
            *launch, FAULTS_TRAIN, "--checkpoint-dir", ckpt, f"--steps={steps}",
            *COMMON, *train, REQUEUED_ARGS]
    script = os.path.join(work, "job.sbatch")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(f"#!/bin/bash\n{REQUEUED_SLEEP}\nexec " + " ".join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    out = os.path.join(work, "slurm-%j.out")
    res = user.run(sbx, ["sbatch", "--parsable", f"--nodes={nodes}", "--requeue",
                         "--open-mode=append", f"--output={out}", "--job-name=rl-prod", script],
                   capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    return jid, ckpt, os.path.join(ckpt, ".resilient"), work


def prod_log(work: str, jid: int) -> str:
    p = os.path.join(work, f"slurm-{jid}.out")
    return open(p, encoding="utf-8", errors="replace").read() if os.path.exists(p) else ""


def test_production_time_limit_as_user(prod, tmp_path):
    sbx, s, user = prod
    jid, _, state, work = submit_as_user(prod, 2, ["--max-requeues=1"],
                                         ["--checkpoint-every=1000"], steps=50)
    assert s.job(jid).extra.get("user_name") == user.name
    wait_step(state, 15, timeout=300)
    res = user.run(sbx, ["scancel", "-b", "-s", "USR1", str(jid)], capture_output=True,
                   timeout=60)
    assert res.returncode == 0, res.stderr
    digest = fault_free(2, 50, tmp_path)
    job = wait_job(s, jid, timeout=600)  # cred_expire=120 before the requeued job restarts
    log = prod_log(work, jid)
    assert job.state == "COMPLETED", log
    assert job.restart_count == 1
    stopped = kinds(state, "stopped")
    assert stopped and len({e["step"] for e in stopped}) == 1, stopped
    resumes = [e["step"] for e in kinds(state, "resume") if e.get("requeue") == "1"]
    assert resumes and set(resumes) == {stopped[0]["step"]}, (stopped, resumes)
    assert [e["verdict"] for e in kinds(state, "verdict")] == ["completed"]
    assert digest in log


def test_production_node_fault_requeue_controller_stalled_as_user(prod, tmp_path):
    """The acceptance run: 4 nodes, production timing, the job user's 3-node job, a real
    simulated node fault (node's GPU turns bad; nobody announces it, only the root
    HealthCheckProgram sees the root-only kernel log and drains), a requeue onto the spare node
    with the controller stalled for longer than KillWait. The job completes, only the faulty
    node is blamed, never held, and the final digest equals the fault-free run's."""
    from resilient_slurm_lab.hardware.simulate import install_scenario
    from resilient_slurm_lab.sandbox import lifecycle

    sbx, s, user = prod
    # 100 steps of at least 0.6 s before the requeue: longer than the slowest detection
    # (HealthCheckInterval 30 s) with the margin 200 steps of 0.3 s had, and half the steps'
    # own cost on a loaded host
    jid, _, state, work = submit_as_user(prod, 3, ["--min-nodes=3", "--max-requeues=1"],
                                         ["--step-sleep=0.6"], steps=100)
    wait_step(state, 5, timeout=300)
    job = s.job(jid)
    bad = next(n for n in job.nodes if n != job.extra.get("batch_host"))
    install_scenario(sbx.node_dir(bad), "xid79")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not kinds(state, "requeue"):
        time.sleep(0.05)
    assert kinds(state, "requeue"), prod_log(work, jid)
    lifecycle.controller_stall(sbx.root, 40)  # > KillWait (30): the launcher is gone first
    digest = fault_free(3, 100, tmp_path)  # while the requeued job waits out cred_expire
    held = []
    end = time.monotonic() + 600
    job = s.job(jid)
    while time.monotonic() < end and job.state not in TERMINAL:
        job = s.job(jid)
        if job.held:
            held.append(job.state)
            if len(held) > 20:
                break
        time.sleep(2)
    log = prod_log(work, jid)
    assert not held, (held, log)
    assert job.state == "COMPLETED", (job, log)
    assert job.restart_count == 1 and bad not in job.nodes
    blamed = [b for e in kinds(state, "blame") for b in (e.get("blamed") or {})]
    assert blamed == [bad], kinds(state, "blame")
    assert "rhc:" in str(kinds(state, "blame")[0]["blamed"][bad])
    assert not any(e.get("type") == "node" for e in kinds(state, "fault")), "an announcement"
    verdicts = [e["verdict"] for e in kinds(state, "verdict")]
    assert set(verdicts[:-1]) <= {"requeue-unconfirmed"} and verdicts[-1] == "completed"
    saved = [e["step"] for e in kinds(state, "stopped")]
    after = [e for e in kinds(state, "resume") if e.get("requeue") == "1"]
    assert saved and after and after[0]["step"] == saved[0], (saved, after)
    # The requeued run starts from the save. A later start in it is an in-job restart (a rank
    # that died or hung on a loaded host), never the launcher stopping a healthy step: each one
    # is explained by a worker-level event of the requeued run, and none rolls back.
    t_requeued = after[0]["ts"]
    restarts = [e for kind in ("worker_failed", "worker_restart", "hang_detected",
                               "worker_exception")
                for e in kinds(state, kind) if e["ts"] >= t_requeued]
    stops = [e for e in kinds(state, "stop_cycle") if e["ts"] >= t_requeued]
    assert not stops, (stops, log)
    assert len(after) == 1 or restarts, (after, log)
    assert all(e["step"] >= saved[0] for e in after), after
    assert digest in log


def test_excluded_node_comes_back_when_resumed_and_healthy(slurm, clean, tmp_path):
    """An excluded node that an admin resumed and whose published verdict is ok (newer than the
    exclusion) is readmitted at the next requeue; one still drained, or without a newer ok
    verdict, stays out."""
    from resilient_slurm.launcher.cycle import plan

    vdir = tmp_path / "verdicts"
    vdir.mkdir()
    cfg = sup.SupervisorSettings(checkpoint_dir=str(tmp_path / "ck"),
                                 state_dir=str(tmp_path / "st"), min_nodes=1,
                                 verdict_path=str(vdir / "{node}.json"))
    alloc = plan.Allocation(job_id=999, nodes=("node1",))
    s = sup.Supervisor(slurm, alloc, plan.LaunchOptions(script="t.py"),
                       plan.Features(frozenset()), cfg, {})
    t0 = time.time()
    for n in ("node2", "node3", "node4"):
        s.node_ledger.exclude(n, "rhc:XID79", now=t0)
    slurm.drain("node4", "admin: still broken")
    try:
        for n, when in (("node2", t0 + 5), ("node3", t0 - 5), ("node4", t0 + 5)):
            (vdir / f"{n}.json").write_text(json.dumps(
                {"format": 1, "node": n, "status": "ok", "codes": [], "time": when}))
        assert s._readmit() == ["node2"]
        assert sorted(s.node_ledger.excluded) == ["node3", "node4"]
        assert s.node_ledger.usable(["node2", "node3"]) == ["node2"]
    finally:
        slurm.resume("node4")
