"""Budgets and exclusions on the real sandbox, jobs of the unprivileged job user:

* ``--max-requeues`` counts the launcher's own requeues, not Slurm's (an admin's ``scontrol
  requeue`` here, as preemption or node failure would);
* an excluded node comes back: its verdict read on the node itself when the batch host cannot
  see that node's file (a private mount over the verdict directory, as on a real cluster where
  each node's verdicts are local), and by expiry when nothing re-confirms it;
* a requeue the partition cannot fit without the excluded nodes ends with a verdict instead of
  a job pending forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from launch_helpers import (  # type: ignore[import-not-found]
    BIN,
    COMMON,
    FAULTS_TRAIN,
    HEARTBEAT_TIMEOUT,
    kinds,
    wait_job,
)

from resilient_slurm.launcher.recovery import exclusions, exits

pytestmark = pytest.mark.slurm


def submit_as_user(sbx, user, nodes: int, launch: list[str], train: list[str],
                   steps: int, options: tuple[str, ...] = ()) -> tuple[int, str, str]:
    work = user.make_dir(mode=0o755)
    ckpt = os.path.join(work, "ckpt")
    argv = [os.path.join(BIN, "resilient-launch"), "--nproc-per-node=1",
            f"--heartbeat-timeout={HEARTBEAT_TIMEOUT}", "--initial-heartbeat-timeout=120",
            "--term-timeout=3", "--health-timeout=20",
            f"--verdict-path={sbx.p('verdicts', '{node}.json')}", *launch, FAULTS_TRAIN,
            "--checkpoint-dir", ckpt, f"--steps={steps}", *COMMON, *train]
    script = os.path.join(work, "job.sbatch")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write("#!/bin/bash\nexec " + " ".join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    res = user.run(sbx, ["sbatch", "--parsable", f"--nodes={nodes}", "--requeue",
                         "--open-mode=append", f"--output={work}/slurm-%j.out",
                         "--job-name=rl-excl", *options, script], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0]), os.path.join(ckpt, ".resilient"), work


def log_of(work: str, jid: int) -> str:
    p = os.path.join(work, f"slurm-{jid}.out")
    return open(p, encoding="utf-8", errors="replace").read() if os.path.exists(p) else ""


def _events(state: str) -> list[dict]:
    from resilient_slurm.events import read_events

    return list(read_events(os.path.join(state, "events.jsonl")))


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout}s: {what}")


def _training_in_run(state: str, restart: int, step: int) -> bool:
    """The run after ``restart`` requeues started a cycle and the training reported ``step``
    or more since."""
    evs = _events(state)
    starts = [i for i, e in enumerate(evs) if e["kind"] == "launch_start"
              and e.get("restart_count") == restart]
    if not starts:
        return False
    after = evs[starts[-1]:]
    return any(e["kind"] == "cycle_start" for e in after) and any(
        e["kind"] == "progress" and e.get("step", 0) >= step for e in after)


def _admin_requeue(sbx, jid: int) -> None:
    subprocess.run(["scontrol", "requeue", str(jid)], check=True, timeout=30,
                   capture_output=True, env={**os.environ, "SLURM_CONF": sbx.conf})


def test_slurms_requeues_spend_no_budget_the_launchers_do(slurm, clean, job_user):
    """Two requeues by an admin (what preemption or a node failure does) on a job allowed one:
    the launcher still trains after both; then a crash its requeue cannot fix spends the one
    requeue it may ask for, and the next need for one is the budget verdict (exit 4)."""
    pytest.importorskip("torch")
    jid, state, work = submit_as_user(
        clean, job_user, 2, ["--max-requeues=1", "--max-restarts=0", "--no-progress-limit=5"],
        ["--fault=crash@30"], steps=400)
    try:
        for restart in (0, 1):
            _wait(lambda r=restart: _training_in_run(state, r, 3), 240,
                  f"training in run {restart}: {log_of(work, jid)[-3000:]}")
            _admin_requeue(clean, jid)
        _wait(lambda: _training_in_run(state, 2, 3), 240,
              f"the launcher trains after 2 Slurm requeues > --max-requeues 1: "
              f"{log_of(work, jid)[-3000:]}")
        job = wait_job(slurm, jid, timeout=400)
    finally:
        slurm.cancel(jid)
    log = log_of(work, jid)
    assert job.extra.get("user_name") == job_user.name
    assert job.restart_count == 3, (job, log)  # 2 by the admin, 1 by the launcher
    own = kinds(state, "requeue")
    assert len(own) == 1 and own[0]["requeues"] == 1, own
    v = kinds(state, "verdict")
    assert v[-1]["verdict"] == "budget-exhausted" and v[-1]["exit_code"] == exits.EXIT_BUDGET
    assert "1/1 requeues by the launcher" in v[-1]["message"], v[-1]
    assert f"(exit {exits.EXIT_BUDGET})" in log


# The readmission, run as the job user in a private mount namespace where the verdict
# directory holds the batch host's own file only (what a node sees on a real cluster).
READMIT = """
import json, os, sys
from resilient_slurm.launcher import supervisor as sup
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.slurm import connect
conf, job, state, pattern, ttl, excluded, nodes = sys.argv[1:8]
cfg = sup.SupervisorSettings(checkpoint_dir=None, state_dir=state, min_nodes=1,
                             verdict_path=pattern)
