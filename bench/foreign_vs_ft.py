"""resilient-launch vs ft_launcher alone on an outside-style script, side by side in one run.

Four jobs, one at a time in ABBA order (ft_launcher, resilient-launch, resilient-launch,
ft_launcher) on 2 nodes of one sandbox, so a drift in the machine's load favours neither: the
same ``tests/launcher/foreign/train_dcp.py`` (FSDP2, its own DCP saves, NVRx heartbeats) with
the same faults (an exception, a SIGKILL, a hang), once under ``exec resilient-launch`` and once
under the ``srun ft_launcher`` line a user writes by hand (same heartbeat and term timeouts).
Recovery per fault is read from the script's own timestamps (fault line -> first step after
the restart), so both are measured by the same clock and the same rule.

    python bench/foreign_vs_ft.py [--dir /tmp/rs-bench-foreign] [--json OUT]  # its own sandbox

``--json OUT``: the runs and means, the command, when and at what load (docs/any-script.md
quotes ``bench/results/foreign-vs-ft.json``).
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


def batch_line(name: str, work: Path) -> str:
    """The job's one line: ``exec resilient-launch ...`` or the hand-written ft_launcher one."""
    args = [str(SCRIPT), f"--steps={STEPS}", f"--save-dir={work}/ck", "--save-every=5",
            *(f"--fault={f}" for f in FAULTS), f"--fault-dir={work}/faults"]
    if name == RL:
        return "exec " + " ".join([
            str(BIN / "resilient-launch"), "--nproc-per-node=1",
            f"--heartbeat-timeout={HEARTBEAT}", "--initial-heartbeat-timeout=120",
            f"--term-timeout={TERM}", "--max-restarts=3", f"--checkpoint-dir={work}/ck", *args])
    return " ".join([
        "srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", str(BIN / "ft_launcher"),
        "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_port()}", "--rdzv-id=$SLURM_JOB_ID", "--max-restarts=3",
        f"--ft-rank-heartbeat-timeout={HEARTBEAT}", "--ft-initial-rank-heartbeat-timeout=120",
        f"--term-timeout={TERM}", f"--workers-stop-timeout={TERM}",
        "--ft-enable-nic-monitor=false", *args])


RL, FT = "resilient-launch", "ft_launcher"
ORDER = (FT, RL, RL, FT)  # ABBA: a drift of the machine's load favours neither


def run_one(slurm: Any, conf: str, name: str, work: Path, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "SLURM_CONF": conf, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    (work / "faults").mkdir(parents=True, exist_ok=True)
    batch = work / "job.sbatch"
    batch.write_text(f"#!/bin/bash\n{batch_line(name, work)}\n")
    jid = slurm.submit(str(batch), ["--nodes=2", "--open-mode=append", f"--output={work}/job.out",
                                    f"--chdir={work}", "--job-name=bench-foreign"], env=env)
    deadline = time.monotonic() + timeout
    state = slurm.job(jid).state
    while time.monotonic() < deadline and state not in TERMINAL:
        time.sleep(1)
        state = slurm.job(jid).state
    if state not in TERMINAL:
        slurm.cancel(jid)
        state = "TIMEOUT(bench)"
    log = (work / "job.out").read_text() if (work / "job.out").exists() else ""
    return {"mechanism": name, "state": state, "recovery": recoveries(log),
            "done": f"[script] done step={STEPS}" in log}


def side_by_side(slurm: Any, conf: str, work: Path, timeout: float = 420) -> dict[str, Any]:
    """Both mechanisms, one job at a time in ABBA order, on the same nodes of one sandbox;
    per mechanism the runs and the mean recovery per fault."""
    runs = [run_one(slurm, conf, name, work / f"{i}-{'rl' if name == RL else 'ft'}", timeout)
            for i, name in enumerate(ORDER)]
    out: dict[str, Any] = {}
    for name in (RL, FT):
        mine = [r for r in runs if r["mechanism"] == name]
        kinds = set.intersection(*(set(r["recovery"]) for r in mine))
        out[name] = {"runs": mine, "ok": all(r["state"] == "COMPLETED" and r["done"]
                                             for r in mine),
                     "recovery": {k: round(sum(r["recovery"][k] for r in mine) / len(mine), 2)
                                  for k in kinds}}
    return out


def render(res: dict[str, Any]) -> str:
    lines = ["recovery per fault (the script's own clock: fault -> first step after restart)",
             "fault       resilient-launch   ft_launcher alone   difference   (runs)"]
    rl, ft = res[RL]["recovery"], res[FT]["recovery"]
    for kind in ("exception", "sigkill", "hang"):
        a, b = rl.get(kind), ft.get(kind)
        diff = f"{a - b:+.2f}s" if a is not None and b is not None else "?"
        each = " / ".join(f"{r['recovery'].get(kind, '?')}" for name in (RL, FT)
                          for r in res[name]["runs"])
        lines.append(f"{kind:10}  {a if a is not None else '?':>14}s  "
                     f"{b if b is not None else '?':>16}s   {diff:>9}   ({each})")
    lines.append("jobs: " + ", ".join(f"{r['mechanism']} {r['state']}" for name in (RL, FT)
                                      for r in res[name]["runs"]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="sandbox + work directory (default: a new temp)")
    ap.add_argument("--json", default=None, help="write the figures here too")
    ns = ap.parse_args()
    load = [round(x, 1) for x in os.getloadavg()]
    from resilient_slurm.slurm import connect
    from resilient_slurm_lab.sandbox import lifecycle

    root = ns.dir or tempfile.mkdtemp(prefix="rs-bench-foreign-")
    paths = lifecycle.up(root, nodes=4)
    try:
        work = Path(root) / "work"
        work.mkdir(exist_ok=True)
        slurm = connect(conf=paths.conf, backend="cli", timeout=10)
        res = side_by_side(slurm, paths.conf, work)
        print(render(res))
        if ns.json:
            import json

            with open(ns.json, "w") as fh:
                json.dump({"command": " ".join(["bench/foreign_vs_ft.py", *sys.argv[1:]]),
                           "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "load_avg_at_start": load, **res}, fh, indent=1)
                fh.write("\n")
    finally:
        lifecycle.down(root, quiet=True)
        if ns.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
