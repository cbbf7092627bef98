"""``make demo``: FSDP training surviving five seeded faults on a local 4-node Slurm cluster.

1. starts a 4-node sandbox with the hooks (prolog, epilog, HealthCheckProgram every 10 s);
2. submits ``sbatch/fsdp.sbatch`` on all 4 nodes (``resilient-launch --spares 1``: 3 training
   nodes and a hot spare; CPU, gloo; ``train_fsdp.py --memory-tiers``: a snapshot every step in
   node memory and on a peer node) with a seeded schedule of 5 faults: an exception, a hang,
   SIGKILLs and a node fault (simulated Xid 79, then the process dies), which the spare takes
   over inside the allocation;
3. follows the job live (steps, faults, restarts, drains, blame, exclusion, requeue);
4. prints the report (timeline, what handled each fault, goodput) and writes its plot;
5. shows ``sinfo -R`` (the drained node) and the job's excluded nodes;
6. compares the final weights digest with a fault-free run of the same training, run alongside
   (3 local processes, same world size, seed and threads);
7. repairs the node, runs a second job through the same faults, and ends with the fleet
   ledger of both jobs (``resilient-slurm fleet``: the node behind the most lost GPU-hours,
   per node and fault class) and the path of its HTML page; the sandbox runs Debian's
   Prometheus and node_exporter beside it (``sandbox up --metrics``), fed by the hooks and
   both jobs (``--metrics-dir``), and the alerts firing are listed;
8. brings the sandbox down, also when stopped (SIGTERM, SIGINT, SIGHUP: a killed ``make demo``):
   then the fault-free run is ended too and the exit code is 128 + the signal's number.

Usage: ``python scripts/demo.py [--dir DIR] [--plot FILE.png] [--bound SECONDS]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import harness  # noqa: E402
import stopping  # noqa: E402
from harness import BIN, TRAIN_SCRIPT, Workload  # noqa: E402

from resilient_slurm_lab.sandbox import prom  # noqa: E402


def say(msg: str = "") -> None:
    print(msg, flush=True)


def start_reference(wl: Workload, d: str) -> list[subprocess.Popen[bytes]]:
    """The fault-free run: 3 plain processes (one rank each, like 3 nodes x 1 rank), niced."""
    os.makedirs(d, exist_ok=True)
    port = harness.free_port()
    procs = []
    for rank in range(wl.nodes):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(wl.nodes),
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        env.pop("RESILIENT_EVENTS_FILE", None)
        log = open(os.path.join(d, f"rank{rank}.log"), "wb")  # noqa: SIM115 - child owns it
        procs.append(subprocess.Popen(
            ["nice", "-n", "10", str(BIN / "python"), str(TRAIN_SCRIPT),
             *wl.train_args(os.path.join(d, "ckpt"), faults=False)],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


@contextlib.contextmanager
def ended_on_exit(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """Whatever of ``procs`` still runs on the way out (a stop, an error) is killed."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def reference_digest(procs: list[subprocess.Popen[bytes]], d: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for line in Path(d, "rank0.log").read_text(errors="replace").splitlines():
        if line.startswith("weights digest: "):
            return line.split(": ", 1)[1].strip()
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="sandbox and run directory (default: temp)")
    ap.add_argument("--plot", default=None, help="progress plot PNG (default: DIR/progress.png)")
    ap.add_argument("--bound", type=float, default=480, help="time bound for the job (s)")
    a = ap.parse_args()
    stopping.exit_on_signals()
    t_start = time.time()
    try:
        return run(a, t_start)
    except stopping.Stopped as stop:
        say(f"[{harness.stamp()}] demo stopped by {stop.signame}: sandbox down, "
            f"exit {stop.code}")
        return int(stop.code or 1)


