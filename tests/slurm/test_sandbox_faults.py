"""The sandbox's unkind parts, on a real cluster: a job user, controller faults, RPC counts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from resilient_slurm.hooks.install import layout
from resilient_slurm_lab.sandbox import lifecycle
from resilient_slurm_lab.sandbox.cluster import TIMINGS, Paths
from resilient_slurm_lab.sandbox.rpc import STATS_RPC, parse_sdiag

from ..conftest import require_sandbox
from .sandbox_helpers import env_of, show_config, show_job

pytestmark = pytest.mark.slurm
CLI = [sys.executable, "-m", "resilient_slurm.cli"]


@pytest.fixture(scope="module")
def fault_sandbox() -> Iterator[Paths]:
    """A 2-node sandbox of its own, so stalling or stopping its controller harms no other test."""
    require_sandbox()
    root = tempfile.mkdtemp(prefix="rs-test-fault-")
    paths = lifecycle.up(root, nodes=2, hooks=False)
    try:
        yield paths
    finally:
        assert lifecycle.down(root) == []
        shutil.rmtree(root, ignore_errors=True)



def ping(paths: Paths) -> int:
    return subprocess.run(["scontrol", "ping"], env=env_of(paths), capture_output=True,
                          timeout=120).returncode




def wait_until(pred, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"condition not met within {timeout}s")


def submit_as_user(paths: Paths, job_user, *args: str) -> str:
    res = job_user.run(paths, ["sbatch", "--parsable", *args], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def running_and_pending(paths: Paths, job_user) -> tuple[str, str]:
    out = job_user.make_dir()
    running = submit_as_user(paths, job_user, "-N1", "-o", f"{out}/%j.out", "--wrap", "sleep 600")
    pending = submit_as_user(paths, job_user, "-N1", "--begin=now+3600", "-o", f"{out}/%j.out",
                             "--wrap", "true")
    wait_until(lambda: show_job(paths, running)["JobState"] == "RUNNING")
    return running, pending


# -- 1. jobs as an ordinary user ------------------------------------------------------------

def test_job_user_runs_batch_jobs_unprivileged(sandbox: Paths, job_user) -> None:
    user = lifecycle.job_user(sandbox.root)
    assert (user.name, user.uid) == (job_user.name, job_user.uid) and user.uid != 0
    for d in (user.work_dir, user.checkpoint_dir, user.state_dir):
        st = os.stat(d)
        assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o700), d
    out = job_user.make_dir()
    script = ("id -un; id -u; "
              f"echo step-1 > {user.checkpoint_dir}/ckpt-$SLURM_JOB_ID; "
              "cat /etc/shadow >/dev/null 2>&1 && echo shadow-readable || echo shadow-denied")
    job = submit_as_user(sandbox, job_user, "-N1", "-o", f"{out}/%j.out", "--wrap", script)
    wait_until(lambda: show_job(sandbox, job)["JobState"] in ("COMPLETED", "FAILED"))
    info = show_job(sandbox, job)
    assert info["JobState"] == "COMPLETED" and info["UserId"].startswith(f"{user.name}(")
    lines = open(f"{out}/{job}.out").read().split()
    assert lines == [user.name, str(user.uid), "shadow-denied"]
    ckpt = os.stat(f"{user.checkpoint_dir}/ckpt-{job}")
    assert ckpt.st_uid == user.uid


def test_make_dir_refuses_a_place_the_user_cannot_reach(job_user, tmp_path) -> None:
    from resilient_slurm_lab.sandbox.cluster import SandboxError

    os.chmod(tmp_path, 0o700)
    with pytest.raises(SandboxError, match="cannot reach"):
        job_user.make_dir(str(tmp_path / "ckpt"))


# -- 3. timing profiles ---------------------------------------------------------------------

def test_production_timing_is_what_slurmctld_runs_with(prod_sandbox: Paths) -> None:
    conf = show_config(prod_sandbox)
    t = lifecycle.sandbox_timing(prod_sandbox.root)
    assert t == TIMINGS["production"]
    assert conf["KillWait"] == "30 sec"
    assert conf["MessageTimeout"] == "10 sec"
    assert conf["HealthCheckInterval"] == "30 sec"
    assert conf["PrologEpilogTimeout"] == "120"
    assert "cred_expire=120" in conf["AuthInfo"]


def test_fast_timing_keeps_short_timeouts(sandbox: Paths) -> None:
    conf = show_config(sandbox)
    assert conf["KillWait"] == "5 sec" and "cred_expire=10" in conf["AuthInfo"]
    assert conf["HealthCheckInterval"] == f"{lifecycle.HEALTH_INTERVAL} sec"


def test_prolog_epilog_timeout_is_what_install_advises() -> None:
    advised = [ln for ln in layout("/").slurm_conf_lines() if ln.startswith("PrologEpilogTimeout")]
    for t in TIMINGS.values():
        assert advised == [f"PrologEpilogTimeout={t.prolog_epilog_timeout}"]


# -- 4. controller faults -------------------------------------------------------------------

def test_controller_stall_20_then_serves_with_jobs_intact(fault_sandbox: Paths, job_user) -> None:
    running, pending = running_and_pending(fault_sandbox, job_user)
    before = {j: show_job(fault_sandbox, j) for j in (running, pending)}
    start = time.monotonic()
    res = subprocess.run([*CLI, "sandbox", "controller", "stall", "20", "--background",
                          "--dir", fault_sandbox.root], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    # (seconds since the stall began when the ping finished, its exit status)
    pings: list[tuple[float, int]] = []
    while not pings or pings[-1][1] != 0:
        rc = ping(fault_sandbox)
        pings.append((time.monotonic() - start, rc))
        assert time.monotonic() - start < 60, pings
    assert pings[0][1] != 0, pings  # the controller does not answer...
    assert all(rc != 0 for t, rc in pings if t < 19), pings  # ...for the whole 20 s
    assert pings[-1][0] < 20 + 15, pings  # and answers soon after
    for job, old in before.items():
        now = show_job(fault_sandbox, job)
        assert (now["JobState"], now["UserId"]) == (old["JobState"], old["UserId"])
    assert show_job(fault_sandbox, running)["StartTime"] == before[running]["StartTime"]
    subprocess.run(["scancel", running, pending], env=env_of(fault_sandbox), check=True)


def test_stall_touches_only_this_sandbox_and_ends_when_the_caller_dies(
        fault_sandbox: Paths, sandbox: Paths) -> None:
    ctld = lifecycle.controller_pid(fault_sandbox.root)
    other = lifecycle.controller_pid(sandbox.root)
    assert ctld and other and ctld != other
    code = ("import os, signal; from resilient_slurm_lab.sandbox import lifecycle; "
            f"lifecycle.controller_stall({fault_sandbox.root!r}, 4, wait=False); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    died = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert died.returncode == -9
    stopped_at = time.monotonic()
    assert open(f"/proc/{ctld}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
    assert ping(sandbox) == 0  # another sandbox's controller answers meanwhile
    wait_until(lambda: ping(fault_sandbox) == 0, timeout=30)
    assert time.monotonic() - stopped_at >= 3


def test_stall_can_end_early(fault_sandbox: Paths) -> None:
    with lifecycle.controller_stall(fault_sandbox.root, 300, wait=False) as stall:
        assert stall.active()
    assert not stall.active()
    assert ping(fault_sandbox) == 0


def test_controller_stop_start_keeps_running_and_pending_jobs(
        fault_sandbox: Paths, job_user) -> None:
    running, pending = running_and_pending(fault_sandbox, job_user)
    before = show_job(fault_sandbox, running)
    res = subprocess.run([*CLI, "sandbox", "controller", "stop", "--dir", fault_sandbox.root],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    assert lifecycle.controller_pid(fault_sandbox.root) is None
    assert ping(fault_sandbox) != 0
    res = subprocess.run([*CLI, "sandbox", "controller", "start", "--dir", fault_sandbox.root],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    after = show_job(fault_sandbox, running)
    assert (after["JobState"], after["StartTime"]) == ("RUNNING", before["StartTime"])
    assert show_job(fault_sandbox, pending)["JobState"] == "PENDING"
    srun = job_user.run(fault_sandbox, ["srun", "-N1", "true"], capture_output=True, timeout=60)
    assert srun.returncode == 0, srun.stderr  # the restarted controller schedules new work
    subprocess.run(["scancel", running, pending], env=env_of(fault_sandbox), check=True)


# -- 5. RPC counts --------------------------------------------------------------------------

def test_rpc_window_counts_what_a_user_asked(fault_sandbox: Paths, job_user) -> None:
    with lifecycle.rpc_window(fault_sandbox.root) as w:
        for _ in range(3):
            job_user.run(fault_sandbox, ["squeue"], capture_output=True, timeout=30, check=True)
    assert w.delta is not None
    assert w.delta.by_type.get("REQUEST_JOB_INFO") == 3  # one per squeue...
    per_squeue = w.delta.by_user[job_user.name] / 3  # ...and the same few RPCs each time
    assert per_squeue == int(per_squeue) >= 1, w.delta
    assert STATS_RPC not in w.delta.by_type  # the measurement is not counted
    with lifecycle.rpc_window(fault_sandbox.root) as quiet:
        pass
    assert quiet.delta is not None and STATS_RPC not in quiet.delta.by_type


SDIAG = """\
Remote Procedure Call statistics by message type
\tREQUEST_NODE_INFO                       ( 2007) count:6      ave_time:298    total_time:1791
\tREQUEST_STATS_INFO                      ( 2035) count:1      ave_time:225    total_time:225

Remote Procedure Call statistics by user
\troot            (       0) count:5     ave_time:255    total_time:3839
\trsjob           (    1001) count:2     ave_time:255    total_time:3839

Pending RPC statistics
\tNo pending RPCs
"""


def test_parse_sdiag_and_subtract() -> None:
    before = parse_sdiag(SDIAG)
    assert before.by_type == {"REQUEST_NODE_INFO": 6, STATS_RPC: 1}
    assert before.by_user == {"root": 5, "rsjob": 2}
    after = parse_sdiag(SDIAG.replace("count:6 ", "count:9 ").replace("count:1 ", "count:2 ")
                        .replace("count:5 ", "count:9 "))
    delta = after.since(before)
    assert delta.by_type == {"REQUEST_NODE_INFO": 3} and delta.by_user == {"root": 3}
