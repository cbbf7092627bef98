"""The hooks on a real 4-node sandbox: Slurm runs them; hardware is simulated per node."""

from __future__ import annotations

import concurrent.futures
import os
import time
import uuid

import pytest

from resilient_slurm_lab.sandbox.lifecycle import HEALTH_INTERVAL

from ..conftest import wait_until
from .conftest import PREFIX, events, fault, restore, run_health_as_slurm, run_health_timed, submit

pytestmark = pytest.mark.slurm


def test_xid_drains_within_two_intervals_then_clear_resumes(sandbox, slurm) -> None:
    fault(sandbox, "node3", "xid79")
    start = time.monotonic()
    node = wait_until(lambda: (n := slurm.node("node3")).drain and n,
                      timeout=2 * HEALTH_INTERVAL + 5)
    assert time.monotonic() - start <= 2 * HEALTH_INTERVAL + 5
    assert node.reason.startswith(PREFIX) and "gpu3" in node.reason
    # The health program records its drain once Slurm has taken it: the event may follow the
    # state by a few ms (seen on Slurm 26.05).
    drains = wait_until(lambda: events(sandbox, kind="drain", node="node3", source="health"),
                        timeout=10)
    assert drains[-1]["reason"] == node.reason
    fault(sandbox, "node3", "clear")
    # `resume` shows idle* (NOT_RESPONDING) for a moment: wait for exactly idle.
    wait_until(lambda: (n := slurm.node("node3")).state == "IDLE" and not n.flags,
               timeout=4 * HEALTH_INTERVAL + 10)
    assert events(sandbox, kind="resume", node="node3")


def test_admin_drain_is_never_resumed(sandbox, slurm) -> None:
    # An earlier test's drain of node2 may still be resuming (slurmd's periodic runs): start
    # from a healthy, idle node2 and count only the resumes after the admin's drain.
    restore(sandbox, slurm, "node2")
    all_idle(slurm)
    since = time.time()
    slurm.drain("node2", "maintenance")
    try:
        for _ in range(10):
            assert run_health_as_slurm(sandbox, "node2").returncode == 0
        node = slurm.node("node2")
        assert node.drain and node.reason == "maintenance"
        assert not [e for e in events(sandbox, kind="resume", node="node2") if e["ts"] >= since]
    finally:
        slurm.resume("node2")
        all_idle(slurm)


def test_hung_dcgmi_ends_inside_watchdog_and_drains_as_unknown(sandbox, slurm) -> None:
    fault(sandbox, "node1", "dcgmi-hang")
    try:
        # slurmd's own periodic run may hold health.lock (the hung dcgmi keeps it ~20 s): ours
        # then skips; the helper runs again once that run is over.
        done, elapsed = run_health_timed(sandbox, "node1")
        assert done.returncode == 3, done.stderr
        assert elapsed < 30, f"health program took {elapsed:.1f}s"  # config budget 20 s
        node = wait_until(lambda: (n := slurm.node("node1")).drain and n, timeout=10)
        assert node.reason.startswith(PREFIX) and "DCGM" in node.reason.upper()
        verdict = [e for e in events(sandbox, kind="verdict", node="node1", source="health")
                   if e["status"] == "unknown"]
        assert verdict and "dcgm" in verdict[-1]["check"]
    finally:
        restore(sandbox, slurm, "node1")


def all_idle(slurm) -> None:
    """Wait until every node is exactly idle (a resumed node shows idle* for a moment)."""
    wait_until(lambda: all(n.state == "IDLE" and not n.flags for n in slurm.nodes()),
               timeout=30)


