"""``resilient-launch``: write it where the batch script said ``srun torchrun``.

Runs one ``ft_launcher`` per node (NVRx does in-job restarts in seconds) and handles what
needs the scheduler: blaming bad nodes, relaunching without them, requeueing with them
excluded, and stopping with a verdict instead of a requeue storm.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any, NoReturn

import click

from resilient_slurm import verdict_file
from resilient_slurm.config_schema import ConfigError
from resilient_slurm.launcher import site_config
from resilient_slurm.launcher.config import LaunchConfig
from resilient_slurm.launcher.cycle import ft_config, plan, torchrun_args
from resilient_slurm.launcher.cycle.launch_env import launch_options, script_checkpoint_dir
from resilient_slurm.launcher.recovery import exclusions, spares, straggler
from resilient_slurm.launcher.recovery.exits import EXIT_ERROR, EXIT_MEANINGS, EXIT_USAGE
from resilient_slurm.launcher.settings import SupervisorSettings
from resilient_slurm.launcher.supervisor import Supervisor
from resilient_slurm.slurm import SlurmBackend
from resilient_slurm.training import inprocess_timeouts as ip_timeouts
from resilient_slurm.training.inprocess_timeouts import NVRX_DEFAULTS as NVRX_L0


def _exit_codes() -> str:
    """The "Exit codes" part of --help, from ``exits.EXIT_MEANINGS``."""
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
With --spares K the training runs on N = allocated - K nodes and a blamed node is
swapped for a standby whose published health verdict is ok: same world size, no
requeue, no shrink; with no healthy spare left, as above (docs/launcher.md).
With --spares K --inprocess every node runs ranks and the K nodes' ranks stand by
inside the training's level 0 (torch imported, waiting); a lost rank's place is
taken by a standby in the live processes, no new process (docs/inprocess.md).
\b
State (--state-dir): events.jsonl (every cycle, fault, hang detection, blame, exclusion,
release, requeue, verdict; training events land there too via RESILIENT_EVENTS_FILE),
ledger.json (strikes, exclusions, budgets), cycles/<r>-<c>/ (per-node start and exit
records, published verdicts read on the nodes, torchelastic logs).
Report: resilient-slurm report STATE_DIR.
"""


def default_state_dir(job_id: int, ckpt: str | None) -> str:
    """CHECKPOINT_DIR/.resilient, else .resilient-JOBID in the job's working directory (where
    slurm-JOBID.out lands by default; shared by the job's requeues, which keep the job id)."""
    if ckpt:
        return os.path.join(ckpt, ".resilient")
    return os.path.join(os.getcwd(), f".resilient-{job_id}")


def _die(msg: str) -> NoReturn:
    click.echo(f"resilient-launch: error: {msg}", err=True)
    sys.exit(EXIT_USAGE)