def run(a: argparse.Namespace, t_start: float) -> int:
    """The demo's steps (the module doc); the sandbox comes down on every way out."""
    wl = Workload()
    schedule = wl.schedule()
    types = {f.type for f in schedule}
    if not {"exception", "hang", "sigkill", "node"} <= types:
        say(f"demo: seed {wl.fault_seed} lacks a fault type: {harness.describe_schedule(schedule)}")
        return 2
    work = a.dir or tempfile.mkdtemp(prefix="rs-demo-")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)  # munged runs as user munge and must reach the sandbox below
    plot_path = a.plot or os.path.join(work, "progress.png")
    root = os.path.join(work, "sandbox")
    say("=" * 78)
    say("resilient-slurm demo: FSDP training survives 5 faults on a local 4-node Slurm cluster")
    say("=" * 78)
    say(f"training : {wl.nodes} nodes x 1 CPU rank, FSDP2 + gloo, {wl.steps} steps, async "
        f"checkpoint every {wl.checkpoint_every} steps")
    say(f"faults   : seed {wl.fault_seed} -> {harness.describe_schedule(schedule)}")
    say("launcher : sbatch -N4 sbatch/fsdp.sbatch -> resilient-launch --spares 1 (3 training "
        "nodes + 1 hot\n           spare), heartbeat timeout 10 s: in-job restarts by "
        "ft_launcher; a blamed node is\n           swapped for the spare inside the allocation "
        "(same world size, no requeue)\n           memory tiers (--memory-tiers): every step in "
        "node memory + a peer node's copy, so\n           restarts and the spare resume from the "
        "last finished step")
    say(f"work dir : {work}")
    say()
    say(f"[{harness.stamp()}] starting a 4-node sandbox with the hooks ...")
    code = 1
    ref: list[subprocess.Popen[bytes]] = []
    with harness.sandbox(root) as c, ended_on_exit(ref):
        from resilient_slurm_lab.sandbox import jobuser, lifecycle, metrics_stack
        from resilient_slurm_lab.sandbox.cluster import Paths

        stack = metrics_stack.start(Paths(root), [f"node{i}" for i in range(1, wl.nodes + 2)],
                                    lifecycle.job_user(root))
        say(f"[{harness.stamp()}] Prometheus {stack.url} and node_exporter per node "
            "(sandbox up --metrics)")
        # where resilient-launch writes the job's metrics and records the job for `fleet`
        metrics_env = {k: v for k, v in jobuser.job_env(Paths(root)).items()
                       if k in ("RESILIENT_METRICS_DIR", "RESILIENT_JOB_INDEX")}
        say(c.run(["sinfo"]).rstrip())
        ref_dir = os.path.join(work, "fault-free")
        say(f"[{harness.stamp()}] fault-free reference run started alongside (3 local "
            f"processes, niced): {ref_dir}")
        ref.extend(start_reference(wl, ref_dir))
        os.makedirs(os.path.join(work, "job"), exist_ok=True)
        ckpt = os.path.join(work, "job", "ckpt")
        state_dir = os.path.join(ckpt, ".resilient")
        events = os.path.join(state_dir, "events.jsonl")
        env = {"TRAIN_SCRIPT": str(harness.FAULTS_TRAIN), "PYTHON": str(BIN / "python"),
               **harness.resilient_env(),
               # the sandbox's nodes share this host's /dev/shm: one memory folder per node
               "RESILIENT_SANDBOX_TIER1_DIR": os.path.join(work, "job", "shm", "{node}"),
               # where the sandbox's hooks publish verdicts: what makes the spare usable
               "RESILIENT_VERDICT_PATH": os.path.join(root, "verdicts", "{node}.json"),
               **metrics_env}
        env["RESILIENT_LAUNCH_ARGS"] = "--spares 1 " + env["RESILIENT_LAUNCH_ARGS"]
        args = [*wl.train_args(ckpt), "--memory-tiers"]
        t_sub = time.time()  # goodput's wall runs from submission (resilient_slurm.goodput)
        jid = c.submit(harness.FSDP_SBATCH, args, os.path.join(work, "job", "slurm-%j.out"), env,
                       nodes=wl.nodes + 1)
        knobs = " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in env.items()
                         if k not in ("TRAIN_SCRIPT", "PYTHON") and "/" not in v)
        say(f"[{harness.stamp()}] submitted job {jid}: {knobs} \\\n    sbatch -N{wl.nodes + 1} "
            f"sbatch/fsdp.sbatch {' '.join([*wl.train_args('CKPT'), '--memory-tiers'])}")
        say()
        say("live progress (job state, training events, launcher decisions, hook drains):")
        follow = harness.Follower([events, c.hook_events], wl.steps, every=10, out=say)
        def poll(s: str) -> None:
            follow.state(s)
            follow.poll()

        state, timed_out = c.wait(jid, a.bound, poll=poll)
        wall = time.time() - t_sub
        follow.poll()
        say(f"[{harness.stamp()}] job {jid} ended: {state}"
            f"{' (time bound hit, cancelled)' if timed_out else ''} after {wall:.0f} s")
        if state != "COMPLETED":
            log = Path(work, "job", f"slurm-{jid}.out")
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            say("job log tail:\n" + "\n".join(tail))
        say()
        say("-" * 78)
        say("report (resilient-slurm report STATE_DIR --plot FILE.png):")
        say("-" * 78)
        from resilient_slurm.launcher.report import report
        from resilient_slurm.launcher.report.plot import plot

        evs = list(harness.read_events(events))
        if evs:
            rep = report.build(evs, submitted=t_sub)
            say(report.render(rep, evs))
            plot(rep, evs, plot_path)
            say(f"plot: {plot_path}")
        say()
        say("$ sinfo -R")
        say(c.run(["sinfo", "-R"]).rstrip())
        job = c.slurm.job(jid)
        say(f"job {jid}: state {job.state}, requeues {job.restart_count}, ran last on "
            f"{','.join(job.nodes) or '-'}, ExcNodeList={','.join(job.excluded) or '-'}")
        r = harness.summarize("resilient-launch", jid, events, state, timed_out, wall, schedule,
                              job.restart_count, sorted(job.excluded), submitted=t_sub)
        say()
        say(f"[{harness.stamp()}] waiting for the fault-free reference run ...")
        ref_digest = reference_digest(ref, ref_dir, timeout=240)
        say("-" * 78)
        say(f"faults fired in schedule order: {'yes' if r.fault_schedule_ok else 'NO'}")
        say(f"goodput (productive step time / wall from submission): {r.goodput:.1%} "
            f"({r.productive_s:.0f} s of {r.wall_s:.0f} s), lost steps {r.lost_steps}")
        swaps = [e for e in evs if e.get("kind") == "spare" and e.get("node")]
        say("node fault: " + ("; ".join(f"handled inside the allocation: spare {e['node']} in "
                                        f"for {e['out']}" for e in swaps) if swaps else
                              "no spare swap") + f"; requeues {job.restart_count}")
        say(f"final weights digest (5 faults): {r.digest or '(none: job did not complete)'}")
        say(f"fault-free weights digest      : {ref_digest or '(reference run failed)'}")
        match = r.digest is not None and r.digest == ref_digest
        say("digests MATCH: bitwise-identical training despite 5 faults" if match else
            "digests DIFFER")
        code = 0 if r.completed and match else 1
        say()
        code = max(code, second_job_and_fleet(c, wl, work, env, a.bound, stack))
    say(f"[{harness.stamp()}] sandbox down. demo took {time.time() - t_start:.0f} s, exit {code}")
    return code


