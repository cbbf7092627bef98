"""The cost curve in nodes: how resilient-launch's costs grow with the job's size.

Per size N (a sandbox of N + 1 nodes, one spare), two jobs of ``bench/light_worker.py`` (NVRx
heartbeats and step reports, no model) under ``resilient-launch`` as the job user:

* ``in-allocation`` (``--min-nodes N-1``): submission -> first step; the hooks' controller
  RPCs (``sdiag``: node, partition and job queries and node updates, less every RPC of the job
  user; the harness sleeps through the window) per healthy node per health interval, over a
  healthy window of two intervals; the launcher's own RPCs (all RPCs of the job user, by
  type in ``by_type``) per interval in the same window; then a
  node fault (simulated GPU lost, the worker there killed, a restart there fails) and from it:
  the launcher's blame (evidence gathered: the verdict the HealthCheckProgram published) and
  the first step after the elastic relaunch without the node;
* ``by requeue`` (``--min-nodes N``): the same fault; fault -> the first step after the
  requeue onto the spare node (``cred_expire`` of the timing profile included).

Everything runs on one host, so per-node work that a cluster does in parallel (N slurmd, N
ft_launchers importing torch) here shares the host's cores: a growth measured here is an upper
bound on the software's own growth.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import harness
from compare import NodeFault
from harness import BIN, REPO

from resilient_slurm.events import EventKind

LIGHT = REPO / "bench" / "light_worker.py"
QUERY_TYPES = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_UPDATE_NODE",
               "REQUEST_PARTITION_INFO", "REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE")


def _events(path: str) -> list[dict[str, Any]]:
    return sorted(harness.read_events(path), key=lambda e: float(e.get("ts", 0))) \
        if os.path.exists(path) else []


def _first(evs: list[dict[str, Any]], after: float, kind: str, **match: Any) -> float | None:
    for e in evs:
        if float(e.get("ts", 0)) > after and e.get("kind") == kind and all(
                e.get(k) == v for k, v in match.items()):
            return float(e["ts"])
    return None


def one_job(c: harness.Cluster, n: int, mode: str, base: str, lost: str, hb: float,
            fault_step: int, window_s: float, bound: float) -> dict[str, Any]:
    from resilient_slurm_lab.sandbox import lifecycle

    user = lifecycle.job_user(c.root)
    d = os.path.join(base, f"{n}-{mode.replace(' ', '-')}")
    lifecycle.make_user_dir(d, user, mode=0o755)
    ckpt = os.path.join(d, "ckpt")
    events = os.path.join(ckpt, ".resilient", "events.jsonl")
    min_nodes = n - 1 if mode == "in-allocation" else n
    script = os.path.join(d, "job.sbatch")
    argv = [str(BIN / "resilient-launch"), "--nproc-per-node=1", "--max-restarts=3",
            f"--heartbeat-timeout={hb:g}", "--initial-heartbeat-timeout=600",
            "--term-timeout=10", f"--min-nodes={min_nodes}", "--max-requeues=2",
            f"--verdict-path={os.path.join(c.root, 'verdicts', '{node}.json')}",
            f"--checkpoint-dir={ckpt}", str(LIGHT), "--steps=100000",
            "--step-time=0.5", f"--checkpoint-dir={ckpt}"]
    Path(script).write_text("#!/bin/bash\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"
                            "exec " + shlex.join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    out: dict[str, Any] = {"nodes": n, "mode": mode}
    t_sub = time.time()
    jid = c.submit_as_user(Path(script), [], os.path.join(d, "slurm-%j.out"),
                           {"BENCH_GPU_LOST_DIR": lost}, nodes=n)
    out["job"] = jid
    fault = NodeFault(c, jid, 10**9, events, lost, script=LIGHT.name)
    deadline = t_sub + bound
    first = None
    while time.time() < deadline and first is None:
        first = _first(_events(events), 0, EventKind.PROGRESS)
        time.sleep(0.5)
    if first is None:
        c.slurm.cancel(jid)
        out["error"] = "no first step within the bound"
        return out
    out["submit_to_first_step_s"] = round(first - t_sub, 1)
    if mode == "in-allocation":
        interval = lifecycle.sandbox_timing(c.root).health_interval
        with lifecycle.rpc_window(c.root) as w:
            time.sleep(window_s)
        # sdiag counts by type and by user, not both: the hooks (root) share the query types
        # with the launcher (the job user), so the hooks' share is the query RPCs less every
        # RPC of the job user (all of whose RPCs are queries or its own requeue/update)
        query = sum(w.delta.by_type.get(t, 0) for t in QUERY_TYPES)
        hooks = max(0, query - w.delta.by_user.get(user.name, 0))
        out["rpc"] = {"window_s": window_s, "health_interval_s": interval,
                      "by_type": dict(w.delta.by_type), "by_user": dict(w.delta.by_user),
                      "hooks_node_rpcs": hooks,
                      "hooks_per_node_per_interval": round(hooks / (n * window_s / interval), 4),
                      "job_user_per_interval": round(
                          w.delta.by_user.get(user.name, 0) / (window_s / interval), 2)}
    high = max(int(e["step"]) for e in _events(events) if e.get("kind") == EventKind.PROGRESS)
    fault.step = high + fault_step
    while time.time() < deadline and fault.fired is None:
        fault.poll()
        time.sleep(0.2)
    if fault.fired is None:
        c.slurm.cancel(jid)
        out["error"] = "fault never fired"
        return out
    t_f = float(fault.fired["ts"])
    out["fault_node"] = fault.fired["node"]
    resumed = blame = None
    while time.time() < deadline and resumed is None:
        evs = _events(events)
        blame = blame or _first(evs, t_f, EventKind.BLAME)
        # recovered = the first step after the relaunch without the node (elastic) or after the
        # requeue; an in-job restart on the same nodes before that does not count (rank 0 of
        # the light worker, having no collectives, steps on while the bad node's rank fails)
        moved = _first(evs, t_f, EventKind.EXCLUDE) or _first(evs, t_f, EventKind.REQUEUE)
        back = _first(evs, moved, EventKind.RESUME, source="training") if moved else None
        resumed = _first(evs, back, EventKind.PROGRESS) if back else None
        time.sleep(0.5)
    evs = _events(events)
    out["fault_to_blame_s"] = round(blame - t_f, 1) if blame else None
    out["fault_to_resumed_s"] = round(resumed - t_f, 1) if resumed else None
    out["recovery"] = ("requeue" if any(e.get("kind") == EventKind.REQUEUE for e in evs) else
                       "elastic" if any(e.get("kind") == EventKind.EXCLUDE for e in evs) else "?")
    c.slurm.cancel(jid)
    end = time.time() + 60
    while time.time() < end and c.slurm.job(jid).state not in harness.TERMINAL:
        time.sleep(1)
    return out


def run(sizes: list[int], profile: str, work: str, hb: float = 20.0,
        saved: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every size in turn; ``saved`` gets the results so far after each size."""
    from resilient_slurm_lab.sandbox import lifecycle

    res: dict[str, Any] = {"section": "cost-curve", "profile": profile,
                           "heartbeat_timeout_s": hb, "points": [],
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "load_avg_at_start": [round(x, 1) for x in os.getloadavg()]}
    for n in sizes:
        root = os.path.join(work, f"sandbox-{n}")
        t0 = time.time()
        with harness.sandbox(root, nodes=n + 1, timing=profile) as c:
            up_s = time.time() - t0
            lost = os.path.join(work, f"gpu-lost-{n}")
            os.makedirs(lost, exist_ok=True)
            os.chmod(lost, 0o755)
            base = os.path.join(lifecycle.job_user(root).work_dir, "curve")
            lifecycle.make_user_dir(base, lifecycle.job_user(root), mode=0o755)
            interval = lifecycle.sandbox_timing(root).health_interval
            point: dict[str, Any] = {"nodes": n, "sandbox_up_s": round(up_s, 1),
                                     "timing": asdict(lifecycle.sandbox_timing(root)),
                                     "load_avg": round(os.getloadavg()[0], 1)}
            for mode in ("in-allocation", "by requeue"):
                c.reset_nodes(timeout=120)
                for f in os.listdir(lost):
                    os.unlink(os.path.join(lost, f))
                r = one_job(c, n, mode, base, lost, hb, 6, 2 * interval, 900)
                print(f"[{harness.stamp()}] cost curve N={n} {mode}: {r}", flush=True)
                point[mode] = r
            point["memory"] = lifecycle.memory_summary(root)
        res["points"].append(point)
        if saved is not None:
            saved(res)
    res["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return res
