"""Stopping a step, against the production-timing sandbox as the job user (issue 37, item 8).

A 4-node allocation runs a 3-node step (a hot spare's allocation: the fourth node runs no
task), each task the node shim around an ft_launcher stand-in that saves on SIGTERM. With
slurmctld frozen, ``step.stop_step`` still stops every task in about a second: the stop goes
to srun, which forwards it to the tasks through the nodes' slurmd. (The old stop,
``scancel --signal=TERM JOB.0``, needed the controller and, with a node of the allocation
outside the step, was answered "Invalid job id specified" even when it worked.)"""

from __future__ import annotations

import json
import os
import sys

import pytest

from resilient_slurm_lab.sandbox import lifecycle
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

# The batch script: the stand-in step, then the launcher's stop once the test says "go".
STOPPER = r"""
import json, os, subprocess, sys, time
from resilient_slurm.events import EventLog
from resilient_slurm.launcher import step
work, nodes = sys.argv[1], sys.argv[2]
rec = os.path.join(work, "rec")
ft_like = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *_: (print('saved', flush=True), sys.exit(0)))\n"
           "time.sleep(600)\n")
proc = subprocess.Popen(["srun", "-N3", "-w", nodes, "--ntasks-per-node=1", sys.executable,
                         "-m", "resilient_slurm.launcher.shim.node", f"--record-dir={rec}", "--",
                         sys.executable, "-c", ft_like])
while len([f for f in os.listdir(rec) if f.endswith(".started.json")]
          if os.path.isdir(rec) else []) < 3:
    time.sleep(0.1)
open(os.path.join(work, "ready"), "w").close()
while not os.path.exists(os.path.join(work, "go")):
    time.sleep(0.05)
t0 = time.monotonic()
forced = step.stop_step(proc, rec, 30.0, EventLog(os.path.join(work, "events.jsonl"), "t"), 10.0)
with open(os.path.join(work, "result.json"), "w") as fh:
    json.dump({"elapsed": time.monotonic() - t0, "forced": forced}, fh)
"""


def test_a_step_with_a_spare_beside_it_stops_in_seconds_with_the_controller_frozen(
        prod, tmp_path) -> None:
    sbx, s, user = prod
    work = user.make_dir(mode=0o755)
    script = os.path.join(work, "stopper.py")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(STOPPER)
    batch = os.path.join(work, "job.sbatch")
    with open(batch, "w", encoding="utf-8") as fh:
        fh.write(f"#!/bin/bash\nexec {sys.executable} {script} {work} node1,node2,node3\n")
    for p in (script, batch):
        os.chown(p, user.uid, user.gid)
    res = user.run(sbx, ["sbatch", "--parsable", "--nodes=4", "-w", "node[1-4]",
                         f"--output={work}/out.txt", batch], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    try:
        try:
            wait_until(lambda: os.path.exists(os.path.join(work, "ready")), 120)
        except AssertionError:
            out = os.path.join(work, "out.txt")
            raise AssertionError((s.job(jid), open(out, encoding="utf-8").read()
                                  if os.path.exists(out) else "no output")) from None
        with lifecycle.controller_stall(sbx.root, 40, wait=False):
            open(os.path.join(work, "go"), "w").close()
            result = os.path.join(work, "result.json")
            wait_until(lambda: os.path.exists(result), 35)
            got = json.load(open(result, encoding="utf-8"))
        assert got["forced"] is False and got["elapsed"] < 5.0, got
        rec = os.path.join(work, "rec")
        for n in ("node1", "node2", "node3"):
            exited = json.load(open(os.path.join(rec, f"{n}.json"), encoding="utf-8"))
            started = json.load(open(os.path.join(rec, f"{n}.started.json"), encoding="utf-8"))
            assert exited["rc"] == 0 and started["signal"] == "SIGUSR2", (exited, started)
        assert not os.path.exists(os.path.join(rec, "node4.started.json"))
        wait_until(lambda: not s.job(jid).active, 60)
        out = open(os.path.join(work, "out.txt"), encoding="utf-8").read()
        assert out.count("saved") == 3 and "Invalid job id" not in out, out
    finally:
        if s.job(jid).active:
            s.cancel(jid)
