"""``resilient-slurm sandbox``: a real Slurm cluster on this host."""

from __future__ import annotations

import os
import shlex
import time

import click

from resilient_slurm.slurm import SlurmError, connect
from resilient_slurm_lab.sandbox import lifecycle
from resilient_slurm_lab.sandbox.cluster import TIMINGS, Paths, SandboxError, read_meta

DIR_OPTION = click.option(
    "--dir", "root", default=lifecycle.DEFAULT_DIR, show_default=True,
    envvar="RESILIENT_SANDBOX_DIR", type=click.Path(file_okay=False),
    help="Directory holding all of this sandbox's state (env: RESILIENT_SANDBOX_DIR).",
)


def _fail(exc: Exception) -> None:
    raise click.ClickException(str(exc))


@click.group()
def sandbox() -> None:
    """A real multi-node Slurm cluster on this host, for tests, the demo and trying the hooks.

    \b
    Needs root and Debian's slurm-wlm + munge. Each sandbox is a private munged, a
    slurmctld and N `slurmd -N nodeK`, all state under --dir, ports picked free, so several
    sandboxes can run at once.

    \b
      resilient-slurm sandbox up --nodes 4
      eval "$(resilient-slurm sandbox env)"
      srun -N4 hostname
      resilient-slurm sandbox down
    """