def second_job_and_fleet(c: harness.Cluster, wl: Workload, work: str, env: dict[str, str],
                         bound: float, stack: prom.Stack) -> int:
    """Repair the nodes, run the same job through the same faults again, then print the fleet
    ledger of both (the table, the node behind the most lost GPU-hours, the per-node total
    against the jobs' own reports) and the alerts firing; 0 when it all holds."""
    from resilient_slurm.cli.fleet import load_jobs, read_index, render
    from resilient_slurm.cli.fleet_html import write_page
    from resilient_slurm.cli.fleet_model import build

    say("-" * 78)
    say(f"[{harness.stamp()}] repairing the drained node, then a second job through the same "
        "faults ...")
    c.reset_nodes(timeout=120)
    ckpt = os.path.join(work, "job2", "ckpt")
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    jid = c.submit(harness.FSDP_SBATCH, [*wl.train_args(ckpt), "--memory-tiers"],
                   os.path.join(work, "job2", "slurm-%j.out"),
                   {**env, "RESILIENT_SANDBOX_TIER1_DIR": os.path.join(work, "job2", "shm",
                                                                       "{node}")},
                   nodes=wl.nodes + 1)
    state, timed_out = c.wait(jid, bound)
    say(f"[{harness.stamp()}] job {jid} ended: {state}"
        f"{' (time bound hit, cancelled)' if timed_out else ''}")
    say("-" * 78)
    config = os.path.join(c.root, "etc", "resilient-slurm", "config.toml")
    say(f"fleet (resilient-slurm fleet --config {config} --html FILE):")
    say("-" * 78)
    from resilient_slurm.config import load_config
    from resilient_slurm.events import read_events

    cfg = load_config(config)
    jobs, missing = load_jobs(read_index(cfg.section("fleet").jobs_index))
    ledger = build(list(read_events(c.hook_events)), jobs)
    text = render(ledger, missing)
    say(text)
    page = os.path.join(work, "fleet.html")
    write_page(ledger, text, page)
    nodes = sum(n.lost_gpu_hours for n in ledger.nodes.values())
    reports = sum(f.gpu_hours for b in ledger.jobs.values() for f in b.faults if f.node)
    close = reports > 0 and abs(nodes - reports) <= 0.05 * reports
    say(f"per-node lost GPU-hours {nodes:.4f} vs the jobs' own reports {reports:.4f}: "
        + ("within 5%" if close else "NOT within 5%"))
    firing = sorted({" ".join(f"{k}={v}" for k, v in sorted(x["labels"].items())
                              if k in ("alertname", "node", "slurm_job", "cause"))
                     for x in prom.alerts(stack) if x.get("state") == "firing"})
    say(f"Prometheus alerts firing: {', '.join(firing) or 'none'}")
    say(f"HTML page: {page}")
    return 0 if state == "COMPLETED" and len(jobs) == 2 and close else 1


if __name__ == "__main__":
    sys.exit(main())
