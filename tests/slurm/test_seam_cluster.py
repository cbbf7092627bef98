"""The Slurm seam against a real 4-node sandbox (no fakes)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

import pytest

from resilient_slurm.slurm import SlurmError, connect
from resilient_slurm_lab.sandbox import lifecycle
from resilient_slurm_lab.sandbox.cluster import read_meta

from ..conftest import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(params=["cli", "pyslurm"])
def slurm(request, sandbox):
    """The seam, once per backend; pyslurm's run only where a matching pyslurm imports."""
    from resilient_slurm.slurm import pyslurm_usable

    if request.param == "pyslurm":
        usable, why = pyslurm_usable(conf=sandbox.conf)
        if not usable:
            pytest.skip(f"pyslurm backend unavailable here: {why}")
    return connect(conf=sandbox.conf, backend=request.param, timeout=10)


def sinfo_reason(conf: str, node: str) -> tuple[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"], capture_output=True,
                         text=True, env={**os.environ, "SLURM_CONF": conf}, check=True).stdout
    state, reason = out.strip().split("|", 1)
    return state, reason


def test_drain_and_resume(clean, sandbox, slurm) -> None:
    reason = "test:XID79 gpu3"
    slurm.drain("node3", reason)
    state, shown = sinfo_reason(sandbox.conf, "node3")
    assert state == "drained" and shown == reason
    node = slurm.node("node3")
    assert node.drain and node.reason == reason and not node.available
    assert node.addr == "127.0.0.1"  # NodeAddr from the sandbox's slurm.conf
    slurm.resume("node3")
    wait_until(lambda: slurm.node("node3").state == "IDLE" and not slurm.node("node3").flags)
    assert sinfo_reason(sandbox.conf, "node3")[0] == "idle"


def test_nodes_brief_gives_every_node_and_when_its_reason_was_set(sandbox, slurm) -> None:
    """The fleet guard's census: one sinfo call, every node once, the reason's timestamp."""
    slurm.drain("node3", "test:STORAGE_HANG mnt")
    try:
        nodes = {n.name: n for n in slurm.nodes_brief()}
        assert set(nodes) == {"node1", "node2", "node3", "node4"}
        n3 = nodes["node3"]
        assert n3.drain and n3.reason == "test:STORAGE_HANG mnt"
        assert n3.reason_time is not None and abs(time.time() - n3.reason_time) < 120
        assert not nodes["node1"].drain and nodes["node1"].reason_time is None
    finally:
        slurm.resume("node3")
        wait_until(lambda: slurm.node("node3").state == "IDLE" and not slurm.node("node3").flags)


def test_nodes_in_is_one_query_for_the_node_list(clean, sandbox, slurm) -> None:
    """A job's view of its own nodes: one sinfo for any number of them (two RPCs), unknown
    names absent, the drain and the address as ``node()`` gives them."""
    slurm.drain("node2", "test:GPU_LOST gpu1")
    try:
        with lifecycle.rpc_window(sandbox.root) as w:
            got = slurm.nodes_in(["node1", "node2", "node3", "node4"])
        assert w.delta is not None and w.delta.total <= 2, w.delta.by_type
        assert set(got) == {"node1", "node2", "node3", "node4"}
        assert got["node2"].drain and got["node2"].reason == "test:GPU_LOST gpu1"
        assert got["node1"].available and got["node1"].addr == "127.0.0.1"
        assert slurm.nodes_in([]) == {}
    finally:
        slurm.resume("node2")
        wait_until(lambda: slurm.node("node2").state == "IDLE" and not slurm.node("node2").flags)


def test_reason_is_sanitised(slurm) -> None:
    slurm.drain("node4", "bad\nreason; $(touch /tmp/x) " + "y" * 500)
    try:
        reason = slurm.node("node4").reason
        assert "\n" not in reason and "$(" not in reason and len(reason) <= 64
    finally:
        slurm.resume("node4")
        wait_until(lambda: slurm.node("node4").state == "IDLE")


def test_reboot_asap_marks_busy_node_then_cancel(clean, sandbox, slurm, tmp_path) -> None:
    """On a busy node, reboot ASAP drains it and waits; cancel_reboot + resume undo it."""
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/sh\nsleep 300\n")
    jid = slurm.submit(str(script), ["-N1", "-w", "node2", "--output=/dev/null"], env=env)
    try:
        wait_until(lambda: slurm.job(jid).state == "RUNNING")
        slurm.reboot_asap("node2", "test:XID79 gpu0")
        node = slurm.node("node2")
        assert "REBOOT_REQUESTED" in node.flags and node.drain
        assert node.reason.startswith("test:XID79 gpu0")
    finally:
        slurm.cancel_reboot("node2")
        slurm.cancel(jid)
        slurm.resume("node2")
    wait_until(lambda: slurm.node("node2").state == "IDLE" and not slurm.node("node2").flags)


