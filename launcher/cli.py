"""``resilient-launch``: write it where the batch script said ``srun torchrun``.

Runs one ``ft_launcher`` per node (NVRx does in-job restarts in seconds) and handles what
needs the scheduler: blaming bad nodes, relaunching without them, requeueing with them
excluded, and stopping with a verdict instead of a requeue storm.
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from resilient_slurm.launcher import plan, published, straggler
from resilient_slurm.launcher.supervisor import (
    EXIT_ERROR,
    EXIT_MEANINGS,
    EXIT_USAGE,
    Settings,
    Supervisor,
)
from resilient_slurm.slurm import SlurmBackend


def _exit_codes() -> str:
    """The "Exit codes" part of --help, from ``supervisor.EXIT_MEANINGS``."""
    lines = ["\b", "Exit codes:"]
    for code, meaning in EXIT_MEANINGS:
        first, *rest = meaning.split("\n")
        lines.append(f"  {code}  {first}")
        lines += [f"     {line}" for line in rest]
    return "\n".join(lines) + "\n"


EPILOG = _exit_codes() + """\b
A straggler (a node computing --straggler-factor times slower than the median over
--straggler-window steps, from the training's step_timing events) stops the cycle and
is blamed like a faulty node (--on-straggler); it is not drained unless the hooks'
published verdict finds a cause.
A blamed node is left out of the next cycle; with enough survivors (--min-nodes) the
job goes on in its allocation and the node is released back to Slurm (except the
batch host), else the job is requeued with the node in ExcNodeList.
\b
State (--state-dir): events.jsonl (every cycle, fault, hang detection, blame, exclusion,
release, requeue, verdict; training events land there too via RESILIENT_EVENTS_FILE),
ledger.json (strikes, exclusions, budgets), cycles/<r>-<c>/ (per-node start and exit
records, published verdicts read on the nodes, torchelastic logs).
Report: resilient-slurm report STATE_DIR.
"""


def _default_ckpt(args: tuple[str, ...]) -> str | None:
    for i, a in enumerate(args):
        if a.startswith("--checkpoint-dir="):
            return a.split("=", 1)[1]
        if a == "--checkpoint-dir" and i + 1 < len(args):
            return args[i + 1]
    return None


def default_state_dir(job_id: int, ckpt: str | None) -> str:
    """CHECKPOINT_DIR/.resilient, else .resilient-JOBID in the job's working directory (where
    slurm-JOBID.out lands by default; shared by the job's requeues, which keep the job id)."""
    if ckpt:
        return os.path.join(ckpt, ".resilient")
    return os.path.join(os.getcwd(), f".resilient-{job_id}")


def _die(msg: str) -> None:
    click.echo(f"resilient-launch: error: {msg}", err=True)
    sys.exit(EXIT_USAGE)


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option("--nproc-per-node", "--nproc_per_node", default="1", show_default=True,
              help="Workers per node (int, gpu, cpu, auto).")
@click.option("-m", "--module", is_flag=True, help="Run SCRIPT as a Python module.")
@click.option("--min-nodes", type=click.IntRange(1), default=None,
              help="Fewest nodes to train on before requeueing [default: all allocated].")
@click.option("--max-restarts", type=click.IntRange(0), default=3, show_default=True,
              help="In-job restarts (ft_launcher) per cycle, counted for the whole job: one "
                   "fault is one restart however many nodes restart for it.")
@click.option("--max-requeues", type=click.IntRange(0), default=3, show_default=True,
              help="Requeues allowed; SLURM_RESTART_COUNT never exceeds it.")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=0.1), default=60.0,
              show_default=True, help="Seconds without a rank heartbeat before a restart.")
@click.option("--initial-heartbeat-timeout", type=click.FloatRange(min=0.1), default=300.0,
              show_default=True, help="Seconds allowed until a rank's first heartbeat.")
@click.option("--term-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, help="Seconds between SIGTERM and SIGKILL of ranks.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Where the script saves checkpoints, in any common layout (progress is "
                   "read from here) [default: the script's own --checkpoint-dir, else none].")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              envvar="RESILIENT_LAUNCH_STATE_DIR",
              help="Launcher state on shared storage [default: CHECKPOINT_DIR/.resilient, "
                   "else ./.resilient-JOBID in the job's working directory].")
@click.option("--no-progress-limit", type=click.IntRange(1), default=3, show_default=True,
              help="Stop (exit 3) after this many failed cycles/requeues in a row without "
                   "progress (a higher reported step or a newer complete checkpoint).")
@click.option("--max-strikes", type=click.IntRange(1), default=2, show_default=True,
              help="Ambiguous failures before a node is excluded.")