def test_prolog_failure_drains_and_job_completes_elsewhere(sandbox, slurm, tmp_path) -> None:
    """A 3-node job lands on node[1-3]; node2's prolog fails; the job reruns on 1,3,4."""
    for _attempt in range(3):
        all_idle(slurm)
        before = len(events(sandbox, source="prolog", node="node2", kind="drain"))
        fault(sandbox, "node2", "efa-port-down")
        try:
            jid = submit(slurm, sandbox, tmp_path, "srun hostname; echo done", "-N3", "--requeue")
            job = wait_until(lambda jid=jid: (j := slurm.job(jid)).state in ("COMPLETED",
                                                                             "FAILED") and j,
                             timeout=90)
            assert job.state == "COMPLETED"
            assert "node2" not in job.nodes
            # Drained by the prolog, or (when it won the race) by the health program.
            node = wait_until(lambda: (n := slurm.node("node2")).drain and n,
                              timeout=2 * HEALTH_INTERVAL + 5)
            assert node.reason.startswith(PREFIX) and "EFA" in node.reason
            by_prolog = len(events(sandbox, source="prolog", node="node2", kind="drain")) > before
        finally:
            restore(sandbox, slurm, "node2")
        if by_prolog:
            assert job.restart_count >= 1
            return
        # The periodic health program drained node2 before the job reached it: try again.
    pytest.fail("the health program won the race against the prolog three times")


def test_xid_during_job_drains_via_epilog_and_next_job_avoids_node(sandbox, slurm,
                                                                   tmp_path) -> None:
    marker = tmp_path / "started"
    jid = submit(slurm, sandbox, tmp_path, f"touch {marker}; sleep 4", "-N1", "-w", "node4")
    wait_until(marker.exists, timeout=30)
    fault(sandbox, "node4", "xid79")
    wait_until(lambda: slurm.job(jid).state in ("COMPLETED", "FAILED"), timeout=30)
    try:
        verdicts = [e for e in events(sandbox, source="epilog", node="node4", job=jid)
                    if e["kind"] == "verdict"]
        assert verdicts and verdicts[-1]["status"] == "fail"
        assert any(r["code"].startswith("XID") for r in verdicts[-1]["evidence"])
        node = wait_until(lambda: (n := slurm.node("node4")).drain and n, timeout=10)
        assert node.reason.startswith(PREFIX)
        nxt = submit(slurm, sandbox, tmp_path, "hostname", "-N1")
        done = wait_until(lambda: (j := slurm.job(nxt)).state == "COMPLETED" and j, timeout=60)
        assert "node4" not in done.nodes
    finally:
        restore(sandbox, slurm, "node4")


def test_200_health_runs_on_healthy_and_boot_noise_nodes_never_drain(sandbox, slurm) -> None:
    fault(sandbox, "node3", "boot-noise")
    fault(sandbox, "node4", "boot-noise")
    before = len(events(sandbox, kind="drain"))
    try:
        nodes = ["node1", "node2", "node3", "node4"] * 50
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(lambda n: run_health_as_slurm(sandbox, n).returncode, nodes))
        assert len(codes) == 200 and set(codes) == {0}
        assert len(events(sandbox, kind="drain")) == before
        assert not any(n.drain for n in slurm.nodes())
    finally:
        fault(sandbox, "node3", "clear")
        fault(sandbox, "node4", "clear")


def test_hostile_job_name_and_comment_are_inert(sandbox, slurm, tmp_path) -> None:
    """Slurm itself caps name and comment near 1 KB; the 10 KB rides in the job's environment."""
    pwned = f"/tmp/pwned-{uuid.uuid4().hex}"
    hostile = f"$(touch {pwned}) `touch {pwned}`; touch {pwned} && echo x"
    os.environ["RS_TEST_HOSTILE"] = hostile + "\n" + "A" * 10_240
    try:
        jid = submit(slurm, sandbox, tmp_path, "hostname", "-N1", "-J",
                     hostile + "\nline2" + "A" * 700, f"--comment={hostile}\n{'A' * 700}",
                     "--export=ALL")
    finally:
        del os.environ["RS_TEST_HOSTILE"]
    try:
        wait_until(lambda: slurm.job(jid).state in ("COMPLETED", "FAILED"), timeout=120)
    except AssertionError as exc:  # say why: pending on what, on which nodes
        raise AssertionError(f"{exc}: {slurm.job(jid)}; nodes {slurm.nodes()}") from None
    wait_until(lambda: len([e for e in events(sandbox, job=jid) if e["kind"] == "verdict"]) >= 2,
               timeout=20)
    assert not os.path.exists(pwned)
    mine = events(sandbox, job=jid)
    assert {e["source"] for e in mine} >= {"prolog", "epilog"}
    for e in mine:
        text = str(e)
        assert "pwned" not in text and "AAAA" not in text
        assert e["node"] in {"node1", "node2", "node3", "node4"}
