"""The fair comparison: every mechanism in one sandbox, one run, as the unprivileged job user.

Mechanisms (same model, steps, checkpoint interval and seeded fault schedule):

* ``srun-torchrun``: fault-free ``srun torchrun`` (``sbatch/fsdp-baseline.sbatch``): the
  reference for goodput, digest and resilient-launch's overhead;
* ``resilient-launch (no faults)``: ``sbatch/fsdp.sbatch`` without faults: the overhead;
* ``baseline``: ``srun torchrun`` + ``--requeue`` (``fsdp-baseline.sbatch``); a hang is caught
  by torch's collective timeout set to the heartbeat value; the figure at torch's default
  (30 min) is derived beside it (each hang waits the difference longer);
* ``ft_launcher``: ``srun ft_launcher`` inside the same requeue-on-failure batch script
  (``bench/jobs/ft-launcher.sbatch``);
* ``resilient-launch``: ``sbatch/fsdp.sbatch``;
* ``resilient-launch + tiers + 1 spare``: ``sbatch/fsdp.sbatch`` on one node more than the
  others (``resilient-launch --spares 1``: the same 3 training nodes and a hot spare) and
  ``train_fsdp.py --memory-tiers`` (a snapshot every step in node memory and on the next node:
  ``docs/checkpointing.md``; the sandbox's nodes share one host's ``/dev/shm``, so each node
  gets its own memory folder, and the harness's node fault deletes the lost node's: only the
  peer's copy can bring its rank back): the best path a user can take, issue 26's mechanism;
* ``resilient-launch --inprocess``: the same with the three recovery levels
  (``docs/inprocess.md``): ``train_fsdp.py --inprocess`` and ``--min-nodes 2`` (level 0 may
  shrink 3 ranks to 2 from the peer copy). Its soft timeout (a hang's detection) is the
  heartbeat timeout the others get, so no mechanism finds a hang sooner by configuration; its
  hard timeout is 10 s more, and level 1's heartbeat timeout ``INPROCESS_HB_MARGIN_S`` above
  that, as ``launcher/cycle/inprocess_plan.py`` requires;
* ``resilient-launch --inprocess + 1 spare``: the same on one node more (``--spares 1
  --inprocess``): every node runs a rank, the spare's stands by inside level 0 (torch
  imported, waiting in NVRx's Wrapper) and takes a lost rank's place in the live processes,
  the world size kept (``docs/inprocess.md``, "Hot spares in level 0").

Faults: exception, SIGKILL and hang fire inside the training (``--fault TYPE@STEP@rankN``; in a
job that shrank below rank N the fault is skipped, never moved onto another rank, and the row's
``fault_schedule`` says which and why: every table prints it as ``faults as seeded``); the
node fault is made by the harness as a GPU falling off the bus would be: the node's simulated
hardware turns bad (``xid79``, seen only by the root HealthCheckProgram) and the rank on it
dies, and a worker started there again fails at start (``bench/gated_train.py``). Nobody
announces it: each mechanism finds it by its own means. All eight jobs run at the same time on
disjoint nodes of one sandbox (one thread per rank), so the machine's load drifts alike for all
of them; the price is CPU contention: while one job waits (a requeue's ``cred_expire``) the
others get more of the 2 cores, and step times are longer than with one job alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
from harness import BIN, GATED_TRAIN, JOBS, REPO, Workload
from mechanisms import INPROCESS, INPROCESS_SPARE, SPARE, inprocess_env
from run_figures import step_median, swap_breakdown, tier_cost, timeline

from resilient_slurm.events import EventKind

TORCH_DEFAULT_PG_TIMEOUT_S = 1800  # torch.distributed default_pg_timeout (30 min)
MECHS = ("srun-torchrun", "resilient-launch (no faults)", "baseline", "ft_launcher",
         "resilient-launch", SPARE, INPROCESS, INPROCESS_SPARE)
SPARES = {SPARE: 1, INPROCESS_SPARE: 1}  # hot spares an allocation holds beyond the training's
LEVEL0 = (INPROCESS, INPROCESS_SPARE)  # the --inprocess mechanisms
INPROCESS_HARD_EXTRA_S = 10.0  # level 0's hard timeout = soft timeout (= heartbeat) + this
INPROCESS_HB_MARGIN_S = 15.0  # level 1's heartbeat timeout = hard timeout + this
FAULT_FREE = MECHS[:2]


@dataclass(frozen=True)
class Density:
    name: str
    workload: Workload


DENSITIES = {
    # today's: 5 faults in 60 steps (node@12, hang@22, sigkill@29, exception@36, sigkill@56)
    "dense": Density("dense", Workload(threads=1)),
    # one of each over 300 steps (seed 79 = sparse_seed(): the first with one of each type):
    # sigkill@140, node@190, exception@245, hang@285
    "sparse": Density("sparse", Workload(steps=300, checkpoint_every=20, fault_count=4,
                                         fault_seed=79, fault_weights="0.25,0.25,0.25,0.25",
                                         threads=1)),
}


def sparse_seed(steps: int = 300, world: int = 3, start: int = 0) -> int:
    """The first seed whose 4-fault schedule has one fault of each type, 30+ steps apart."""
    from resilient_slurm_lab.faults.injector import FAULT_TYPES, compute_schedule

    for seed in range(start, start + 10000):
        s = compute_schedule(4, seed, list(FAULT_TYPES), steps, world, [0.25] * 4)
        gaps = [b.step - a.step for a, b in zip(s, s[1:], strict=False)]
        if sorted(f.type for f in s) == sorted(FAULT_TYPES) and min(gaps) >= 30 \
                and s[0].step >= 30:
            return seed
    raise RuntimeError("no seed gives one fault of each type")


def workload(density: str) -> Workload:
    return DENSITIES[density].workload


def train_args(wl: Workload, ckpt: str, faults: bool, mech: str = "", hb: float = 20.0
               ) -> list[str]:
    """The training's arguments: the scheduled faults as targeted ones, the node fault left
    to the harness."""
    args = wl.train_args(ckpt, faults=False)
    if mech in LEVEL0:  # level 0's timeouts: script_and_env
        args += ["--inprocess"]
    if mech == SPARE:
        args += ["--memory-tiers"]
    if faults:
        for f in wl.schedule():
            if f.type != "node":
                args += ["--fault", f"{f.type}@{f.step}@rank{f.rank}"]
    return args


def script_and_env(mech: str, hb: float, events: str) -> tuple[Path, dict[str, str], str]:
    """Batch script, its environment and the events file to read for one mechanism."""
    env = {"TRAIN_SCRIPT": str(GATED_TRAIN), "PYTHON": str(BIN / "python")}
    if mech in LEVEL0:
        env.update(harness.resilient_env(hb + INPROCESS_HARD_EXTRA_S + INPROCESS_HB_MARGIN_S,
                                         min_nodes=2))
        env["RESILIENT_LAUNCH_ARGS"] += " --inprocess"
        env.update(inprocess_env(hb, hb + INPROCESS_HARD_EXTRA_S))
        if mech in SPARES:
            env["RESILIENT_LAUNCH_ARGS"] += f" --spares {SPARES[mech]}"
        return harness.FSDP_SBATCH, env, ""
    if mech.startswith("resilient-launch"):
        env.update(harness.resilient_env(hb))
        if mech in SPARES:
            env["RESILIENT_LAUNCH_ARGS"] = f"--spares {SPARES[mech]} " + \
                env["RESILIENT_LAUNCH_ARGS"]
        return harness.FSDP_SBATCH, env, ""  # events: <ckpt>/.resilient/events.jsonl
    env["RESILIENT_EVENTS_FILE"] = events
    if mech in ("srun-torchrun", "baseline"):
        env.update(RDZV_PORT=str(harness.free_port()), PG_TIMEOUT=f"{hb:g}",
                   BASELINE_MAX_REQUEUES="6")
        return REPO / "sbatch" / "fsdp-baseline.sbatch", env, events
    env.update(RDZV_PORT=str(harness.free_port()), FT_HB_TIMEOUT=f"{hb:g}",
               FT_MAX_REQUEUES="6")
    return JOBS / "ft-launcher.sbatch", env, events


AGENTS = (b"torchrun", b"ft_launcher", b"torch.distributed.run")


def worker_pids(jid: int, node: str, script: str = "gated_train.py") -> list[int]:
    """The training workers of job ``jid`` on ``node``: processes whose Python runs ``script``
    and whose parent is the elastic agent (torchrun / ft_launcher). A GPU that falls off the
    bus kills the process that uses it, not the processes it forked that never touch the GPU
    (NVRx's in-process monitor, a daemon forked from the worker, keeps running to report the
    death, as it would on a cluster)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(script.encode()) for a in argv[1:3]):
                continue
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            ppid = Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()[1]
            parent = Path(f"/proc/{int(ppid)}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if f"SLURM_JOB_ID={jid}".encode() in env and f"SLURMD_NODENAME={node}".encode() in env \
                and any(a in parent for a in AGENTS):
            out.append(int(d))
    return out


@dataclass
class NodeFault:
    """The harness's node fault for one job: at ``step`` the node's hardware turns bad and the
    worker on it dies (as with a GPU lost under a running CUDA process)."""

    cluster: harness.Cluster
    jid: int
    step: int
    events: str
    lost_dir: str
    script: str = "gated_train.py"
    fired: dict[str, Any] | None = None
    memory: str = ""  # the job's node-memory folder, "{node}" for the node ("": none)

    def poll(self) -> None:
        if self.fired is not None or not os.path.exists(self.events):
            return
        events = list(harness.read_events(self.events))
        high = max((int(e["step"]) for e in events
                    if e.get("kind") == EventKind.PROGRESS and isinstance(e.get("step"), int)),
                   default=0)
        if high < self.step:
            return
        job = self.cluster.slurm.job(self.jid)
        batch = job.extra.get("batch_host")
        # --inprocess --spares: a standby's rank does not train; a GPU lost there would cost
        # the training nothing (the training's latest resume names the standbys)
        standby = next((set(e.get("standby_nodes") or []) for e in reversed(events)
                        if e.get("kind") == EventKind.RESUME
                        and e.get("source") == "training"), set())
        others = [n for n in job.nodes if n != batch and n not in standby]
        # A node that runs a worker now: after an in-process shrink a node of the allocation
        # may have none, and a GPU lost there would cost the training nothing.
        node = next((n for n in reversed(others) if worker_pids(self.jid, n, self.script)),
                    others[-1])
        from resilient_slurm_lab.hardware.simulate import install_scenario

        Path(self.lost_dir, node).touch()
        if self.memory:  # a lost node's memory is gone with it (the sandbox shares one host)
            shutil.rmtree(self.memory.format(node=node), ignore_errors=True)
        install_scenario(os.path.join(self.cluster.root, "nodes", node), "xid79")
        pids = worker_pids(self.jid, node, self.script)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.fired = {"ts": time.time(), "kind": EventKind.FAULT, "source": "training",
                      "type": "node", "step": high, "node": node, "rank": None, "killed": len(pids)}


@dataclass
class Job:
    mech: str
    jid: int
    events: str
    work: str
    submitted: float
    bound: float
    node_fault: NodeFault | None = None
    state: str = "?"
    timed_out: bool = False
    ended: float = 0.0
    info: Any = None  # the job as last seen while it ran (Slurm forgets it MinJobAge later)


def submit(c: harness.Cluster, mech: str, wl: Workload, base: str, hb: float, lost_dir: str,
           bound: float) -> Job:
    from resilient_slurm_lab.sandbox import lifecycle

    d = os.path.join(base, mech.replace(" ", "-").replace("(", "").replace(")", ""))
    lifecycle.make_user_dir(d, lifecycle.job_user(c.root), mode=0o755)
    ckpt = os.path.join(d, "ckpt")
    faults = mech not in FAULT_FREE
    script, env, events = script_and_env(mech, hb, os.path.join(d, "events.jsonl"))
    if not events:
        events = os.path.join(ckpt, ".resilient", "events.jsonl")
        verdicts = os.path.join(c.root, "verdicts", "{node}.json")
        env["RESILIENT_LAUNCH_ARGS"] += f" --verdict-path {verdicts}"
    env.update(BENCH_GPU_LOST_DIR=lost_dir, RESILIENT_SANDBOX_DIR=c.root)
    memory = ""
    if mech in SPARES or mech in LEVEL0:  # memory tiers (--inprocess keeps its state
        # there too); the sandbox's nodes share this host's /dev/shm: a folder per node (its
        # TaskProlog sets RESILIENT_TIER1_DIR from this template)
        memory = env["RESILIENT_SANDBOX_TIER1_DIR"] = os.path.join(d, "shm", "{node}")
    t = time.time()
    jid = c.submit_as_user(script, train_args(wl, ckpt, faults, mech, hb),
                           os.path.join(d, "slurm-%j.out"), env,
                           nodes=wl.nodes + SPARES.get(mech, 0))
    job = Job(mech, jid, events, d, t, bound)
    node = [f for f in wl.schedule() if f.type == "node"] if faults else []
    if node:
        job.node_fault = NodeFault(c, jid, node[0].step, events, lost_dir, memory=memory)
    print(f"[{harness.stamp()}] {mech}: job {jid} ({script.relative_to(REPO)}), bound "
          f"{bound:.0f} s", flush=True)
    return job


def wait_all(c: harness.Cluster, jobs: list[Job]) -> None:
    """Poll every job (and fire its node fault) until each ends or passes its bound."""
    while any(not j.ended for j in jobs):
        for j in jobs:
            if j.ended:
                continue
            if j.node_fault is not None:
                j.node_fault.poll()
            try:
                j.info = c.slurm.job(j.jid)
                j.state = j.info.state
            except Exception:  # noqa: BLE001 - a busy or stalled controller: ask again
                continue
            if j.state in harness.TERMINAL:
                j.ended = time.time()
                print(f"[{harness.stamp()}] {j.mech}: {j.state} after "
                      f"{j.ended - j.submitted:.0f} s", flush=True)
            elif time.time() - j.submitted > j.bound:
                c.slurm.cancel(j.jid)
                j.timed_out, j.ended = True, time.time()
                print(f"[{harness.stamp()}] {j.mech}: time bound hit, cancelled", flush=True)
        time.sleep(1)


def summarize(_c: harness.Cluster, j: Job, wl: Workload, hb: float) -> dict[str, Any]:
    extra = [j.node_fault.fired] if j.node_fault and j.node_fault.fired else []
    sched = wl.schedule() if j.mech not in FAULT_FREE else []
    info = j.info  # never ask Slurm after the end: it forgets finished jobs after MinJobAge
    r = harness.summarize(j.mech, j.jid, j.events, j.state, j.timed_out, j.ended - j.submitted,
                          sched, info.restart_count if info else -1,
                          sorted(info.excluded) if info else [],
                          submitted=j.submitted, extra=extra)
    out = {**asdict(r), "outcomes": harness.outcome_order(r),
           "timeline": timeline(j.events, j.submitted, extra),
           "step_s_median": step_median(j.events)}
    if j.mech == SPARE:
        out["swap"] = swap_breakdown([*harness.read_events(j.events), *extra]
                                     if os.path.exists(j.events) else extra)
    if j.mech == "baseline":
        hangs = sum(1 for f in r.faults if f["type"] == "hang")
        extra_wait = hangs * (TORCH_DEFAULT_PG_TIMEOUT_S - hb)
        wall = r.wall_s + extra_wait
        out["at_torch_default"] = {
            "derived": True, "pg_timeout_s": TORCH_DEFAULT_PG_TIMEOUT_S, "hangs": hangs,
            "wall_s": round(wall, 1),
            "goodput": round(r.productive_s / wall, 4) if wall > 0 else 0.0,
            "how": f"measured wall + {hangs} hang(s) x ({TORCH_DEFAULT_PG_TIMEOUT_S} - {hb:g}) s"}
    return out


def run(profile: str, density: str, work: str, hb: float = 20.0, nodes: int = 29,
        mechs: tuple[str, ...] = MECHS) -> dict[str, Any]:
    """All eight mechanisms at the same time, on disjoint nodes of one sandbox (26 nodes for
    the jobs: 3 each, 4 for the two with a hot spare; 3 free nodes for requeues)."""
    wl = workload(density)
    prod = profile == "production"
    bounds = {"srun-torchrun": 1500, "resilient-launch (no faults)": 1500,
              "baseline": 2400 if prod else 1200, "ft_launcher": 1800 if prod else 900,
              "resilient-launch": 1500 if prod else 720, INPROCESS: 1500 if prod else 720,
              SPARE: 1500 if prod else 720, INPROCESS_SPARE: 1500 if prod else 720}
    res: dict[str, Any] = {
        "section": f"compare-{profile}-{density}", "profile": profile, "density": density,
        "workload": asdict(wl), "schedule": harness.describe_schedule(wl.schedule()),
        "schedule_list": [f"{f.type}@{f.step}" for f in wl.schedule()],
        "settings": {"heartbeat_timeout_s": hb, "baseline_pg_timeout_s": hb,
                     "torch_default_pg_timeout_s": TORCH_DEFAULT_PG_TIMEOUT_S,
                     "sandbox_nodes": nodes, "job_user": True, "bound_s": bounds,
                     "inprocess": {"soft_timeout_s": hb,
                                   "hard_timeout_s": hb + INPROCESS_HARD_EXTRA_S,
                                   "heartbeat_timeout_s": hb + INPROCESS_HARD_EXTRA_S
                                   + INPROCESS_HB_MARGIN_S, "min_nodes": 2},
                     "order": f"all {len(mechs)} jobs at the same time on disjoint nodes, 1 "
                              "thread per rank", "spares": dict(SPARES)},
        "load_avg_at_start": [round(x, 1) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": []}
    root = os.path.join(work, "sandbox")
    with harness.sandbox(root, nodes=nodes, timing=profile) as c:
        from resilient_slurm_lab.sandbox import lifecycle

        res["timing"] = asdict(lifecycle.sandbox_timing(root))
        lost = os.path.join(work, "gpu-lost")
        os.makedirs(lost, exist_ok=True)
        os.chmod(lost, 0o755)
        base = os.path.join(lifecycle.job_user(root).work_dir, "bench")
        lifecycle.make_user_dir(base, lifecycle.job_user(root), mode=0o755)
        for group in (mechs,):  # a subset only to look at one mechanism, never for figures
            jobs = [submit(c, m, wl, base, hb, lost, bounds[m]) for m in group]
            wait_all(c, jobs)
            res["runs"] += [summarize(c, j, wl, hb) for j in jobs]
            ev = {j.mech: j.events for j in jobs}
            res["tier_cost"] = {m: tier_cost(ev[m], ev[FAULT_FREE[1]])
                                for m in SPARES if m in ev and FAULT_FREE[1] in ev}
        res["memory"] = lifecycle.memory_summary(root)
    res["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return res