@click.option("--verdict-path", default=published.DEFAULT_PATH, show_default=True,
              envvar="RESILIENT_VERDICT_PATH",
              help="The health verdicts the hooks publish ([hooks] verdict_file), {node} per "
                   "node, read on the node when not visible here; empty: blame from Slurm "
                   "state, drains and the step's records only.")
@click.option("--max-blame-share", type=click.FloatRange(0, 1), default=0.5,
              show_default=True, help="Most of a cycle's nodes blamed at once; more is a "
                                      "shared fault (storage, network) and blames none.")
@click.option("--health-timeout", type=click.FloatRange(min=1), default=30.0,
              show_default=True, help="Seconds reading the published verdicts may take.")
@click.option("--on-straggler", type=click.Choice(straggler.POLICIES), default="exclude",
              show_default=True,
              help="A node computing --straggler-factor times slower than the median over "
                   "--straggler-window steps (from the training's step_timing events): "
                   "exclude (elastic relaunch without it when --min-nodes allows, else "
                   "requeue excluding it), requeue (always requeue excluding it) or warn "
                   "(an event only).")
@click.option("--straggler-factor", type=click.FloatRange(min=1.0, min_open=True),
              default=straggler.DEFAULT_FACTOR, show_default=True,
              help="How many times slower than the median makes a straggler.")
@click.option("--straggler-window", type=click.IntRange(1), default=straggler.DEFAULT_WINDOW,
              show_default=True, help="Steps the slowness must last (robust to one-off noise).")
@click.option("--checkpoint-marker", default=None, metavar="NAME",
              help="The file your script writes into a checkpoint directory once it is "
                   "complete (besides the known ones: DCP .metadata, COMMITTED, DONE, "
                   "_SUCCESS, Megatron, Lightning, NVRx local).")
@click.option("--ft-arg", "ft_args", multiple=True, metavar="FLAG",
              help="Extra ft_launcher flag, passed through (repeat), e.g. "
                   "--ft-arg=--ft-restart-policy=min-healthy.")
@click.option("--srun-arg", "srun_args", multiple=True, metavar="FLAG",
              help="Extra srun flag for the training step (repeat).")
@click.option("--ft-launcher", default="ft_launcher", show_default=True,
              help="The ft_launcher program.")
@click.option("--inprocess", is_flag=True,
              help="In-process restart (level 0) under ft_launcher's min-healthy policy "
                   "(level 1): hosts the ranks' store here; the script must support it "
                   "(train_fsdp.py --inprocess, or resilient_slurm.training.inprocess). "
                   "See docs/inprocess.md.")