@sandbox.command()
@click.option("--nodes", "-n", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Number of nodes (node1..nodeN).")
@click.option("--hooks/--no-hooks", default=True, show_default=True,
              help="Wire the project's prolog, epilog and HealthCheckProgram into slurm.conf, "
                   "each node reading its own simulated hardware.")
@click.option("--timing", type=click.Choice(sorted(TIMINGS)), default="fast", show_default=True,
              help="fast: short Slurm timeouts for quick tests (KillWait=5, cred_expire=10, "
                   "SlurmdTimeout=30, nohold_on_prolog_fail, proctrack/linuxproc). "
                   "production: Slurm's defaults (KillWait=30, cred_expire=120, "
                   "MessageTimeout=10, SlurmdTimeout=300, a prolog failure holds the job, "
                   "HealthCheckInterval=30) and proctrack/cgroup (linuxproc, with the "
                   "reason printed, where this host has no cgroup v1 freezer).")
@click.option("--user", default=lifecycle.DEFAULT_USER, show_default=True,
              help="Unprivileged account jobs are submitted as (created with useradd if "
                   "missing); see `sandbox exec-as-user`.")
@click.option("--watch/--no-watch", default=False, show_default=True,
              help="Also run the node watcher (`resilient-health watch`, root) on every node, "
                   "as a production node runs it as a service: a failing node is drained "
                   "within seconds instead of at the next health run. Needs --hooks.")
@click.option("--repair/--no-repair", default=False, show_default=True,
              help="Turn the repair loop on ([repair] enabled: our drains are lifted only "
                   "after a validation) and give Slurm reboot and power programs that "
                   "simulate a reboot (new boot id) and a replaced machine (fresh hardware); "
                   "run `resilient-slurm repair` for the controller's pass. Needs --hooks.")
@click.option("--health-interval", type=click.IntRange(1, 86_400), default=None,
              help="HealthCheckInterval in seconds in place of the timing's (10 fast, 30 "
                   "production; 300 is common on real clusters).")
@click.option("--metrics", is_flag=True,
              help="Also start Debian's prometheus and prometheus-node-exporter (textfile "
                   "collector over each node's directory and the jobs' metrics), with the "
                   "project's rules; `sandbox env` then gives jobs --metrics-dir and "
                   "--job-index. Needs --hooks.")
@DIR_OPTION
def up(nodes: int, hooks: bool, timing: str, user: str, watch: bool, repair: bool,
       health_interval: int | None, metrics: bool, root: str) -> None:
    """Start the sandbox and wait until every node is idle; prints SLURM_CONF=<path>."""
    from resilient_slurm_lab.sandbox import metrics_stack, prom

    if metrics and not hooks:
        _fail(SandboxError("--metrics reads the hooks' metrics: it needs --hooks"))
    try:
        if metrics:
            prom.programs()  # missing: say what to install before anything starts
        paths = lifecycle.up(root, nodes, hooks=hooks, timing=timing, user=user, watch=watch,
                             repair=repair,
                             health_interval=health_interval)
        account = lifecycle.job_user(root)
    except (SandboxError, SlurmError, prom.PromError) as exc:
        _fail(exc)
    try:
        stack = metrics_stack.start(paths, [f"node{i}" for i in range(1, nodes + 1)],
                                    account) if metrics else None
    except (OSError, prom.PromError) as exc:
        lifecycle.down(root, quiet=True)  # ours, just started
        _fail(exc)
    click.echo(f"sandbox up: {nodes} node(s) idle under {paths.root} ({timing} timing)")
    click.echo(f"job user: {account.name} (uid {account.uid}), work dir {account.work_dir}")
    track = lifecycle.tracking(root)
    click.echo(f"process tracking: {track.proctrack}: {track.reason}")
    if watch:
        click.echo(f"node watcher on every node (logs: {paths.p('log', 'watch-NODE.out')})")
    if stack is not None:
        click.echo(f"Prometheus {stack.url} (rules: prometheus/rules.yml; alerts: "
                   f"{stack.url}/alerts), node_exporter per node and for the jobs' metrics")
    click.echo(lifecycle.memory_summary(root))
    click.echo(f"SLURM_CONF={paths.conf}")


@sandbox.command()
@DIR_OPTION
def down(root: str) -> None:
    """Cancel jobs and stop every process this sandbox started."""
    try:
        survivors = lifecycle.down(root)
    except SandboxError as exc:
        _fail(exc)
    if survivors:
        raise click.ClickException(f"processes would not die: {survivors}")
    click.echo(f"sandbox down: nothing left running under {os.path.abspath(root)}")


@sandbox.command()
@DIR_OPTION
def env(root: str) -> None:
    """Print shell `export` lines for this sandbox (use with eval): everything a job on it
    needs (Slurm's config, the hooks' config, where resilient-launch reads the published
    verdicts from, a node-memory folder per node for memory tiers)."""
    from resilient_slurm_lab.sandbox.jobuser import job_env

    paths = Paths(root)
    try:
        read_meta(paths)
    except SandboxError as exc:
        _fail(exc)
    for name, value in job_env(paths).items():
        click.echo(f"export {name}={shlex.quote(value)}")


@sandbox.command()
@DIR_OPTION
def status(root: str) -> None:
    """Show the sandbox's nodes (state, flags, reason) and jobs."""
    paths = Paths(root)
    try:
        meta = read_meta(paths)
        slurm = connect(conf=paths.conf, backend="cli", timeout=5)
        nodes = slurm.nodes()
        jobs = slurm.jobs()
    except (SandboxError, SlurmError) as exc:
        _fail(exc)
    user = meta.get("user")
    who = user.get("name") if isinstance(user, dict) else "-"
    click.echo(f"sandbox {paths.root} (Slurm {meta.get('slurm_version')}, "
               f"{meta.get('timing', 'fast')} timing, {meta.get('proctrack', 'linuxproc')}, "
               f"job user {who})")
    for n in nodes:
        flags = "+".join(sorted(n.flags))
        click.echo(f"  {n.name:<8} {n.state.lower():<10} {flags:<16} {n.reason}")
    for j in jobs:
        click.echo(f"  job {j.job_id:<6} {j.state:<11} restarts={j.restart_count} "
                   f"nodes={','.join(j.nodes) or '-'} excluded={','.join(j.excluded) or '-'}")


@sandbox.command()
@click.argument("node")
@click.argument("scenario")
@DIR_OPTION
def fault(node: str, scenario: str, root: str) -> None:
    """Give NODE the simulated hardware SCENARIO (a shipped name, a path, or `clear`).

    \b
    Shipped scenarios: resilient-health check --help lists them. Examples:
      resilient-slurm sandbox fault node3 xid79     # a GPU falls off the bus
      resilient-slurm sandbox fault node3 clear     # healthy again
    The HealthCheckProgram notices within one interval and drains (or later resumes) NODE.
    """
    from resilient_slurm.config import ConfigError
    from resilient_slurm_lab.hardware.simulate import install_scenario

    paths = Paths(root)
    try:
        meta = read_meta(paths)
    except SandboxError as exc:
        _fail(exc)
    nodes = meta.get("nodes")
    known = [str(n) for n in nodes] if isinstance(nodes, list) else []
    if node not in known:
        raise click.BadParameter(f"{node} is not a node of this sandbox ({', '.join(known)})",
                                 param_hint="NODE")
    if scenario == "clear":
        # "clear" stands for a repaired, rebooted node: healthy hardware and a new boot id.
        from resilient_slurm.fsutil import atomic_write

        scenario = os.path.join(paths.node_dir(node), "repaired.toml")
        atomic_write(scenario, f'base = "healthy-p5"\n[kernel_log]\n'
                               f'boot_id = "sim-repaired-{time.time_ns()}"\n', mode=0o600)
    try:
        path = install_scenario(paths.node_dir(node), scenario)
    except (ConfigError, OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="SCENARIO") from None
    click.echo(f"{node}: simulated hardware is now {scenario} ({path})")


@sandbox.command("exec-as-user", context_settings={"ignore_unknown_options": True})
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--cwd", type=click.Path(file_okay=False),
              help="Directory to run in (default: the current one if the user may enter it, "
                   "else the user's work directory in the sandbox).")