def test_requeue_with_excluded_node(sandbox, slurm, tmp_path) -> None:
    record = tmp_path / "runs.txt"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$SLURM_RESTART_COUNT $SLURM_JOB_NODELIST" >> {record}\n'
        "sleep 300\n"
    )
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    jid = slurm.submit(str(script), ["-N2", "--requeue", f"--output={tmp_path}/out-%j.txt",
                                     "--open-mode=append"], env=env)
    try:
        job = wait_until(lambda: (j := slurm.job(jid)).state == "RUNNING" and record.exists() and j)
        assert job.requeue and len(job.nodes) == 2 and job.restart_count == 0
        excluded = job.nodes[1]
        slurm.requeue(jid, hold=True)
        wait_until(lambda: slurm.job(jid).state == "PENDING" and slurm.job(jid).held)
        slurm.set_excluded(jid, [excluded])
        slurm.release(jid)
        job = wait_until(lambda: (j := slurm.job(jid)).state == "RUNNING"
                         and len(record.read_text().splitlines()) == 2 and j, timeout=60)
        assert job.excluded == (excluded,)
        assert job.restart_count == 1
        assert excluded not in job.nodes and len(job.nodes) == 2
        count, nodelist = record.read_text().splitlines()[1].split()
        assert count == "1"
        from resilient_slurm.slurm import expand
        assert excluded not in expand(nodelist)
        plain = slurm.requeue  # plain requeue also works on a running job
        plain(jid)
        wait_until(lambda: slurm.job(jid).restart_count == 2, timeout=30)
    finally:
        slurm.cancel(jid)


def test_shrink_running_job_then_requeue_with_a_satisfiable_request(sandbox, slurm, clean,
                                                                     tmp_path) -> None:
    """A running job gives a node back; requeued with that node excluded, its required node
    list and original size are rewritten so it can start again (on the spare node)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    jid = slurm.submit(str(script), ["-N3", "--nodelist=node[1-3]", "--requeue",
                                     f"--output={tmp_path}/out-%j.txt"], env=env)
    try:
        job = wait_until(lambda: (j := slurm.job(jid)).state == "RUNNING" and j)
        assert job.required == ("node1", "node2", "node3")
        batch = job.extra.get("batch_host") or job.nodes[0]
        drop = next(n for n in reversed(job.nodes) if n != batch)
        keep = [n for n in job.nodes if n != drop]
        with pytest.raises(SlurmError):
            slurm.shrink(jid, [n for n in job.nodes if n != batch])  # never the batch host
        slurm.shrink(jid, keep)
        assert slurm.job(jid).nodes == tuple(keep)
        wait_until(lambda: slurm.node(drop).state == "IDLE")  # back to Slurm at once
        slurm.requeue(jid, hold=True)
        wait_until(lambda: slurm.job(jid).state == "PENDING" and slurm.job(jid).held)
        slurm.set_excluded(jid, [drop])
        slurm.set_request(jid, required=[n for n in job.required if n != drop], num_nodes=3)
        slurm.release(jid)
        job = wait_until(lambda: (j := slurm.job(jid)).state == "RUNNING" and j, timeout=60)
        assert len(job.nodes) == 3 and drop not in job.nodes and "node4" in job.nodes
        assert drop not in job.required and job.excluded == (drop,)
        with pytest.raises(SlurmError, match=">= 1"):
            slurm.set_request(jid, num_nodes=0)
    finally:
        slurm.cancel(jid)


def test_unknown_node_and_job_raise(slurm) -> None:
    with pytest.raises(SlurmError, match="node9"):
        slurm.node("node9")
    with pytest.raises(SlurmError, match="Invalid node name"):
        slurm.drain("node9", "x")
    with pytest.raises(SlurmError, match="999999"):
        slurm.job(999999)
    with pytest.raises(SlurmError):
        slurm.requeue(999999)
    with pytest.raises(SlurmError, match="invalid job id"):
        slurm.job("1; rm -rf /")


def test_controller_down_raises_within_timeout() -> None:
    """A second sandbox runs beside the session one; its controller is stopped."""
    root = tempfile.mkdtemp(prefix="rs-test-down-")
    paths = lifecycle.up(root, nodes=1)
    try:
        meta = read_meta(paths)
        ctld = meta["pids"][1]  # munged, slurmctld, slurmd...
        os.kill(ctld, 9)
        s = connect(conf=paths.conf, backend="cli", timeout=3)
        start = time.monotonic()
        with pytest.raises(SlurmError) as err:
            s.nodes()
        assert time.monotonic() - start < 3 + 5  # the 3 s timeout, not scontrol's own minutes
        assert "slurm" in str(err.value).lower() or "no answer" in str(err.value)
    finally:
        assert lifecycle.down(root) == []


def test_job_reads_one_job_not_the_whole_queue(sandbox, slurm, tmp_path) -> None:
    """``job(ID)`` asks the controller about that job only (the launcher polls it around a
    requeue; a full job-table dump per poll costs a busy controller dearly)."""
    from resilient_slurm_lab.sandbox import rpc

    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/sh\nsleep 60\n")
    jid = slurm.submit(str(script), ["-N1", "--output=/dev/null"], env=env)
    try:
        wait_until(lambda: slurm.job(jid).state == "RUNNING")
        before = rpc.counts(sandbox.root)
        for _ in range(5):
            assert slurm.job(jid).job_id == jid
        got = rpc.counts(sandbox.root).since(before).by_type
        assert got.get("REQUEST_JOB_INFO", 0) == 0, got  # the whole job table
        assert got.get("REQUEST_JOB_INFO_SINGLE", 0) >= 5, got
    finally:
        slurm.cancel(jid)