@click.option("--dry-run", is_flag=True, help="Print the plan and command lines; run nothing.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(script: str, args: tuple[str, ...], nproc_per_node: str, module: bool,
         min_nodes: int | None, max_restarts: int, max_requeues: int, heartbeat_timeout: float,
         initial_heartbeat_timeout: float, term_timeout: float, checkpoint_dir: str | None,
         state_dir: str | None, no_progress_limit: int, max_strikes: int,
         verdict_path: str, max_blame_share: float, health_timeout: float, on_straggler: str,
         straggler_factor: float, straggler_window: int, checkpoint_marker: str | None,
         ft_args: tuple[str, ...],
         srun_args: tuple[str, ...], ft_launcher: str, inprocess: bool, dry_run: bool) -> None:
    """Run SCRIPT [ARGS] with ft_launcher on every node of this Slurm allocation.

    \b
    In an sbatch script, instead of `srun torchrun --nproc-per-node 8 train.py ...`:
      exec resilient-launch --nproc-per-node 8 train.py --lr 3e-4
    """
    env = dict(os.environ)
    try:
        alloc = plan.Allocation.from_env(env)
    except plan.PlanError as exc:
        _die(str(exc))
    ckpt = checkpoint_dir or _default_ckpt(args)
    ckpt = os.path.abspath(ckpt) if ckpt else None
    sdir = os.path.abspath(state_dir or default_state_dir(alloc.job_id, ckpt))
    if min_nodes is not None and min_nodes > len(alloc.nodes):
        _die(f"--min-nodes {min_nodes} > {len(alloc.nodes)} allocated node(s)")
    opts = plan.LaunchOptions(
        script=script, script_args=args, module=module, nproc_per_node=nproc_per_node,
        max_restarts=plan.ft_restart_budget(max_restarts), heartbeat_timeout=heartbeat_timeout,
        initial_heartbeat_timeout=initial_heartbeat_timeout, term_timeout=term_timeout,
        ft_args=ft_args, srun_args=srun_args, ft_launcher=ft_launcher)
    cfg = Settings(checkpoint_dir=ckpt, state_dir=sdir,
                   min_nodes=min_nodes or len(alloc.nodes), max_requeues=max_requeues,
                   no_progress_limit=no_progress_limit, max_strikes=max_strikes,
                   verdict_path=verdict_path, max_blame_share=max_blame_share,
                   health_timeout=health_timeout, checkpoint_marker=checkpoint_marker,
                   max_restarts=max_restarts,
                   straggler=straggler.Settings(straggler_factor, straggler_window,
                                                max_blame_share if 0 < max_blame_share < 1
                                                else straggler.DEFAULT_MAX_SHARE,
                                                on_straggler))
    try:
        features = plan.detect_features(ft_launcher)
    except plan.PlanError as exc:
        _die(str(exc))
    from resilient_slurm.slurm import SlurmError, connect

    try:
        slurm = connect(timeout=3.0 if dry_run else 15.0)
    except SlurmError as exc:
        _die(f"cannot reach Slurm: {exc}")
    store = None
    if inprocess:
        from resilient_slurm.launcher import inprocess_plan

        try:
            opts = inprocess_plan.configure(opts, cfg.min_nodes, len(alloc.nodes))
            if not dry_run:
                store = inprocess_plan.StoreHost()
                store.start()
                from resilient_slurm.launcher.evidence import node_addresses

                batch = [alloc.batch_node] if alloc.batch_node else []
                addr = store.address(node_addresses(slurm, batch), alloc.batch_node)
                opts.extra_env.update(inprocess_plan.worker_env(addr, cfg.min_nodes,
                                                                nproc_per_node))
        except inprocess_plan.InprocessPlanError as exc:
            _die(str(exc))
    if dry_run:
        _print_plan(slurm, alloc, opts, features, cfg)
        return
    try:
        code = Supervisor(slurm, alloc, opts, features, cfg, env).run()
    except Exception as exc:  # noqa: BLE001 - one clear line, the exit code says "internal"
        click.echo(f"resilient-launch: internal error: {type(exc).__name__}: {exc}", err=True)
        code = EXIT_ERROR
    finally:
        if store is not None:
            store.stop()
    sys.exit(code)


def _print_plan(slurm: SlurmBackend, alloc: plan.Allocation, opts: plan.LaunchOptions,
                features: plan.Features, cfg: Settings) -> None:
    from resilient_slurm.launcher import evidence, ledger

    node_ledger = ledger.load(cfg.state_dir)  # read only: a dry run writes nothing
    nodes = node_ledger.usable(list(alloc.nodes))
    addrs = evidence.node_addresses(slurm, list(alloc.nodes))
    cycle_dir = os.path.join(cfg.state_dir, "cycles",
                             f"r{alloc.restart_count}-c{node_ledger.cycles + 1}")
    echo = click.echo
    echo(f"job {alloc.job_id} restart {alloc.restart_count}/{cfg.max_requeues}: allocation "
         f"{','.join(alloc.nodes)}; excluded {','.join(sorted(node_ledger.excluded)) or '-'}")
    echo(f"nodes: {','.join(nodes)} (min {cfg.min_nodes}); addresses: "
         + ", ".join(f"{n}={a or '?'}" for n, a in addrs.items()))
    echo(f"nvidia-resiliency-ext {features.version or '?'}: "
         + ", ".join(f"{k}={features.flag(k) or '-'}" for k in plan.FT_FLAGS))
    echo(f"checkpoints: {cfg.checkpoint_dir or 'none'}; state: {cfg.state_dir}; budgets: "
         f"{cfg.max_restarts} in-job restarts/cycle (job), {cfg.max_requeues} requeues, "
         f"no-progress limit {cfg.no_progress_limit}, {cfg.max_strikes} strikes")
    if len(nodes) < cfg.min_nodes:
        echo("plan: too few usable nodes: requeue with exclusions")
        return
    cycle = plan.plan_cycle(alloc, opts, features, nodes, addrs, node_ledger.cycles + 1, cycle_dir)
    echo(f"cycle {cycle.number}: rendezvous {cycle.endpoint} id {cycle.rdzv_id}")
    echo(shlex.join(cycle.argv))
    echo(f"published health verdicts: {cfg.verdict_path or '-'}")
    if cfg.straggler is not None:
        st = cfg.straggler
        echo(f"stragglers: {st.factor:g}x the median over {st.window} steps -> {st.policy}")


if __name__ == "__main__":  # pragma: no cover
    main()
