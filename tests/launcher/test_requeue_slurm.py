"""The launcher's requeue sequence (``requeue_excluding``) on the real sandbox.

The promises that matter, against real Slurm: the user's own ``--exclude`` survives (merged,
never replaced); from inside the job's own batch script (the launcher's case: Slurm's SIGTERM
reaches the batch script and the ``scontrol`` call right after the requeue took effect) the job
ends requeued with the exclusion, or, with nothing to exclude, unchanged; a refused requeue is
an error and leaves the job as it was; a refused update after the requeue is a warning and the
job still ends requeued. Never held, whatever fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.slurm

# Runs as the job user: the launcher's own call, through the seam's CLI backend.
REQUEUE_AS_USER = """
import json, sys
from resilient_slurm.launcher.recovery import requeue
from resilient_slurm.slurm import connect
slurm = connect(conf=sys.argv[1], backend="cli", timeout=10)
res = requeue.requeue_excluding(slurm, int(sys.argv[2]), [sys.argv[3]], budget_s=15)
print(json.dumps({"requeued": res.requeued, "error": res.error}))
"""


def _wait_running(slurm, job_id: int, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = slurm.job(job_id)
        if job.state == "RUNNING" and job.nodes:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never ran: {slurm.job(job_id)}")


def test_requeue_as_user_merges_users_exclude_and_never_holds(sandbox, slurm, job_user
                                                              ) -> None:
    work = job_user.make_dir()
    sub = job_user.run(sandbox, ["sbatch", "--parsable", "-N1", "--exclude=node4", "--requeue",
                                 "--output=/dev/null", "--wrap", "sleep 600"], cwd=work,
                       capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = int(sub.stdout.strip().split(";")[0])
    try:
        ran_on = _wait_running(slurm, job_id).nodes[0]
        assert ran_on != "node4"
        out = job_user.run(sandbox, [sys.executable, "-c", REQUEUE_AS_USER, sandbox.conf,
                                     str(job_id), ran_on], cwd=work, capture_output=True,
                           text=True, timeout=90)
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res == {"requeued": True, "error": ""}, res
        job = slurm.job(job_id)
        assert {ran_on, "node4"} <= set(job.excluded), job
        assert not job.held, job
        assert job.restart_count == 1 and job.state in ("PENDING", "REQUEUED", "COMPLETING"), job
    finally:
        slurm.cancel(job_id)


# The launcher's requeue from inside its batch script (root's job here): as ``requeue.take``,
# SIGTERM ignored, the sequence within ``budget_for(KillWait)``; the requeued run does nothing.
REQUEUE_IN_JOB = """
import json, os, signal, sys
from resilient_slurm.launcher.recovery import requeue
from resilient_slurm.slurm import connect
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    out, exclude = sys.argv[1], sys.argv[2:]
    exclude = [os.environ["SLURMD_NODENAME"] if n == "OWN" else n for n in exclude]
    slurm = connect(backend="cli", timeout=10)
    budget = requeue.budget_for(slurm.kill_wait())
    res = requeue.requeue_excluding(slurm, int(os.environ["SLURM_JOB_ID"]), exclude,
                                    budget_s=budget)
    with open(out + ".tmp", "w") as fh:
        json.dump({"requeued": res.requeued, "error": res.error, "excluded": exclude}, fh)
    os.replace(out + ".tmp", out)
