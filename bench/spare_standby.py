#!/usr/bin/env python3
"""Bench: a hard node loss with a hot spare, fault to the first step after it (target < 15 s).

One production-timing sandbox of 4 nodes (SlurmdTimeout 300 s, the hooks and their node
watcher publishing verdicts). A 3-node ``resilient-launch --spares 1`` job of the memory-tier
script (``tests/launcher/foreign/train_tiers.py``: ``checkpoint.save`` every step, no disk
checkpoint) runs as the job user, as ``tests/launcher/test_spares_slurm.py`` runs it. At step
30 one training node's rank stops mid-step (not rank 0's node, which hosts the rendezvous
store, nor the batch host), then ``sandbox node kill`` takes the node (slurmd, step daemons,
processes). Measured: the node kill to the first finished step after it (the script's own
step lines), the steps lost (step 29 is the last every rank finished), how the spare came in
(``via: standby``: NVRx >= 0.6 promoted its gated standby in the same step; else a new cycle),
the srun steps (cycles) and requeues. Target: < 15 s, 0 lost steps; printed met / NOT MET.

NVRx 0.6+ is installed in the Debian-root stages only (the main venv has 0.4.1, whose swap is
a new cycle), so the section is measured there:

    scripts/slurm-stage/stage.sh slurm24 --shell \\
        'python bench/spare_standby.py --json bench/results/spare-standby-nvrx06.json'

(``slurm26`` for NVRx 0.7; ``.venv/bin/python bench/spare_standby.py`` measures 0.4.1's path).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BIN, REPO, TERMINAL  # noqa: E402

from resilient_slurm.events import read_events  # noqa: E402
from resilient_slurm.launcher.cycle import plan  # noqa: E402
from resilient_slurm.launcher.shim import standby  # noqa: E402
from resilient_slurm.slurm import connect  # noqa: E402
from resilient_slurm_lab.sandbox import lifecycle  # noqa: E402

SCRIPT = REPO / "tests" / "launcher" / "foreign" / "train_tiers.py"
STEPS, FAULT_STEP, TARGET_S = 45, 30, 15.0
START = re.compile(r"\[script\] rank=(\d+) start step=(\d+) tier=(.+?) t=([\d.]+) node=([\w.-]+)")
STEP = re.compile(r"\[script\] step=(\d+) .* t=([\d.]+)")


def _wait(path: Path, pattern: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and re.search(pattern, path.read_text(errors="replace")):
            return
        time.sleep(0.1)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else ""
    raise RuntimeError(f"{pattern!r} not in {path} after {timeout:.0f} s:\n{tail}")


def _submit(root: str, work: str) -> tuple[int, Path, Path, str]:
    user = lifecycle.job_user(root)
    lifecycle.make_user_dir(work, user, mode=0o755)
    faults = Path(lifecycle.make_user_dir(os.path.join(work, "faults"), user, mode=0o755))
    argv = [str(BIN / "resilient-launch"), "--spares=1", "--nproc-per-node=1",
            "--max-restarts=3", "--heartbeat-timeout=30", "--initial-heartbeat-timeout=120",
            "--term-timeout=3", f"--verdict-path={os.path.join(root, 'verdicts', '{node}.json')}",
            f"--checkpoint-dir={work}/ck", str(SCRIPT), f"--steps={STEPS}", "--step-time=0.2",
            f"--save-dir={work}/ck", "--durable-every=1000",
            *[f"--fault=hang@{FAULT_STEP}:{r}" for r in range(3)], f"--fault-dir={faults}"]
    script = Path(work, "job.sbatch")
    script.write_text(f"#!/bin/bash\nexport RESILIENT_SANDBOX_TIER1_DIR={work}/shm/{{node}}\nexec "
                      + shlex.join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    r = lifecycle.run_as_user(root, [
        "sbatch", "--parsable", "--nodes=4", "--no-kill", "--requeue", "--open-mode=append",
        f"--output={work}/slurm-%j.out", f"--chdir={work}", str(script)],
        capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"sbatch: {r.stderr.strip()}")
    jid = int(r.stdout.strip().split(";")[0])
    return jid, Path(work, f"slurm-{jid}.out"), faults, os.path.join(work, "ck", ".resilient")


def measure(root: str) -> dict[str, Any]:
    slurm = connect(conf=os.path.join(root, "etc", "slurm.conf"), backend="cli", timeout=30)
    jid, out, faults, state = _submit(root, os.path.join(root, "users", "bench-spare"))
    _wait(out, r"(?s)(\[script\] rank=\d+ start step=0 .*){3}", 300)
    first = {int(r): n for r, _, _, _, n in START.findall(out.read_text())}
    batch = slurm.job(jid).extra.get("batch_host")
    victim_rank = next(r for r, n in sorted(first.items()) if n != batch and r > 0)
    victim = first[victim_rank]
    for r in first:
        if r != victim_rank:  # only the victim's rank stops at the fault step
            (faults / f"hang-{FAULT_STEP}-{r}").touch()
    _wait(out, rf"\[script\] fault=hang step={FAULT_STEP} rank={victim_rank} ", 300)
    lifecycle.node_kill(root, victim)
    killed = time.time()
    print(f"job {jid}: {victim} (rank {victim_rank}) killed at step {FAULT_STEP}", flush=True)
    try:
        end = time.monotonic() + 900
        while slurm.job(jid).state not in TERMINAL and time.monotonic() < end:
            time.sleep(1)
        job = slurm.job(jid)
    finally:
        lifecycle.node_start(root, victim)
        if not slurm.node(victim).available:
            slurm.resume(victim)
    log = out.read_text(errors="replace")
    evs = list(read_events(os.path.join(state, "events.jsonl")))
    after = [float(t) for st, t in STEP.findall(log)
             if int(st) == FAULT_STEP and float(t) > killed]
    resumed = sorted({int(s) for _, s, *_ in START.findall(log) if int(s) > 0})
    swaps = [e for e in evs if e.get("kind") == "spare" and e.get("node")]
    return {
        "job_id": jid, "job_state": job.state, "nodes": 4, "spares": 1, "victim": victim,
        "victim_rank": victim_rank,
        "fault_to_first_step_s": round(after[0] - killed, 1) if after else None,
        "resumed_at_steps": resumed,
        "lost_steps": (FAULT_STEP - 1 - resumed[0]) if len(resumed) == 1 else None,
        "spare": swaps[0]["node"] if swaps else None,
        "via": (swaps[0].get("via") or "new cycle") if swaps else None,
        "cycles": sum(1 for e in evs if e.get("kind") == "cycle_start"),
        "requeues": sum(1 for e in evs if e.get("kind") == "requeue"),
    }


def section(root: str, command: str = "") -> dict[str, Any]:
    """One run on a sandbox under ``root`` (started and stopped here), as ``--json`` writes
    it."""
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    feats = plan.detect_features(str(BIN / "ft_launcher"))
    lifecycle.up(root, nodes=4, timing="production", watch=True, timeout=180)
    try:
        row = measure(root)
    finally:
        lifecycle.down(root, quiet=True)
    took = row["fault_to_first_step_s"]
    met = took is not None and took < TARGET_S and row["lost_steps"] == 0 \
        and row["job_state"] == "COMPLETED" and not row["requeues"]
    print(f"NVRx {feats.version}: hard node loss with 1 spare ({row['via']}): first step "
          f"{took} s after the kill, {row['lost_steps']} lost steps, {row['cycles']} srun "
          f"step(s), {row['requeues']} requeues", flush=True)
    print(f"target fault to first step < {TARGET_S:g} s, 0 lost steps: "
          f"{'met' if met else 'NOT MET'}", flush=True)
    return {"section": "spare", "part": "hard node loss with a hot spare",
            "command": command or "bench/spare_standby.py", "started": started,
            "nvrx": feats.version, "nvrx_standbys": standby.native(feats.flags),
            "load_avg_at_start": [round(x, 2) for x in load0],
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "timing": "production", **row,
            "target": f"fault to first step < {TARGET_S:g} s, 0 lost steps", "met": met}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="rs-bench-spare-")
    os.chmod(root, 0o755)
    out = section(root, " ".join(["bench/spare_standby.py", *sys.argv[1:]]))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0 if out["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
