"""Helpers shared by the hooks' cluster tests (a real sandbox; hardware simulated per node)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from resilient_slurm.events import read_events
from resilient_slurm.sandbox.lifecycle import HEALTH_INTERVAL

from ..conftest import wait_until

CLI = [sys.executable, "-m", "resilient_slurm.cli"]
PREFIX = "rhc:"


def fault(sandbox, node: str, scenario: str) -> None:
    subprocess.run([*CLI, "sandbox", "fault", node, scenario, "--dir", sandbox.root],
                   check=True, capture_output=True, timeout=30)


def events(sandbox, **match):  # type: ignore[no-untyped-def]
    return [e for e in read_events(sandbox.p("log", "events.jsonl"))
            if all(e.get(k) == v for k, v in match.items())]


def health_shim(sandbox) -> str:
    return sandbox.p("libexec", "resilient-slurm", "healthcheck")


def run_health_as_slurm(sandbox, node: str) -> subprocess.CompletedProcess[str]:
    """Exactly how slurmd runs the HealthCheckProgram: root, env holds only SLURMD_NODENAME."""
    return subprocess.run([health_shim(sandbox)], env={"SLURMD_NODENAME": node}, cwd="/",
                          capture_output=True, text=True, timeout=70)


def restore(sandbox, slurm, node: str) -> None:
    """Repair the node; our health program resumes it after `resume_after` (2) healthy runs."""
    fault(sandbox, node, "clear")
    for _ in range(3):
        run_health_as_slurm(sandbox, node)
        if not slurm.node(node).drain:
            return
    wait_until(lambda: not slurm.node(node).drain, timeout=2 * HEALTH_INTERVAL)


def submit(slurm, sandbox, tmp_path, body: str, *opts: str) -> int:
    script = tmp_path / f"job-{uuid.uuid4().hex[:6]}.sh"
    script.write_text("#!/bin/bash\n" + body + "\n")
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    return slurm.submit(str(script), ["--output", str(tmp_path / "out-%j.txt"), *opts], env=env)