"""


def _submit_root(slurm, sandbox, tmp_path, name: str, script_args: list[str],
                 options: tuple[str, ...] = ("--requeue",)) -> tuple[int, str]:
    (tmp_path / "requeue_in_job.py").write_text(REQUEUE_IN_JOB)
    out = str(tmp_path / f"{name}.json")
    script = tmp_path / f"{name}.sbatch"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} {tmp_path / 'requeue_in_job.py'} "
                      f"{out} {' '.join(script_args)}\n")
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    jid = slurm.submit(str(script), ["-N1", f"--output={tmp_path}/{name}-%j.out", *options],
                       env=env)
    return jid, out


def _submit_sleep(slurm, sandbox, tmp_path, requeue_opt: str, *more: str) -> int:
    script = tmp_path / "sleep.sbatch"
    script.write_text("#!/bin/bash\nexec sleep 600\n")
    return slurm.submit(str(script), ["-N1", requeue_opt, "--output=/dev/null", *more],
                        env={**os.environ, "SLURM_CONF": sandbox.conf})


def _wait_file(path: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as fh:
                return json.load(fh)
        time.sleep(0.3)
    raise AssertionError(f"{path} never written")


@pytest.mark.parametrize("exclude", [["OWN"], []], ids=["own-node", "nothing"])
def test_requeue_from_inside_the_job_never_holds(clean, sandbox, slurm, tmp_path,
                                                 exclude) -> None:
    jid, out = _submit_root(slurm, sandbox, tmp_path, "inside", exclude)
    try:
        res = _wait_file(out)
        assert res["requeued"] and res["error"] == "", (res, list(tmp_path.iterdir()))
        job = slurm.job(jid)
        assert not job.held and job.restart_count == 1, job
        assert set(job.excluded) == set(res["excluded"]), job
    finally:
        slurm.cancel(jid)


def test_a_refused_requeue_is_an_error_and_the_job_runs_on(clean, sandbox, slurm,
                                                           tmp_path) -> None:
    from resilient_slurm.launcher.recovery import requeue

    jid = _submit_sleep(slurm, sandbox, tmp_path, "--no-requeue")
    try:
        _wait_running(slurm, jid)
        res = requeue.requeue_excluding(slurm, jid, ["node3"], budget_s=3.0)
        assert not res.requeued and res.error.startswith("requeue: "), res
        job = slurm.job(jid)
        assert job.state == "RUNNING" and not job.held and job.restart_count == 0, job
    finally:
        slurm.cancel(jid)


def test_time_limit_requeue_comes_first_and_a_refused_update_never_holds(clean, sandbox, slurm,
                                                                        tmp_path) -> None:
    """The launcher's time-limit requeue (after SIGUSR1) with the job's events file on a
    stalled filesystem (a FIFO nobody reads: every write blocks, as on a hung server): the job
    is requeued while the launcher is still blocked on that file, so the requeue came before
    any write to it; the end time comes from the job record; the update it cannot apply (an
    unknown node to exclude) is a warning and the job still ends requeued, never held."""
    from resilient_slurm.events import read_events
    from resilient_slurm.launcher import supervisor as sup
    from resilient_slurm.launcher.cycle import plan
    from resilient_slurm.launcher.recovery import timelimit
    from resilient_slurm.launcher.recovery.exits import EXIT_REQUEUED
    from resilient_slurm.launcher.recovery.policy import Signal

    jid = _submit_sleep(slurm, sandbox, tmp_path, "--requeue", "--time=10")
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        job = _wait_running(slurm, jid)
        cfg = sup.SupervisorSettings(checkpoint_dir=str(tmp_path / "ck"),
                                     state_dir=str(tmp_path / "st"), min_nodes=1)
        s = sup.Supervisor(slurm, plan.Allocation(job_id=jid, nodes=job.nodes),
                           plan.LaunchOptions(script="t.py"), plan.Features(frozenset()), cfg,
                           {})
        s.kill_wait = slurm.kill_wait()
        s.end_time = timelimit.job_end({}, slurm, jid)
        assert s.end_time is not None and 300 < s.end_time - time.time() <= 600, s.end_time
        s.node_ledger.exclude("no-such-node", "test")
        s.signal = Signal.USR1
        events = os.path.join(cfg.state_dir, "events.jsonl")
        os.makedirs(cfg.state_dir, exist_ok=True)
        os.mkfifo(events)
        seen: list = []
        written: list[bytes] = []
        done = threading.Event()

        def watch() -> None:  # the requeue, seen while nothing could be written yet
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not seen:
                if (j := slurm.job(jid)).restart_count >= 1:
                    seen.append(j)
                time.sleep(0.1)
            while not done.is_set():  # the filesystem answers again
                with open(events, "rb") as fh:
                    written.append(fh.read())

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        rc = s.requeue("SIGUSR1 received (time limit warning)")
        done.set()
        with contextlib.suppress(OSError):  # a reader waiting for the next writer
            os.close(os.open(events, os.O_WRONLY | os.O_NONBLOCK))
        th.join(10)
        assert seen, "not requeued while the launcher was blocked on its events file"
        assert rc == EXIT_REQUEUED
        (tmp_path / "events.jsonl").write_bytes(b"".join(written))
        evs = [e for e in read_events(str(tmp_path / "events.jsonl"))
               if e["kind"] == "requeue"]
        assert evs[0]["reason"].startswith("SIGUSR1") and evs[0]["took_s"] < 10, evs
        assert "ExcNodeList/request not updated" in evs[1]["warning"], evs
        job = slurm.job(jid)
        assert not job.held and job.restart_count == 1 and not job.excluded, job
    finally:
        signal.signal(signal.SIGTERM, old_term)
        slurm.cancel(jid)
