"""What resilient-launch's own start costs: batch script start -> first worker start, under
``exec resilient-launch`` and under the ``srun ft_launcher`` line a user writes by hand.

Jobs one at a time on 2 nodes of one sandbox: first resilient-launch with an empty feature
cache (what the first job of an install pays), then ABBA (ft_launcher, resilient-launch,
resilient-launch, ft_launcher) so a drift of the machine's load favours neither. The worker
only prints its start time (``time.time()``, the batch script's clock too) and exits, so the
figure is the launchers' start alone. The figure printed: resilient-launch's mean minus
ft_launcher's (the issue's bound: <= 1 s).

    python bench/launch_overhead.py [--dir /tmp/rs-bench-overhead] [--rounds 1] [--json OUT]

``--json OUT`` writes the figures, the command and when and at what load they were measured
(docs/benchmarks.md quotes ``bench/results/launch-overhead.json``).
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

BIN = Path(sys.executable).parent
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")
WORKER = "import time; print(f'[worker] t={time.time():.3f}', flush=True)\n"
BATCH_LINE = re.compile(r"^\[batch\] t=([\d.]+)", re.M)
WORKER_LINE = re.compile(r"^\[worker\] t=([\d.]+)", re.M)
RL, FT = "resilient-launch", "ft_launcher"
FLAGS = ["--ft-rank-heartbeat-timeout=60", "--ft-initial-rank-heartbeat-timeout=120",
         "--ft-enable-nic-monitor=false"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch_script(name: str, worker: Path) -> str:
    stamp = "echo \"[batch] t=$(date +%s.%N)\"\n"
    if name == RL:
        line = " ".join(["exec", str(BIN / "resilient-launch"), "--nproc-per-node=1",
                         "--heartbeat-timeout=60", "--initial-heartbeat-timeout=120",
                         "--max-restarts=0", str(worker)])
    else:
        line = " ".join(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                         str(BIN / "ft_launcher"), "--nnodes=2", "--nproc-per-node=1",
                         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_port()}",
                         "--rdzv-id=$SLURM_JOB_ID", "--max-restarts=0", *FLAGS, str(worker)])
    return f"#!/bin/bash\n{stamp}{line}\n"


def run_one(slurm: Any, conf: str, name: str, work: Path, cache: Path,
            timeout: float = 180) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    worker = work / "worker.py"
    worker.write_text(WORKER)
    batch = work / "job.sbatch"
    batch.write_text(batch_script(name, worker))
    env = {**os.environ, "SLURM_CONF": conf, "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "RESILIENT_CACHE_DIR": str(cache)}
    jid = slurm.submit(str(batch), ["--nodes=2", f"--output={work}/job.out",
                                    f"--chdir={work}", "--job-name=bench-overhead"], env=env)
    deadline = time.monotonic() + timeout
    state = slurm.job(jid).state
    while time.monotonic() < deadline and state not in TERMINAL:
        time.sleep(0.5)
        state = slurm.job(jid).state
    if state not in TERMINAL:
        slurm.cancel(jid)
    log = (work / "job.out").read_text() if (work / "job.out").exists() else ""
    start = BATCH_LINE.search(log)
    workers = [float(t) for t in WORKER_LINE.findall(log)]
    first = round(min(workers) - float(start.group(1)), 2) if start and workers else None
    return {"mechanism": name, "state": state, "first_worker_s": first}


def measure(slurm: Any, conf: str, work: Path, rounds: int = 1) -> dict[str, Any]:
    cache = work / "cache"
    cold = run_one(slurm, conf, RL, work / "cold", cache)
    runs = [run_one(slurm, conf, name, work / f"{r}-{i}-{name}", cache)
            for r in range(rounds) for i, name in enumerate((FT, RL, RL, FT))]
    out: dict[str, Any] = {"cold": cold, "runs": runs}
    for name in (RL, FT):
        got = [r["first_worker_s"] for r in runs if r["mechanism"] == name
               and r["first_worker_s"] is not None]
        out[name] = round(sum(got) / len(got), 2) if got else None
    out["overhead_s"] = round(out[RL] - out[FT], 2) \
        if out[RL] is not None and out[FT] is not None else None
    return out


def render(res: dict[str, Any]) -> str:
    each = ", ".join(f"{r['mechanism']} {r['first_worker_s']}" for r in res["runs"])
    return "\n".join([
        "batch start -> first worker start (s)",
        f"ft_launcher alone   {res[FT]}",
        f"resilient-launch    {res[RL]}   (first job of an install, empty feature cache: "
        f"{res['cold']['first_worker_s']})",
        f"resilient-launch's own start: {res['overhead_s']:+} s" if res["overhead_s"] is not None
        else "resilient-launch's own start: ? (a job failed)",
        f"runs: {each}"])


def save_json(path: str, data: dict[str, Any]) -> None:
    import json

    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="sandbox + work directory (default: a new temp)")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds")
    ap.add_argument("--json", default=None, help="write the figures here too")
    ns = ap.parse_args()
    from resilient_slurm.slurm import connect
    from resilient_slurm_lab.sandbox import lifecycle

    root = ns.dir or tempfile.mkdtemp(prefix="rs-bench-overhead-")
    paths = lifecycle.up(root, nodes=2)
    try:
        work = Path(root) / "work"
        work.mkdir(exist_ok=True)
        slurm = connect(conf=paths.conf, backend="cli", timeout=10)
        load = [round(x, 1) for x in os.getloadavg()]
        res = measure(slurm, paths.conf, work, ns.rounds)
        print(render(res))
        if ns.json:
            save_json(ns.json, {"command": " ".join(["bench/launch_overhead.py", *sys.argv[1:]]),
                                "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                "load_avg_at_start": load, **res})
    finally:
        lifecycle.down(root, quiet=True)
        if ns.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