class TorchrunCommand(click.Command):
    """A click command that reads torchrun's whole command line first
    (``torchrun_args.split``): torchrun's options the launcher owns are consumed (noted in
    ``ctx.meta``), those ft_launcher takes are passed on, unknown ones are a usage error
    naming the flag, all before the callback looks at the allocation."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ours: dict[str, bool] = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Option):
                for name in (*p.opts, *p.secondary_opts):
                    ours[name] = not (p.is_flag or p.count)
        try:
            found = torchrun_args.split(args, ours)
        except torchrun_args.UsageError as exc:
            raise click.UsageError(str(exc), ctx) from None
        ctx.meta["torchrun"] = found
        return super().parse_args(ctx, found.ours)


@click.command(cls=TorchrunCommand,
               context_settings={"allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(package_name="resilient-slurm", prog_name="resilient-launch",
                      message="%(prog)s %(version)s")
@click.option("--nproc-per-node", "--nproc_per_node", default="1", show_default=True,
              help="Workers per node (int, gpu, cpu, auto).")
@click.option("-m", "--module", is_flag=True, help="Run SCRIPT as a Python module.")
@click.option("--min-nodes", type=click.IntRange(1), default=None,
              help="Fewest nodes to train on before requeueing [default: all allocated].")
@click.option("--spares", type=click.IntRange(0), default=0, show_default=True,
              metavar="K",
              help="Hot spares: train on all allocated nodes but K; the K stand by, idle. A "
                   "blamed node (lost GPU, node down, the hooks' fail) is swapped for a spare "
                   "whose published verdict is ok, inside the allocation (same world size; "
                   "the spare's ranks restore from the peers' memory-tier copies). None left: "
                   "shrink (--min-nodes) or requeue. K >= 0, leaving >= 1 training node. "
                   "With --inprocess the spares' ranks stand by inside level 0 instead.")
@click.option("--max-restarts", type=click.IntRange(0), default=3, show_default=True,
              help="In-job restarts (ft_launcher) per cycle, counted for the whole job: one "
                   "fault is one restart however many nodes restart for it.")
@click.option("--max-requeues", type=click.IntRange(0), default=3, show_default=True,
              help="Requeues the launcher may ask for (counted in its ledger; Slurm's own "
                   "requeues for preemption or node failure do not count).")
@click.option("--exclusion-ttl", type=click.FloatRange(min=0), default=exclusions.DEFAULT_TTL_S,
              show_default=True, metavar="SECONDS",
              help="An excluded node comes back after this long unless Slurm or its health "
                   "verdict still says it is bad (0: never).")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=0.1), default=None,
              help="Seconds without a rank heartbeat before a restart [default: NVRx's own "
                   f"({plan.NVRX_HEARTBEAT_TIMEOUT:g}), lowered by the instrumentation to 5x "
                   "the longest interval between optimizer steps it has seen, never below "
                   "--heartbeat-floor].")
@click.option("--heartbeat-floor", type=click.FloatRange(min=1), default=10.0,
              show_default=True,
              help="Without --heartbeat-timeout (here or in your NVRx config), scripts that "
                   "support it (train_fsdp.py, training.liveness) set the heartbeat timeout "
                   "from NVRx's calculation over their own heartbeats after 10 steps (the "
                   "instrumentation: from the observed optimizer steps), never "
                   "below this many seconds.")
@click.option("--initial-heartbeat-timeout", type=click.FloatRange(min=0.1), default=None,
              help="Seconds allowed until a rank's first heartbeat [default: NVRx's own, "
                   f"{plan.NVRX_INITIAL_HEARTBEAT_TIMEOUT:g}].")
@click.option("--term-timeout", type=click.FloatRange(min=0.1), default=None,
              help="Seconds between SIGTERM and SIGKILL of ranks (time to save) [default: "
                   f"NVRx's own, {plan.NVRX_TERM_TIMEOUT:g}]; keep it under the --signal "
                   "lead time and KillWait.")
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
@click.option("--verdict-path", default=None, envvar="RESILIENT_VERDICT_PATH",
              help="The health verdicts the hooks publish, {node} per node, read on the node "
                   "when not visible here; empty: blame from Slurm state, drains and the "
                   "step's records only [default: the site config's [hooks] verdict_file "
                   "($RESILIENT_SLURM_CONFIG, else /etc/resilient-slurm/config.toml), else "
                   f"{verdict_file.DEFAULT_PATH}].")
@click.option("--metrics-dir", default="", envvar="RESILIENT_METRICS_DIR", metavar="DIR",
              help="Write the job's Prometheus textfile (lost seconds by cause, faults, "
                   "recoveries) to DIR/resilient_job_JOBID.prom, node_exporter's directory.")
@click.option("--job-index", default="", envvar="RESILIENT_JOB_INDEX", metavar="FILE", help=
              "Append a line per start saying where the events are ([fleet] jobs_index).")
@click.option("--max-blame-share", type=click.FloatRange(0, 1), default=0.5,
              show_default=True, help="Most of a cycle's nodes blamed at once; more is a "
                                      "shared fault (storage, network) and blames none.")
@click.option("--node-query-interval", type=click.FloatRange(min=1), default=60.0,
              show_default=True, metavar="SECONDS",
              help="While a step runs, ask Slurm about each of its nodes (one single-node "
                   "query each) at least this often; sooner on trouble or a flagged node.")
@click.option("--health-timeout", type=click.FloatRange(min=1), default=30.0,
              show_default=True, help="Seconds reading the published verdicts may take.")
@click.option("--verdict-wait", type=click.FloatRange(min=0), default=45.0,
              show_default=True, metavar="SECONDS",
              help="A failed cycle that blames no node waits this long at most for every "
                   "node's next published verdict (the hooks' HealthCheckInterval, 30 s by "
                   "default, plus a margin) before requeuing or stopping; 0: never waits.")
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
                   "Level 0's timeouts are NVRx's own (soft "
                   f"{NVRX_L0['soft_timeout']:g} s, hard {NVRX_L0['hard_timeout']:g} s) unless "
                   "the job "
                   "sets RESILIENT_INPROCESS_SOFT_TIMEOUT, _HARD_TIMEOUT, _HEARTBEAT_TIMEOUT, "
                   "_BARRIER_TIMEOUT, _COMPLETION_TIMEOUT; the heartbeat timeouts here must "
                   "exceed the hard one by 10 s. "
                   "Built on a deprecated API: NVRx 0.6's release notes deprecate in-process "
                   "restart (to be removed; their migration: in-job restart via ft_launcher), "
                   "so it runs on NVRx < 0.6 only. On current NVRx the fast path is in-job "
                   "restart with memory tiers and --spares. See docs/inprocess.md.")
@click.option("--no-instrument", is_flag=True,
              help="Do not instrument the ranks (by default a bootstrap on their PYTHONPATH "
                   "hooks every optimizer step: NVRx heartbeats, step reports, checkpoints "
                   "seen; docs/any-script.md).")
@click.option("--dry-run", is_flag=True, help="Print the plan and command lines; run nothing.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(**params: Any) -> None:
    """Run SCRIPT [ARGS] with ft_launcher on every node of this Slurm allocation.

    \b
    In an sbatch script, instead of `srun torchrun --nproc-per-node 8 train.py ...`:
      exec resilient-launch --nproc-per-node 8 train.py --lr 3e-4
    """
    run(LaunchConfig.from_params(**params))


def run(cfg: LaunchConfig) -> None:
    """``resilient-launch`` with the parsed command line ``cfg``: plan, then supervise (or
    print the plan: ``--dry-run``); exits with the launcher's status."""
    ctx = click.get_current_context()
    try:
        opts = launch_options(ctx)
    except ft_config.FtConfigError as exc:
        _die(str(exc))
    found = ctx.meta.get("torchrun") or torchrun_args.Split()
    for note in found.notes:
        click.echo(f"resilient-launch: note: {note}", err=True)
    env = dict(os.environ)
    try:
        alloc = plan.Allocation.from_env(env)
    except plan.PlanError as exc:
        _die(str(exc))
    try:
        verdict_path = site_config.verdict_location(cfg.verdict_path, ctx.get_parameter_source(
            "verdict_path") is click.core.ParameterSource.ENVIRONMENT, env)
    except ConfigError as exc:
        _die(f"health verdicts: {exc}")
    ckpt = cfg.checkpoint_dir or script_checkpoint_dir(cfg.args)
    ckpt = os.path.abspath(ckpt) if ckpt else None
    sdir = os.path.abspath(cfg.state_dir or default_state_dir(alloc.job_id, ckpt))
    try:
        train = spares.check(cfg.spares, len(alloc.nodes), cfg.min_nodes)
    except spares.SpareError as exc:
        _die(str(exc))
    if cfg.spares and cfg.inprocess and not cfg.nproc_per_node.isdigit():
        _die(f"--spares with --inprocess needs a number of ranks per node (--nproc-per-node "
             f"{cfg.nproc_per_node!r}): the spares' ranks are counted to stand them by")
    # --inprocess: the spares run ranks from the start, standing by inside the training's
    # level 0 (inprocess_plan.worker_env); the launcher keeps every node in the step.
    settings = cfg.supervisor_settings(
        checkpoint_dir=ckpt, state_dir=sdir, min_nodes=cfg.min_nodes or train,
        verdict_path=verdict_path, spares=0 if cfg.inprocess else cfg.spares)
    try:
        features = plan.detect_features(cfg.ft_launcher)
    except plan.PlanError as exc:
        _die(str(exc))
    from resilient_slurm.slurm import SlurmError, connect

    try:
        slurm = connect(timeout=3.0 if cfg.dry_run else 15.0)
    except SlurmError as exc:
        _die(f"cannot reach Slurm: {exc}")
    store = None
    if cfg.inprocess:
        from resilient_slurm.launcher.cycle import inprocess_plan

        try:
            opts = inprocess_plan.configure(opts, features, settings.min_nodes,
                                           len(alloc.nodes), env)
            if not cfg.dry_run:
                store = inprocess_plan.StoreHost()
                store.start()
                from resilient_slurm.launcher.recovery.evidence import node_addresses

                batch = [alloc.batch_node] if alloc.batch_node else []
                addr = store.address(node_addresses(slurm, batch), alloc.batch_node)
                opts.extra_env.update(inprocess_plan.worker_env(
                    addr, settings.min_nodes, cfg.nproc_per_node,
                    train if cfg.spares else 0, os.environ))
        except inprocess_plan.InprocessPlanError as exc:
            _die(str(exc))
    if cfg.dry_run:
        if cfg.inprocess and cfg.spares:
            click.echo(f"hot spares: {cfg.spares} node(s) of ranks standing by in level 0 "
                       f"(--spares {cfg.spares} --inprocess): {train} node(s) train, every "
                       "node runs ranks; the standbys are the last in the rendezvous's rank "
                       "order")
        _print_plan(slurm, alloc, opts, features, settings)
        return
    try:
        code = Supervisor(slurm, alloc, opts, features, settings, env).run()
    except Exception as exc:  # noqa: BLE001 - one clear line, the exit code says "internal"
        click.echo(f"resilient-launch: internal error: {type(exc).__name__}: {exc}", err=True)
        code = EXIT_ERROR
    finally:
        if store is not None:
            store.stop()
    sys.exit(code)


