"""The launcher's requeue sequence on the real sandbox, run as the job's own (unprivileged) user.

The unit tests in test_blame_ledger.py drive every failure branch of ``requeue_excluding``;
these prove the two promises that matter against real Slurm: the user's own ``--exclude``
survives (merged, never replaced) and the job ends requeued, never held.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

pytestmark = pytest.mark.slurm

# Runs as the job user: the launcher's own call, through the seam's CLI backend.
REQUEUE_AS_USER = """
import json, sys
from resilient_slurm.launcher import requeue
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
