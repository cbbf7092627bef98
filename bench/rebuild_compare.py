"""Rebuild a comparison section from what its run left on disk, when the harness died before
writing it (once: the production run of this session, whose summary asked Slurm about jobs it
had already forgotten). Nothing is re-measured: submission and end are slurmctld's own log
times, faults and steps the jobs' event files, the node fault the time the harness marked the
node's GPU lost (the mtime of ``gpu-lost/<node>``), requeues the batch scripts' own lines.

    python bench/rebuild_compare.py WORK/compare-production-sparse production sparse \
        --started "[13.6, 17.2, 24.8]" --ended "[8.1, 10.0, 16.8]"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402
import harness  # noqa: E402
import run_figures  # noqa: E402
from render import render_all  # noqa: E402

from resilient_slurm.events import EventKind  # noqa: E402
from resilient_slurm.slurm import expand  # noqa: E402

STAMP = re.compile(r"^\[(\S+)\] (.*)$")


def ctld_times(log: str) -> tuple[dict[int, float], dict[int, float]]:
    sub, end = {}, {}
    for line in open(log, encoding="utf-8", errors="replace"):
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc).timestamp()
        if (s := re.search(r"_slurm_rpc_submit_batch_job: JobId=(\d+)", m.group(2))):
            sub.setdefault(int(s.group(1)), t)
        elif (s := re.search(r"_job_complete: JobId=(\d+) done", m.group(2))):
            end[int(s.group(1))] = t
    return sub, end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work")
    ap.add_argument("profile")
    ap.add_argument("density")
    ap.add_argument("--hb", type=float, default=20.0)
    ap.add_argument("--started", default="null", help="load averages at start (JSON list)")
    ap.add_argument("--ended", default="null", help="load averages at end (JSON list)")
    ap.add_argument("--out", default=str(harness.REPO / "bench" / "results"))
    a = ap.parse_args()
    wl = compare.workload(a.density)
    root = os.path.join(a.work, "sandbox")
    sub, end = ctld_times(os.path.join(root, "log", "slurmctld.log"))
    base = os.path.join(root, "users", "rsjob", "bench")
    lost = {p.name: p.stat().st_mtime for p in Path(a.work, "gpu-lost").iterdir()}
    runs = []
    for jid, mech in enumerate(compare.MECHS, start=1):
        d = os.path.join(base, mech.replace(" ", "-").replace("(", "").replace(")", ""))
        events = os.path.join(d, "events.jsonl")
        if mech.startswith("resilient-launch"):
            events = os.path.join(d, "ckpt", ".resilient", "events.jsonl")
        log = Path(d, f"slurm-{jid}.out").read_text(errors="replace")
        nodes = {n for m in re.finditer(r"nodes (\S+)", log) for n in expand(m.group(1))}
        extra = []
        for node, ts in lost.items():
            if node in nodes and mech not in compare.FAULT_FREE:
                steps = [int(e["step"]) for e in harness.read_events(events)
                         if e.get("kind") == EventKind.PROGRESS and float(e["ts"]) <= ts]
                extra.append({"ts": ts, "kind": EventKind.FAULT, "source": "training",
                              "type": "node", "step": max(steps, default=0), "node": node,
                              "rank": None})
        requeues = max((int(x) for x in re.findall(r"\] job \d+ restart (\d+)", log)), default=0)
        excluded = sorted({n for e in harness.read_events(events)
                           if e.get("kind") == EventKind.REQUEUE for n in e.get("excluded") or []})
        sched = wl.schedule() if mech not in compare.FAULT_FREE else []
        r = harness.summarize(mech, jid, events, "COMPLETED", False, end[jid] - sub[jid], sched,
                              requeues, excluded, submitted=sub[jid], extra=extra)
        out: dict[str, Any] = {**compare.asdict(r), "outcomes": harness.outcome_order(r),
                               "timeline": run_figures.timeline(events, sub[jid], extra)}
        if mech == "baseline":
            hangs = sum(1 for f in r.faults if f["type"] == "hang")
            wall = r.wall_s + hangs * (compare.TORCH_DEFAULT_PG_TIMEOUT_S - a.hb)
            out["at_torch_default"] = {
                "derived": True, "pg_timeout_s": compare.TORCH_DEFAULT_PG_TIMEOUT_S,
                "hangs": hangs, "wall_s": round(wall, 1),
                "goodput": round(r.productive_s / wall, 4) if wall > 0 else 0.0,
                "how": f"measured wall + {hangs} hang(s) x "
                       f"({compare.TORCH_DEFAULT_PG_TIMEOUT_S} - {a.hb:g}) s"}
        runs.append(out)
    from resilient_slurm_lab.sandbox import lifecycle

    fmt = "%Y-%m-%dT%H:%M:%S+0000"
    res = {"section": f"compare-{a.profile}-{a.density}", "profile": a.profile,
           "density": a.density, "workload": compare.asdict(wl),
           "schedule": harness.describe_schedule(wl.schedule()),
           "schedule_list": [f"{f.type}@{f.step}" for f in wl.schedule()],
           "settings": {"heartbeat_timeout_s": a.hb, "baseline_pg_timeout_s": a.hb,
                        "torch_default_pg_timeout_s": compare.TORCH_DEFAULT_PG_TIMEOUT_S,
                        "sandbox_nodes": 18, "job_user": True,
                        "order": "all 5 jobs at the same time on disjoint nodes, 1 thread per "
                                 "rank"},
           "timing": compare.asdict(lifecycle.sandbox_timing(root)),
           "load_avg_at_start": json.loads(a.started), "load_avg_at_end": json.loads(a.ended),
           "started": time.strftime(fmt, time.gmtime(min(sub.values()))),
           "finished": time.strftime(fmt, time.gmtime(max(end.values()))),
           "rebuilt": "from the run's event files, slurmctld.log and gpu-lost marks by "
                      "bench/rebuild_compare.py (the harness died at its summary)",
           "runs": runs}
    out = Path(a.out)
    (out / f"{res['section']}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    render_all(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