@DIR_OPTION
def exec_as_user(argv: tuple[str, ...], cwd: str | None, root: str) -> None:
    """Run a command as the sandbox's job user, with this sandbox's SLURM_CONF.

    \b
    The environment is clean (PATH: this Python's bin directory, then the system's; HOME,
    USER, SLURM_CONF). Examples:
      resilient-slurm sandbox exec-as-user -- sbatch -N2 job.sh
      resilient-slurm sandbox exec-as-user -- srun -N2 id -un
    """
    from resilient_slurm_lab.sandbox.jobuser import exec_as

    try:
        exec_as(root, argv, cwd)
    except (SandboxError, OSError) as exc:
        _fail(exc)


@sandbox.group()
def controller() -> None:
    """Controller faults: stall, stop and start this sandbox's slurmctld (no other)."""


@controller.command()
@click.argument("seconds", type=click.FloatRange(min=0, min_open=True))
@click.option("--background", is_flag=True,
              help="Return as soon as slurmctld is stopped; it continues SECONDS later anyway.")
@DIR_OPTION
def stall(seconds: float, background: bool, root: str) -> None:
    """SIGSTOP slurmctld, SIGCONT it SECONDS later (a detached helper sends the SIGCONT)."""
    try:
        lifecycle.controller_stall(root, seconds, wait=not background)
    except SandboxError as exc:
        _fail(exc)
    click.echo(f"slurmctld {'stalled for' if background else 'was stalled'} {seconds:g}s")


@controller.command()
@DIR_OPTION
def stop(root: str) -> None:
    """Stop slurmctld (state kept in StateSaveLocation; nodes and jobs keep running)."""
    try:
        lifecycle.controller_stop(root)
    except SandboxError as exc:
        _fail(exc)
    click.echo("slurmctld stopped")


@controller.command()
@DIR_OPTION
def start(root: str) -> None:
    """Start slurmctld again from its saved state (running and pending jobs survive)."""
    try:
        pid = lifecycle.controller_start(root)
    except SandboxError as exc:
        _fail(exc)
    click.echo(f"slurmctld running again (pid {pid})")


@sandbox.command()
@click.option("--reset", is_flag=True, help="Zero the counts afterwards (sdiag --reset).")
@DIR_OPTION
def rpc(reset: bool, root: str) -> None:
    """slurmctld's RPC counts by message type and by user (from sdiag)."""
    try:
        counts = lifecycle.rpc_counts(root)
        if reset:
            lifecycle.rpc_reset(root)
    except SandboxError as exc:
        _fail(exc)
    for name, n in sorted(counts.by_type.items(), key=lambda kv: -kv[1]):
        click.echo(f"  {name:<40} {n}")
    for name, n in sorted(counts.by_user.items(), key=lambda kv: -kv[1]):
        click.echo(f"  user {name:<35} {n}")


@sandbox.group()
def node() -> None:
    """Node-loss faults: pause or kill one node's slurmd (and its jobs), start it again.

    \b
      resilient-slurm sandbox node pause node2 25   # NOT_RESPONDING, then back
      resilient-slurm sandbox node kill node2       # gone: DOWN after SlurmdTimeout
      resilient-slurm sandbox node start node2      # slurmd again; the node returns
    """


@node.command()
@click.argument("name", metavar="NODE")
@click.argument("seconds", type=click.FloatRange(min=0, min_open=True))
@click.option("--background", is_flag=True,
              help="Return as soon as slurmd is stopped; it continues SECONDS later anyway.")
@click.option("--notice/--no-notice", default=True, show_default=True,
              help="Make slurmctld try every slurmd at once (scontrol reconfigure), so the "
                   "node shows NOT_RESPONDING within MessageTimeout rather than at the next "
                   "ping (every SlurmdTimeout/3 s).")
@DIR_OPTION
def pause(name: str, seconds: float, background: bool, notice: bool, root: str) -> None:
    """SIGSTOP NODE's slurmd, SIGCONT it SECONDS later; its running job steps go on."""
    try:
        lifecycle.node_pause(root, name, seconds, wait=not background, notice=notice)
    except SandboxError as exc:
        _fail(exc)
    click.echo(f"slurmd of {name} {'paused for' if background else 'was paused'} {seconds:g}s")


@node.command()
@click.argument("name", metavar="NODE")
@DIR_OPTION
def kill(name: str, root: str) -> None:
    """SIGKILL NODE's slurmd, step daemons and job processes (the node is lost)."""
    try:
        pids = lifecycle.node_kill(root, name)
    except SandboxError as exc:
        _fail(exc)
    click.echo(f"{name} killed ({len(pids)} process(es)); DOWN after SlurmdTimeout")


@node.command("start")
@click.argument("name", metavar="NODE")
@DIR_OPTION
def node_start(name: str, root: str) -> None:
    """Start NODE's slurmd again and wait until the controller sees it respond."""
    try:
        pid = lifecycle.node_start(root, name)
    except (SandboxError, SlurmError) as exc:
        _fail(exc)
    click.echo(f"slurmd of {name} running again (pid {pid})")