cfg.exclusion_ttl = float(ttl)
alloc = plan.Allocation(job_id=int(job), nodes=tuple(json.loads(nodes)))
s = sup.Supervisor(connect(conf=conf, backend="cli", timeout=10), alloc,
                   plan.LaunchOptions(script="t.py"), plan.Features(frozenset()), cfg,
                   dict(os.environ))
for node, at in json.loads(excluded).items():
    s.node_ledger.exclude(node, "rhc:XID79 gpu0", now=at)
seen = sorted(os.listdir(os.path.dirname(pattern)))
print(json.dumps({"back": s._readmit(), "excluded": sorted(s.node_ledger.excluded),
                  "seen": seen}))
"""

PRIVATE_VIEW = ('mount -t tmpfs -o mode=0755 tmpfs "$1" && cp "$2" "$1"/ && shift 2 && '
                'exec setpriv --reuid="$RS_UID" --regid="$RS_GID" --init-groups -- "$@"')


def _verdict(path: str, node: str, status: str, when: float) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"format": 1, "node": node, "status": status, "codes": [], "time": when}, fh)


def test_excluded_node_readmitted_from_its_own_verdict_and_by_expiry(slurm, clean, job_user):
    """node2 (in the allocation, not the batch host) was excluded and is healthy since: its
    verdict file is not visible on the batch host, so it is read on node2. node3 (outside the
    allocation, no verdict readable) was excluded longer than --exclusion-ttl ago and nothing
    re-confirms it: it expires. node4, as old but drained by an admin, stays (renewed)."""
    from resilient_slurm_lab.sandbox import jobuser

    work = job_user.make_dir(mode=0o755)
    vdir = os.path.join(work, "verdicts")
    own = os.path.join(work, "own")
    for d in (vdir, own):
        job_user.make_dir(d, mode=0o755)
    t0 = time.time()
    _verdict(os.path.join(own, "node1.json"), "node1", "ok", t0)
    for node in ("node1", "node2", "node3", "node4"):
        _verdict(os.path.join(vdir, f"{node}.json"), node, "ok", t0 + 5)
    sub = job_user.run(clean, ["sbatch", "--parsable", "-N2", "--nodelist=node[1-2]",
                               "--output=/dev/null", "--wrap", "sleep 300"], cwd=work,
                       capture_output=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    jid = int(sub.stdout.strip().split(";")[0])
    slurm.drain("node4", "admin: still broken")
    try:
        _wait(lambda: slurm.job(jid).state == "RUNNING", 60, "the holding job runs")
        paths = jobuser.Paths(clean.root)
        env = {**jobuser.user_env(paths, jobuser.job_user(clean.root)),
               "RS_UID": str(job_user.uid), "RS_GID": str(job_user.gid)}
        state = job_user.make_dir(os.path.join(work, "state"))
        old = t0 - 7200
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                PRIVATE_VIEW, "sh", vdir, os.path.join(own, "node1.json"),
                sys.executable, "-c", READMIT, clean.conf, str(jid), state,
                os.path.join(vdir, "{node}.json"), "3600",
                json.dumps({"node2": t0, "node3": old, "node4": old}),
                json.dumps(["node1", "node2"])]
        out = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True,
                             timeout=120)
    finally:
        slurm.cancel(jid)
        slurm.resume("node4")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["seen"] == ["node1.json"], res  # the batch host's own file only
    assert res == {"back": ["node2", "node3"], "excluded": ["node4"], "seen": ["node1.json"]}
    (review,) = kinds(state, "exclusion_review")
    assert "verdict ok" in review["readmitted"]["node2"]
    assert "expired" in review["readmitted"]["node3"]
    assert list(review["renewed"]) == ["node4"] and "DRAIN" in review["renewed"]["node4"]


def test_fit_reads_the_partition_and_the_reservation(slurm, clean, job_user):
    """The one query before a requeue: the partition's nodes outside the exclusions (ours and
    the user's), within the job's reservation when it has one."""
    env = {**os.environ, "SLURM_CONF": clean.conf}
    resv = "rs-fit-test"
    subprocess.run(["scontrol", "create", "reservation", f"ReservationName={resv}",
                    "Nodes=node[1-2]", "StartTime=now", "Duration=10", f"Users={job_user.name}",
                    "Flags=IGNORE_JOBS"], check=True, timeout=30, capture_output=True, env=env)
    work = job_user.make_dir(mode=0o755)
    sub = job_user.run(clean, ["sbatch", "--parsable", "-N1", f"--reservation={resv}",
                               "--exclude=node1", "--output=/dev/null", "--wrap", "sleep 120"],
                       cwd=work, capture_output=True, timeout=60)
    plain = job_user.run(clean, ["sbatch", "--parsable", "-N1", "--exclude=node4",
                                 "--output=/dev/null", "--wrap", "sleep 120"], cwd=work,
                         capture_output=True, timeout=60)
    try:
        assert sub.returncode == 0 and plain.returncode == 0, (sub.stderr, plain.stderr)
        in_resv = int(sub.stdout.strip().split(";")[0])
        other = int(plain.stdout.strip().split(";")[0])
        f = exclusions.fit(slurm, other, ["node3"], 2)
        assert f.ok is True and f.candidates == ("node1", "node2"), f  # node4: the user's
        assert f.where == "partition debug" and f.available == 2
        assert exclusions.fit(slurm, other, ["node3", "node2"], 2).ok is False
        assert exclusions.fit(slurm, other, ["node3"], 2, user_excluded=[]).candidates == (
            "node1", "node2", "node4")
        f = exclusions.fit(slurm, in_resv, [], 1)
        assert f.ok is True and f.candidates == ("node2",), f  # node1: the user's --exclude
        assert "reservation " + resv in f.where
        assert exclusions.fit(slurm, in_resv, ["node2"], 1).ok is False
        assert exclusions.fit(slurm, 999999, [], 1).ok is None  # cannot tell: says so
    finally:
        for j in (sub, plain):
            if j.returncode == 0:
                slurm.cancel(int(j.stdout.strip().split(";")[0]))
        subprocess.run(["scontrol", "delete", f"ReservationName={resv}"], timeout=30,
                       capture_output=True, env=env, check=False)


@pytest.fixture()
def prod_clean(prod_sandbox):
    """(production-timing sandbox, root's Slurm handle), every node healthy and idle."""
    from resilient_slurm.slurm import connect
    from resilient_slurm_lab.hardware.simulate import install_scenario

    s = connect(conf=prod_sandbox.conf, backend="cli", timeout=20)
    for n in s.nodes():
        install_scenario(prod_sandbox.node_dir(n.name), "clear")
        if n.drain or not n.available:
            s.resume(n.name)
    _wait(lambda: all(n.state == "IDLE" and not n.flags for n in s.nodes()), 60, "idle nodes")
    return prod_sandbox, s


def test_requeue_the_partition_cannot_fit_is_a_verdict(prod_clean, job_user):
    """Production timing: a 4-node job on the 4-node partition loses a node (its GPU turns
    bad; only the root HealthCheckProgram sees it and drains) and needs all 4 (--min-nodes 4):
    a requeue excluding it could never start. The launcher ends with the cannot-fit verdict
    (exit 6) instead of a job pending forever."""
    pytest.importorskip("torch")
    from resilient_slurm_lab.hardware.simulate import install_scenario

    sbx, slurm = prod_clean
    jid, state, work = submit_as_user(sbx, job_user, 4, ["--min-nodes=4", "--max-requeues=2",
                                                          "--max-restarts=2"], [], steps=1000)
    bad = "node3"
    try:
        _wait(lambda: _training_in_run(state, 0, 3), 300, f"training: {log_of(work, jid)[-3000:]}")
        install_scenario(sbx.node_dir(bad), "xid79")
        job = wait_job(slurm, jid, timeout=400)
    finally:
        slurm.cancel(jid)
        install_scenario(sbx.node_dir(bad), "clear")
    log = log_of(work, jid)
    assert job.state == "FAILED" and job.exit_code == exits.EXIT_CANNOT_FIT, (job, log)
    assert job.restart_count == 0
    v = kinds(state, "verdict")
    assert [e["verdict"] for e in v] == ["cannot-fit"], v
    assert "partition debug has only 3" in v[0]["message"] and bad in v[0]["message"]
    assert v[0]["fit"]["candidates"] == 3 and v[0]["excluded"] == [bad], v
    assert not kinds(state, "requeue")
    assert f"(exit {exits.EXIT_CANNOT_FIT})" in log
