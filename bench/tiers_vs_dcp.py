"""Memory tiers vs the script's own DCP saves, both under resilient-launch, same faults.

Two jobs on 2 nodes of one sandbox, one after the other: ``tests/launcher/foreign/train_dcp.py``
(its own ``dcp.save`` every 5 steps) and ``train_tiers.py`` (the same script with
``checkpoint.save`` every step, a durable save every 5), each with an exception, a SIGKILL and
a hang (``bench/foreign_vs_ft.py``'s schedule). Per fault: recovery from the script's own
clock (fault line -> first step after the restart, the same rule as ``foreign_vs_ft``) and the
steps lost (the step the fault hit - 1 - the step the restart resumed from).

    python bench/tiers_vs_dcp.py [--dir /tmp/rs-bench-tiers] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from foreign_vs_ft import BIN, FAULTS, HEARTBEAT, STEPS, TERM, TERMINAL, recoveries

REPO = Path(__file__).resolve().parents[1]
FOREIGN = REPO / "tests" / "launcher" / "foreign"
START = re.compile(r"^\[script\] (?:rank=0 )?start step=(\d+)", re.M)
FAULT = re.compile(r"^\[script\] fault=(\w+) step=(\d+)", re.M)
SCRIPTS = {"dcp.save every 5": ("train_dcp.py", ["--save-every=5"]),
           "memory tiers every step": ("train_tiers.py", ["--durable-every=5"])}


def lost_steps(log: str) -> dict[str, int]:
    """Per fault (in the order they fired): the step it hit - 1 - the next resume step."""
    resumes = [int(s) for s in START.findall(log)][1:]  # the first start is the fresh one
    return {kind: int(step) - 1 - resume
            for (kind, step), resume in zip(FAULT.findall(log), resumes, strict=False)}


def run_one(slurm: Any, conf: str, name: str, work: Path, timeout: float) -> dict[str, Any]:
    script, extra = SCRIPTS[name]
    (work / "faults").mkdir(parents=True, exist_ok=True)
    line = [str(BIN / "resilient-launch"), "--nproc-per-node=1",
            f"--heartbeat-timeout={HEARTBEAT}", "--initial-heartbeat-timeout=120",
            f"--term-timeout={TERM}", "--max-restarts=3", f"--checkpoint-dir={work}/ck",
            str(FOREIGN / script), f"--steps={STEPS}", f"--save-dir={work}/ck", *extra,
            *(f"--fault={f}" for f in FAULTS), f"--fault-dir={work}/faults"]
    batch = work / "job.sbatch"
    batch.write_text(f"#!/bin/bash\nexport RESILIENT_SANDBOX_TIER1_DIR={work}/shm/{{node}}\nexec "
                     + " ".join(line) + "\n")
    env = {**os.environ, "SLURM_CONF": conf, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    jid = slurm.submit(str(batch), ["--nodes=2", "--open-mode=append", f"--output={work}/job.out",
                                    f"--chdir={work}", "--job-name=bench-tiers"], env=env)
    deadline = time.monotonic() + timeout
    state = slurm.job(jid).state
    while time.monotonic() < deadline and state not in TERMINAL:
        time.sleep(1)
        state = slurm.job(jid).state
    if state not in TERMINAL:
        slurm.cancel(jid)
        state = "TIMEOUT(bench)"
    log = (work / "job.out").read_text() if (work / "job.out").exists() else ""
    stalls = [float(x) for x in re.findall(r"stall_ms=([\d.]+)", log)]
    return {"script": name, "state": state, "done": f"[script] done step={STEPS}" in log,
            "recovery_s": recoveries(log), "lost_steps": lost_steps(log),
            "save_stall_ms_median": sorted(stalls)[len(stalls) // 2] if stalls else None}


def render(runs: list[dict[str, Any]]) -> str:
    lines = ["per fault: recovery s (script's clock) / lost steps",
             f"{'script':<26}" + "".join(f"{k:>18}" for k in ("exception", "sigkill", "hang"))
             + "   state"]
    for r in runs:
        cells = "".join(f"{r['recovery_s'].get(k, '?')!s:>10} / {r['lost_steps'].get(k, '?')!s:<5}"
                        for k in ("exception", "sigkill", "hang"))
        lines.append(f"{r['script']:<26}{cells}   {r['state']}"
                     + (f", save stall {r['save_stall_ms_median']:.2f} ms median"
                        if r["save_stall_ms_median"] is not None else ""))
    tiers = next((r for r in runs if r["script"] == "memory tiers every step"), None)
    if tiers is not None:
        lost = [tiers["lost_steps"].get(k) for k in ("exception", "sigkill")]
        met = tiers["state"] == "COMPLETED" and lost == [0, 0]
        lines.append(f"target: exception and SIGKILL restarted by ft_launcher lose 0 steps "
                     f"(tier 1): {'met' if met else 'NOT MET'} (lost {lost})")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="sandbox + work directory (default: a new temp)")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    from resilient_slurm.slurm import connect
    from resilient_slurm_lab.sandbox import lifecycle

    root = ns.dir or tempfile.mkdtemp(prefix="rs-bench-tiers-")
    paths = lifecycle.up(root, nodes=2)
    try:
        slurm = connect(conf=paths.conf, backend="cli", timeout=10)
        runs = [run_one(slurm, paths.conf, name, Path(root) / "work" / str(i), 420)
                for i, name in enumerate(SCRIPTS)]
        print(render(runs))
        if ns.json:
            Path(ns.json).write_text(json.dumps({"runs": runs, "faults": FAULTS,
                                                 "steps": STEPS}, indent=1) + "\n")
    finally:
        lifecycle.down(root, quiet=True)
        if ns.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
