"""In-process restart (level 0) on the sandbox, under resilient-launch: recovery per fault.

The issue's bounds are for ``resilient-launch --inprocess`` on the real Slurm sandbox, so this
runs exactly that: a 3-node sandbox (``--timing``, default ``fast``), jobs of the unprivileged
job user, ``sbatch/fsdp.sbatch`` with ``--inprocess --min-nodes 2`` around
``train_fsdp.py --inprocess`` (level 0's timeouts set for the sandbox: soft 4 s, hard 20 s;
NVRx's own are 60 / 90 s), one job per fault, each fault at
step 7 of 16: an exception (rank 1), a hang of the main thread in a syscall (rank 2) and a
SIGKILL of rank 0 (level 0 shrinks 3 ranks to 2 from the peer copy), after a fault-free job.

Per fault it prints the time from the ``fault`` event to the first step completed after the
in-process restart (``recovered``), the steps lost, whether a rank was killed, and whether the
final digest equals the fault-free job's, against the targets (exception < 2 s, hang < soft
timeout + 2 s, SIGKILL < 3 s). Every figure scales with CPU contention: the load average is
printed; run it on an idle machine for the targets. Writes ``bench/results/inprocess.json``.

    .venv/bin/python bench/inprocess_sandbox.py [--repeat 2] [--timing fast]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from mechanisms import inprocess_env  # noqa: E402

SOFT, HARD = 4.0, 20.0
TARGETS = {"exception": 2.0, "hang": SOFT + 2.0, "sigkill": 3.0}
FAULTS = (("exception", "rank1"), ("hang", "rank2"), ("sigkill", "rank0"))
FAULT_STEP, STEPS = 7, 16


def run_job(c: harness.Cluster, base: str, name: str, fault: str | None) -> dict[str, Any]:
    from resilient_slurm.events import read_events
    from resilient_slurm_lab.sandbox import lifecycle

    d = os.path.join(base, name)
    lifecycle.make_user_dir(d, lifecycle.job_user(c.root), mode=0o755)
    ckpt = os.path.join(d, "ckpt")
    env = {**harness.resilient_env(40.0, min_nodes=2), "PYTHON": str(harness.BIN / "python"),
           "TRAIN_SCRIPT": str(harness.FAULTS_TRAIN),  # the example, with --fault
           "FT_INITIAL_HB_TIMEOUT": "180",
           # the memory tiers: a folder per simulated node (they share this host's /dev/shm)
           "RESILIENT_SANDBOX_TIER1_DIR": os.path.join(d, "shm", "{node}")}
    env["RESILIENT_LAUNCH_ARGS"] += " --inprocess"
    env.update(inprocess_env(SOFT, HARD))  # level 0's, explicit (default: NVRx's)
    args = ["--inprocess", "--steps", str(STEPS), "--checkpoint-dir", ckpt,
            "--checkpoint-every", "5", "--threads", "1", "--log-every", "1",
            "--step-sleep", "0.2"]
    if fault:
        args += ["--fault", fault]
    jid = c.submit_as_user(harness.FSDP_SBATCH, args, os.path.join(d, "slurm-%j.out"), env)
    state, timed_out = c.wait(jid, 600)
    out = Path(d, f"slurm-{jid}.out").read_text(errors="replace")
    events = list(read_events(os.path.join(ckpt, ".resilient", "events.jsonl")))
    digest = re.findall(r"weights digest: ([0-9a-f]{64})", out)
    row: dict[str, Any] = {"job": jid, "state": state, "timed_out": timed_out,
                           "digest": digest[-1] if digest else None,
                           "cycles": sum(1 for e in events if e.get("kind") == "cycle_start")}
    fired = [e for e in events if e.get("kind") == "fault" and e.get("source") == "training"]
    if fault and fired:
        t = float(fired[0]["ts"])
        resumes = [e for e in events if e.get("kind") == "resume" and
                   e.get("level") == "inprocess" and float(e["ts"]) >= t]
        rec = [e for e in events if e.get("kind") == "recovered" and resumes
               and e.get("iteration") == resumes[0].get("iteration")]
        row.update(recovery_s=round(float(rec[0]["ts"]) - t, 2) if rec else None,
                   lost_steps=(FAULT_STEP - 1) - int(resumes[0]["step"]) if resumes else None,
                   lost_ranks=resumes[0].get("lost_ranks") if resumes else None,
                   level1_restarts=sum(1 for e in events if e.get("kind") == "resume" and
                                       e.get("restart") not in (None, "0")))
    return row


def measure(work: str, repeat: int = 1, timing: str = "fast") -> dict[str, Any]:
    """The section: a fault-free job, then each fault ``repeat`` times (printed as it goes)."""
    from resilient_slurm_lab.sandbox import lifecycle

    result: dict[str, Any] = {"section": "inprocess", "timing": timing,
                              "targets_s": TARGETS, "soft_timeout_s": SOFT,
                              "hard_timeout_s": HARD, "fault_step": FAULT_STEP, "steps": STEPS,
                              "load_avg_at_start": [round(x, 1) for x in os.getloadavg()],
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with harness.sandbox(os.path.join(work, "sandbox"), nodes=3, timing=timing) as c:
        base = os.path.join(lifecycle.job_user(c.root).work_dir, "inprocess")
        lifecycle.make_user_dir(base, lifecycle.job_user(c.root), mode=0o755)
        free = run_job(c, base, "fault-free", None)
        result["fault_free"] = free
        print(f"fault-free: {free['state']}, digest {free['digest']}", flush=True)
        print("\nfault      | recovery s (target) | lost steps | lost ranks | level 1 | "
              "digest equal")
        for i in range(repeat):
            for kind, where in FAULTS:
                c.reset_nodes()
                row = run_job(c, base, f"{kind}-{i}", f"{kind}@{FAULT_STEP}@{where}")
                row.update(fault=kind, where=where,
                           digest_equal=row["digest"] is not None
                           and row["digest"] == free["digest"])
                secs = row.get("recovery_s")
                row["met"] = secs is not None and secs < TARGETS[kind] \
                    and row.get("lost_steps") == 0 and row["digest_equal"]
                result["runs"].append(row)
                shown = "none" if secs is None else f"{secs:.2f}"
                print(f"  {kind:<9}| {shown} ({TARGETS[kind]:g}) "
                      f"{'met' if row['met'] else 'NOT MET'} | {row.get('lost_steps')} | "
                      f"{row.get('lost_ranks')} | {row.get('level1_restarts')} | "
                      f"{row['digest_equal']}", flush=True)
    result["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"load average at end: {os.getloadavg()}")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--timing", default="fast", choices=["fast", "production"])
    p.add_argument("--out", default=str(harness.REPO / "bench" / "results" / "inprocess.json"))
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="rs-bench-inprocess-")
    os.chmod(work, 0o755)
    try:
        result = measure(work, args.repeat, args.timing)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
