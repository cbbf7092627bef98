"""The dead man's switch end to end, on a sandbox with its Prometheus (``sandbox up
--metrics``): one node's hook interpreter is removed; slurmd's next HealthCheckProgram run on
it drains it with ``rhc:HOOK_BROKEN``, and ResilientHealthCheckStale fires for that node, and
no other, in the sandbox's Prometheus within three health intervals of its last good run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from resilient_slurm.cli import main
from resilient_slurm.hooks import install
from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox import lifecycle, metrics_stack, prom
from resilient_slurm_lab.sandbox.cluster import Paths

from ..conftest import TEST_PREFIX, _start_sandbox, wait_until

pytestmark = pytest.mark.slurm

INTERVAL = 5  # HealthCheckInterval (s)
BROKEN = "node2"


@pytest.fixture(scope="module")
def metrics_sandbox() -> Iterator[tuple[Paths, prom.Stack]]:
    for paths in _start_sandbox(TEST_PREFIX + "metrics-", nodes=3, health_interval=INTERVAL):
        stack = metrics_stack.start(paths, ["node1", "node2", "node3"],
                                    lifecycle.job_user(paths.root), scrape_s=1.0)
        yield paths, stack  # `down` (the fixture's end) stops the stack too


def _stale(stack: prom.Stack) -> dict[str, str]:
    return {a["labels"]["node"]: a["state"] for a in prom.alerts(stack)
            if a["labels"].get("alertname") == "ResilientHealthCheckStale"}


def test_removed_interpreter_drains_the_node_and_the_staleness_alert_fires(
        metrics_sandbox: tuple[Paths, prom.Stack]) -> None:
    paths, stack = metrics_sandbox
    slurm = connect(conf=paths.conf, backend="cli", timeout=10)
    # A venv per node, as on a fleet whose nodes each have their own: the shims name it by
    # the node's name; each node's is a link to this test's venv.
    for n in ("node1", "node2", "node3"):
        os.symlink(sys.prefix, os.path.join(paths.node_dir(n), "venv"))
    install.install(paths.root, python=paths.p("nodes", "{node}", "venv", "bin", "python"))
    first = time.time()
    wait_until(lambda: all(prom.query(stack, f'resilient_hook_last_success_timestamp_seconds'
                                             f'{{node="{n}",source="health"}} > {first}')
                           for n in ("node1", "node2", "node3")), timeout=8 * INTERVAL)
    # the recording rule has its own evaluation interval: it follows the scrapes
    wait_until(lambda: len(prom.query(stack, "resilient:health_interval:seconds")) == 3,
               timeout=8 * INTERVAL)
    intervals = {r["metric"]["node"]: r["value"][1]
                 for r in prom.query(stack, "resilient:health_interval:seconds")}
    assert intervals == {n: str(INTERVAL) for n in ("node1", "node2", "node3")}, intervals
    os.unlink(os.path.join(paths.node_dir(BROKEN), "venv"))  # node2's interpreter is gone
    broken_at = time.time()
    try:
        wait_until(lambda: slurm.node(BROKEN).drain, timeout=4 * INTERVAL)
        node = slurm.node(BROKEN)
        assert node.reason == "rhc:HOOK_BROKEN healthcheck", node
        drained_s = time.time() - broken_at
        firing = wait_until(lambda: _stale(stack).get(BROKEN) == "firing" and time.time(),
                            timeout=6 * INTERVAL, every=0.5)
        last = float(prom.query(stack, f'resilient_hook_last_success_timestamp_seconds'
                                       f'{{node="{BROKEN}",source="health"}}')[0]["value"][1])
        print(f"drained {drained_s:.1f} s after the removal; alert firing {firing - last:.1f} s "
              f"after the last good run ({firing - broken_at:.1f} s after the removal), "
              f"interval {INTERVAL} s")
        assert last < broken_at
        # three intervals of age, then Prometheus's scrape and evaluation (1 s each)
        assert firing - last <= 3 * INTERVAL + 4
        assert set(_stale(stack)) == {BROKEN}  # the others keep running
        # the fleet ledger names the cause
        res = CliRunner().invoke(main, ["fleet", "--config", lifecycle.config_path(paths),
                                        "--json"])
        assert res.exit_code == 0, res.output
        assert '"HOOK_BROKEN": 1' in res.output
    finally:
        os.symlink(sys.prefix, os.path.join(paths.node_dir(BROKEN), "venv"))
        if slurm.node(BROKEN).drain:
            slurm.resume(BROKEN)