def _print_plan(slurm: SlurmBackend, alloc: plan.Allocation, opts: plan.LaunchOptions,
                features: plan.Features, cfg: SupervisorSettings) -> None:
    from resilient_slurm.launcher.recovery import evidence, ledger
    from resilient_slurm.launcher.shim.standby import native

    node_ledger = ledger.load(cfg.state_dir)  # read only: a dry run writes nothing
    nodes = node_ledger.usable(list(alloc.nodes))
    addrs = evidence.node_addresses(slurm, list(alloc.nodes))
    cycle_dir = os.path.join(cfg.state_dir, "cycles",
                             f"r{alloc.restart_count}-c{node_ledger.cycles + 1}")
    echo = click.echo
    echo(f"job {alloc.job_id} restart {alloc.restart_count}/{cfg.max_requeues}: allocation "
         f"{','.join(alloc.nodes)}; excluded {','.join(sorted(node_ledger.excluded)) or '-'}")
    standby: list[str] = []
    gated = bool(cfg.spares) and native(features.flags, opts.min_nnodes is not None)
    if cfg.spares:
        nodes, standby = spares.split(nodes, len(alloc.nodes) - cfg.spares, alloc.batch_node)
        echo(f"hot spares: {','.join(standby) or '-'} (--spares {cfg.spares}); "
             + spares.nvrx_note(features.version, gated))
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
    if gated and standby:  # NVRx's own standbys in the step (launcher/shim/standby.py)
        from resilient_slurm.launcher.recovery import standby_cycle

        cycle = standby_cycle.plan_cycle(alloc, opts, features, nodes, standby, addrs,
                                         cycle.number, cycle_dir, plan.EPHEMERAL_DEFAULT,
                                         cfg.verdict_path, cfg.verdict_max_age)[0]
    echo(f"cycle {cycle.number}: rendezvous {cycle.endpoint} id {cycle.rdzv_id}")
    if opts.min_nnodes:
        from resilient_slurm.launcher.cycle import inprocess_plan

        echo("in-process level 0 timeouts: " + ip_timeouts.describe(
            ip_timeouts.from_env(os.environ), NVRX_L0))
        echo("in-process level 1: " + inprocess_plan.level1_span(features, opts.min_nnodes,
                                                                 len(cycle.nodes)))
    echo(shlex.join(cycle.argv))
    floor = opts.extra_env.get("RESILIENT_HEARTBEAT_FLOOR")
    instrumented = "RESILIENT_INSTRUMENT" in opts.extra_env
    echo(f"hang detection: heartbeat timeout {opts.heartbeat_s:g} s"
         + (" (yours)" if not floor else
            f", adapted from the observed optimizer steps (floor {floor} s)" if instrumented
            else f", adapted by scripts that support it (NVRx's calculation, floor {floor} s)")
         + f"; initial {opts.initial_heartbeat_s:g} s; ranks "
         + ("instrumented" if instrumented else "not instrumented (--no-instrument)"))
    echo(f"published health verdicts: {cfg.verdict_path or '-'}")
    if cfg.straggler is not None:
        st = cfg.straggler
        echo(f"stragglers: {st.factor:g}x the median over {st.window} steps -> {st.policy}")


if __name__ == "__main__":  # pragma: no cover
    main()
