"""Issue 12 acceptance: a 32-node sandbox with Slurm's production timing; the controller is
stalled for 40 s while health runs and 8 jobs (of an ordinary user) start. No node ends drained
or down except those made unhealthy on purpose, and no job is lost.

One test, one sandbox (about 3-5 minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from resilient_slurm.events import read_events
from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox import lifecycle
from resilient_slurm_lab.sandbox.cluster import Paths

from ..conftest import TEST_PREFIX, _start_sandbox
from .conftest import fault

pytestmark = pytest.mark.slurm
NODES = 32
BROKEN = {"node31": "xid79", "node32": "efa-port-down"}
STALL_S = 40
JOBS = 8


@pytest.fixture(scope="module")
def big_prod_sandbox() -> Iterator[Paths]:
    yield from _start_sandbox(TEST_PREFIX + "acc-", nodes=NODES, timing="production",
                              timeout=240)


def health_as_slurmd(paths: Paths, node: str) -> int:
    """The HealthCheckProgram exactly as slurmd runs it (root, env: SLURMD_NODENAME only)."""
    shim = paths.p("libexec", "resilient-slurm", "healthcheck")
    return subprocess.run([shim], env={"SLURMD_NODENAME": node}, cwd="/", timeout=70,
                          capture_output=True).returncode


def test_stalled_controller_drains_nothing_healthy_and_loses_no_job(big_prod_sandbox,
                                                                     job_user) -> None:
    paths = big_prod_sandbox
    slurm = connect(conf=paths.conf, backend="cli", timeout=30)
    timing = lifecycle.sandbox_timing(paths.root)
    assert timing.name == "production"
    for node, scenario in BROKEN.items():  # unhealthy on purpose
        fault(paths, node, scenario)
    out = job_user.make_dir()
    jobs = []
    for _ in range(JOBS):
        res = job_user.run(paths, ["sbatch", "--parsable", "-N1", "--requeue", "-o",
                                   f"{out}/%j.out", "--wrap", "sleep 10"],
                           capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr
        jobs.append(int(res.stdout.strip().split(";")[0]))
    healthy = [f"node{i}" for i in range(1, NODES + 1) if f"node{i}" not in BROKEN]
    checked = healthy[:12]  # where the jobs land first, and more; slurmd runs the rest itself
    with lifecycle.controller_stall(paths.root, STALL_S, wait=False) as stall:
        # Prologs of the jobs just allocated, and health runs, while the controller is stalled.
        stalled_at = time.time()
        start = time.monotonic()

        def run(node: str) -> tuple[float, int]:
            began = time.monotonic() - start
            return began, health_as_slurmd(paths, node)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            runs = dict(zip(checked, pool.map(run, checked), strict=True))
        stall.wait()
    assert {n: c for n, (_, c) in runs.items() if c != 0} == {}  # healthy: 0, whatever Slurm does
    late = {n: round(t, 1) for n, (t, _) in runs.items() if t >= STALL_S}
    assert late == {}, f"health runs that started after the stall ended: {late}"

    deadline = time.monotonic() + timing.cred_expire + 4 * timing.health_interval + 120
    states: dict[int, str] = {}
    while time.monotonic() < deadline:
        states = {j: slurm.job(j).state for j in jobs}
        if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
               for s in states.values()):
            break
        time.sleep(3)
    assert set(states.values()) == {"COMPLETED"}, states  # no job lost

    def settled() -> bool:
        return not any("NOT_RESPONDING" in n.flags for n in slurm.nodes())

    while time.monotonic() < deadline and not settled():
        time.sleep(2)
    bad = {n.name: n.describe() for n in slurm.nodes()
           if (n.drain or n.state == "DOWN") and n.name not in BROKEN}
    assert bad == {}, bad
    assert os.path.exists(paths.p("verdicts", "node1.json"))
    prologs = [e for e in read_events(paths.p("log", "events.jsonl"))
               if e.get("source") == "prolog" and e.get("kind") == "verdict"
               and stalled_at <= e["ts"] <= stalled_at + STALL_S]
    print(f"\n{len(prologs)} prolog(s) finished while the controller was stalled")
