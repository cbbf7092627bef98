"""Helpers shared by the hooks' cluster tests (a real sandbox; hardware simulated per node)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from resilient_slurm.events import read_events
from resilient_slurm_lab.hardware.simulate import install_scenario
from resilient_slurm_lab.sandbox.lifecycle import HEALTH_INTERVAL

from ..conftest import wait_until

CLI = [sys.executable, "-m", "resilient_slurm.cli"]
PREFIX = "rhc:"


def fault(sandbox, node: str, scenario: str) -> None:
    subprocess.run([*CLI, "sandbox", "fault", node, scenario, "--dir", sandbox.root],
                   check=True, capture_output=True, timeout=30)


def events(sandbox, **match):
    return [e for e in read_events(sandbox.p("log", "events.jsonl"))
            if all(e.get(k) == v for k, v in match.items())]


def health_shim(sandbox) -> str:
    return sandbox.p("libexec", "resilient-slurm", "healthcheck")


def run_health_as_slurm(sandbox, node: str) -> subprocess.CompletedProcess[str]:
    """Exactly how slurmd runs the HealthCheckProgram: root, env holds only SLURMD_NODENAME."""
    return subprocess.run([health_shim(sandbox)], env={"SLURMD_NODENAME": node}, cwd="/",
                          capture_output=True, text=True, timeout=70)


def run_health_timed(sandbox, node: str,
                     within_s: float = 60.0) -> tuple[subprocess.CompletedProcess[str], float]:
    """``run_health_as_slurm`` until a run is not skipped, and that run's seconds: slurmd's own
    periodic run may hold ``health.lock`` at that moment, and ours then exits 0 at once with a
    ``health_skipped`` event, or a prolog may be running (``health_yielded``;
    hooks/health.py). Run again once that is over. (A skip of slurmd's run while ours
    ran also counts: one run too many, never one too few.)"""
    def passes() -> int:
        return len([e for e in events(sandbox, node=node)
                    if e["kind"] in ("health_skipped", "health_yielded")])

    deadline = time.monotonic() + within_s
    while True:
        skipped = passes()
        start = time.monotonic()
        done = run_health_as_slurm(sandbox, node)
        elapsed = time.monotonic() - start
        if passes() == skipped:
            return done, elapsed
        if time.monotonic() > deadline:
            raise AssertionError(f"every health run on {node} for {within_s:.0f} s was skipped")
        time.sleep(1)


def run_health_not_skipped(sandbox, node: str) -> subprocess.CompletedProcess[str]:
    return run_health_timed(sandbox, node)[0]


def restore(sandbox, slurm, node: str) -> None:
    """Repair the node; our health program resumes it after `resume_after` (2) healthy runs."""
    fault(sandbox, node, "clear")
    for _ in range(3):
        run_health_as_slurm(sandbox, node)
        if not slurm.node(node).drain:
            return
    # slurmd's own periodic runs resume it (ours skip while one holds the lock): a few
    # intervals, as a loaded machine runs each health program slower
    wait_until(lambda: not slurm.node(node).drain, timeout=4 * HEALTH_INTERVAL + 10)


def submit(slurm, sandbox, tmp_path, body: str, *opts: str) -> int:
    script = tmp_path / f"job-{uuid.uuid4().hex[:6]}.sh"
    script.write_text("#!/bin/bash\n" + body + "\n")
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    return slurm.submit(str(script), ["--output", str(tmp_path / "out-%j.txt"), *opts], env=env)


def hook_config(tmp_path, extra: str = "", verdicts: bool = False) -> str:
    """A hook config for node n1, Slurm pointed at nothing; the node's simulated hardware is
    ``<root>/nodes/n1/scenario.toml``, beside its ``[health] state_dir`` (the lab's hooks,
    :func:`run_hook`, read it there)."""
    root = tmp_path / "root"
    root.mkdir(mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    install_scenario(str(root / "nodes" / "n1"), "clear")
    path = root / "config.toml"
    path.write_text(
        "[hooks]\n"
        f'state_dir = "{root}/nodes/{{node}}/hooks"\n'
        f'events_file = "{root}/events.jsonl"\n'
        # never the host's /var/lib/resilient-slurm: published here, or not at all
        + (f'verdict_file = "{root}/verdicts/{{node}}.json"\n' if verdicts
           else 'verdict_file = ""\n') +
        'slurm_bin_dir = "/nonexistent"\n'
        'slurm_conf = "/nonexistent/slurm.conf"\n'
        "prolog_budget_s = 10\nepilog_budget_s = 10\nhealth_budget_s = 10\n"
        + extra +
        "[health]\n"
        f'state_dir = "{root}/nodes/{{node}}/health"\n'
        'profile = "p5.48xlarge"\nwatchdog_s = 10\ntool_timeout_s = 5\nnvml_timeout_s = 5\n')
    os.chmod(path, 0o644)
    return str(path)


def run_hook(module: str, config: str, env: dict[str, str] | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A hook as the sandbox's slurmd runs it: root, a bare environment, ``python -I``; the
    product's hook through the lab's wrapper, on the node's simulated hardware."""
    func = {"prolog": "resilient_slurm_lab.hardware.hooks:prolog_main",
            "epilog": "resilient_slurm_lab.hardware.hooks:epilog_main",
            "health": "resilient_slurm_lab.hardware.hooks:health_main"}[module]
    mod, fn = func.split(":")
    code = f"import sys; from {mod} import {fn}; sys.exit({fn}(['--config', {config!r}]))"
    base = {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42"}
    return subprocess.run([sys.executable, "-I", "-c", code], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, cwd="/")
