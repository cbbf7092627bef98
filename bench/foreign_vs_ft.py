"""resilient-launch vs ft_launcher alone on an outside-style script, side by side in one run.

Two jobs at once on one 4-node sandbox (2 nodes each, so both meet the same machine load): the
same ``tests/launcher/foreign/train_dcp.py`` (FSDP2, its own DCP saves, NVRx heartbeats) with
the same faults (an exception, a SIGKILL, a hang), once under ``exec resilient-launch`` and once
under the ``srun ft_launcher`` line a user writes by hand (same heartbeat and term timeouts).
Recovery per fault is read from the script's own timestamps (fault line -> first step after
the restart), so both are measured by the same clock and the same rule.

    python bench/foreign_vs_ft.py [--dir /tmp/rs-bench-foreign]    # its own sandbox
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPT = REPO / "tests" / "launcher" / "foreign" / "train_dcp.py"
FAULTS = ("exception@4:1", "sigkill@9:0", "hang@14:1")
STEPS, HEARTBEAT, TERM = 20, 6, 3
FAULT_LINE = re.compile(r"^\[script\] fault=(\w+) step=\d+ rank=\d+ t=([\d.]+)", re.M)
STEP_LINE = re.compile(r"^\[script\] step=\d+ .*t=([\d.]+)", re.M)
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def recoveries(log: str, gap: float = 1.5) -> dict[str, float]:
    """Per fault type: the script's fault line -> its first step line after a restart (the
    first step printed more than ``gap`` s after the previous one)."""
    steps = sorted(float(t) for t in STEP_LINE.findall(log))
    out = {}
    for kind, t in FAULT_LINE.findall(log):
        prev = t0 = float(t)
        for ts in (x for x in steps if x > t0):
            if ts - prev > gap:
                out[kind] = round(ts - t0, 2)
                break
            prev = ts
    return out


def batch_lines(work: Path) -> dict[str, str]:
    args = [str(SCRIPT), f"--steps={STEPS}", f"--save-dir={work}/{{name}}/ck", "--save-every=5",
            *(f"--fault={f}" for f in FAULTS), f"--fault-dir={work}/{{name}}/faults"]
    rl = [str(BIN / "resilient-launch"), "--nproc-per-node=1", f"--heartbeat-timeout={HEARTBEAT}",
          "--initial-heartbeat-timeout=120", f"--term-timeout={TERM}", "--max-restarts=3",
          f"--checkpoint-dir={work}/{{name}}/ck", *args]
    ft = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", str(BIN / "ft_launcher"),
          "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
          f"--rdzv-endpoint=127.0.0.1:{_port()}", "--rdzv-id=$SLURM_JOB_ID", "--max-restarts=3",
          f"--ft-rank-heartbeat-timeout={HEARTBEAT}", "--ft-initial-rank-heartbeat-timeout=120",
          f"--term-timeout={TERM}", f"--workers-stop-timeout={TERM}",
          "--ft-enable-nic-monitor=false", *args]
    return {"resilient-launch": "exec " + " ".join(rl).replace("{name}", "rl"),
            "ft_launcher": " ".join(ft).replace("{name}", "ft")}


def side_by_side(slurm: Any, conf: str, work: Path, timeout: float = 600) -> dict[str, Any]:
    """Submit both jobs at once; wait; per mechanism the job state and per-fault recovery."""
    env = {**os.environ, "SLURM_CONF": conf, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    jobs = {}
    for name, line in batch_lines(work).items():
        short = "rl" if name == "resilient-launch" else "ft"
        (work / short / "faults").mkdir(parents=True, exist_ok=True)
        batch = work / f"{short}.sbatch"
        batch.write_text(f"#!/bin/bash\n{line}\n")
        jobs[name] = slurm.submit(str(batch), ["--nodes=2", "--open-mode=append",
                                               f"--output={work}/{short}.out",
                                               f"--chdir={work}", f"--job-name=bench-{short}"],
                                  env=env)
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline and len(states) < len(jobs):
        for name, jid in jobs.items():
            st = slurm.job(jid).state
            if st in TERMINAL:
                states[name] = st
        time.sleep(1)
    for name, jid in jobs.items():
        if name not in states:
            slurm.cancel(jid)
            states[name] = "TIMEOUT(bench)"
    out: dict[str, Any] = {}
    for name in jobs:
        short = "rl" if name == "resilient-launch" else "ft"
        log = (work / f"{short}.out").read_text() if (work / f"{short}.out").exists() else ""
        out[name] = {"state": states[name], "recovery": recoveries(log),
                     "done": f"[script] done step={STEPS}" in log}
    return out


def render(res: dict[str, Any]) -> str:
    lines = ["fault       resilient-launch   ft_launcher alone   difference"]
    rl, ft = res["resilient-launch"]["recovery"], res["ft_launcher"]["recovery"]
    for kind in ("exception", "sigkill", "hang"):
        a, b = rl.get(kind), ft.get(kind)
        diff = f"{a - b:+.2f}s" if a is not None and b is not None else "?"
        lines.append(f"{kind:10}  {a if a is not None else '?':>14}s  "
                     f"{b if b is not None else '?':>16}s   {diff}")
    lines.append("jobs: " + ", ".join(f"{k} {v['state']}{'' if v['done'] else ' (not done)'}"
                                      for k, v in res.items()))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="sandbox + work directory (default: a new temp)")
    ns = ap.parse_args()
    from resilient_slurm.sandbox import lifecycle
    from resilient_slurm.slurm import connect

    root = ns.dir or tempfile.mkdtemp(prefix="rs-bench-foreign-")
    paths = lifecycle.up(root, nodes=4)
    try:
        work = Path(root) / "work"
        work.mkdir(exist_ok=True)
        slurm = connect(conf=paths.conf, backend="cli", timeout=10)
        print(render(side_by_side(slurm, paths.conf, work)))
    finally:
        lifecycle.down(root, quiet=True)
        if ns.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
