"""``resilient-health holds`` and ``resilient-health clear-hold``: an admin's view of the holds
that keep a node drained (``hooks/holds.py``), and the way to end them.

Both read the root config file as the hooks do (``--config``, default
``/etc/resilient-slurm/config.toml``; nothing from the environment) and this node's hook state
(root-only). ``clear-hold`` ends holds under the node lock and emits ``hold_released``
(``by: admin``); it does not resume the node: the health program does that after
``resume_after`` healthy runs (or ``scontrol update nodename=NODE state=resume`` now).
``--recheck`` re-runs each held check on the GPUs its hold names, with the epilog's DCGM level
and budget for ``dcgm_diag``, and ends only the holds whose check passes.

Exit status: 0 done (or nothing held), 1 ``--recheck`` found a held check still failing (or
kernel-log evidence no re-run can clear), 2 usage or config error, 4 the hook state could not
be read or written (not root?).
"""

from __future__ import annotations

import datetime as _dt
import json
import sys

import click

from resilient_slurm import fsutil
from resilient_slurm.config import DEFAULT_PATH, Config, ConfigError, load_config
from resilient_slurm.events import EventKind, HoldReleased
from resilient_slurm.healthcheck.exits import EXIT_USAGE
from resilient_slurm.hooks import holds, runner
from resilient_slurm.hooks.config import HooksConfig  # noqa: F401 - registers [hooks]
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.exits import EXIT_HOOK_ERROR

NODE_HELP = "Node name (default $SLURMD_NODENAME or the short hostname)."
CONFIG_HELP = f"Config file (default {DEFAULT_PATH}; the environment is not read)."


def _fail(code: int, message: str) -> None:
    click.echo(f"resilient-health: {message}", err=True)
    sys.exit(code)


def _setup(config_path: str | None, node: str | None) -> tuple[Config, HookContext]:
    from resilient_slurm.healthcheck.seams import default_node
    from resilient_slurm.hooks.entry import check_config_file

    path = config_path or DEFAULT_PATH
    name = node or default_node()
    try:
        check_config_file(path)
        config = runner.for_node(load_config(path, env={}), name)
    except ConfigError as exc:
        _fail(EXIT_USAGE, str(exc))
        raise  # unreachable: _fail exits
    try:
        runner.ensure_state_dir(config)
    except OSError as exc:
        _fail(EXIT_HOOK_ERROR, f"{name}'s hook state ({runner.hooks_cfg(config).state_dir}): "
              f"{exc} (run as root)")
    return config, HookContext(node=name)


def _when(ts: object) -> str:
    if not isinstance(ts, (int, float)):
        return "?"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="seconds")


def _line(h: holds.Hold) -> str:
    gpus = h.get("gpus")
    scope = f" gpus {','.join(map(str, gpus))}" if gpus else ""
    return (f"{holds.describe(h)}{scope}, since {_when(h.get('since'))}: {h.get('reason') or ''}"
            f"\n    until {holds.until(h)}")


def _recheck(config: Config, ctx: HookContext, chosen: list[holds.Hold]
             ) -> tuple[list[holds.Hold], list[tuple[holds.Hold, str]]]:
    """(still held, [(released, why)]) after re-running each chosen hold's check."""
    from resilient_slurm.hooks.entry import check

    hook_settings = runner.hooks_cfg(config)
    kept: list[holds.Hold] = []
    gone: list[tuple[holds.Hold, str]] = []
    for h in chosen:
        name = str(h.get("check") or "")
        if h.get("once") or not name:
            kept.append(h)
            continue
        cfg, budget = config, max(hook_settings.health_budget_s, config.health.watchdog_s)
        if name == "dcgm_diag":
            budget = hook_settings.diag_budget_s()
            cfg = runner.with_health(config, dcgm_diag_level=hook_settings.epilog_diag_level,
                                     dcgm_diag_timeout_s=budget, watchdog_s=budget + 1.0)
            budget += 1.0
        report = check(cfg, ctx, "epilog", budget, only=[name], gpu_indices=h.get("gpus"))
        left, freed = holds.release([h], report, None, None)
        kept += left
        gone += freed
        for r in report.failing():
            click.echo(f"  {r.check} {r.code} {r.device or ''}: {r.reason}")
    return kept, gone


def holds_cmd(config_path: str | None, node: str | None, as_json: bool) -> None:
    config, ctx = _setup(config_path, node)
    held = holds.load(runner.load_state(config, "admin"))
    if as_json:
        click.echo(json.dumps({"node": ctx.node, "holds": held}, indent=1))
    elif not held:
        click.echo(f"{ctx.node}: no holds")
    else:
        click.echo(f"{ctx.node}: {len(held)} hold(s) keep the node drained")
        for h in held:
            click.echo("  " + _line(h))


def clear_hold_cmd(config_path: str | None, node: str | None, checks: tuple[str, ...],
                   recheck: bool) -> None:
    config, ctx = _setup(config_path, node)
    events = runner.event_log(config, "admin", ctx)
    hook_settings = runner.hooks_cfg(config)
    with runner.node_lock(config, "admin"):
        state = runner.load_state(config, "admin")
        held = holds.load(state)
        if not held:
            click.echo(f"{ctx.node}: no holds; nothing to clear")
            return
        unknown = sorted(set(checks) - {str(h.get("check")) for h in held})
        if unknown:
            _fail(EXIT_USAGE, f"{ctx.node} has no hold for {', '.join(unknown)} (held: "
                  f"{', '.join(str(h.get('check') or h.get('code')) for h in held)})")
        chosen = [h for h in held if not checks or h.get("check") in checks]
        others = [h for h in held if h not in chosen]
        if recheck:
            kept, gone = _recheck(config, ctx, chosen)
        else:
            kept, gone = [], [(h, "cleared by an admin (resilient-health clear-hold)")
                              for h in chosen]
        holds.store(state, others + kept)
        try:
            fsutil.atomic_write_json(runner.state_path(config, "streak.json"), state, mode=0o600)
        except OSError as exc:
            _fail(EXIT_HOOK_ERROR, f"could not write the hook state: {exc}")
    for h, why in gone:
        events.emit(EventKind.HOLD_RELEASED, **HoldReleased(
            check=h.get("check"), code=h.get("code"), cause=why, by="admin"))
        click.echo(f"cleared hold {holds.describe(h)}: {why}")
    for h in kept:
        click.echo(f"kept hold {holds.describe(h)}: until {holds.until(h)}")
    if others + kept:
        click.echo(f"{ctx.node} stays drained: {len(others + kept)} hold(s) left")
    else:
        click.echo(f"{ctx.node}: no holds left. The health program resumes it after "
                   f"{hook_settings.resume_after} healthy run(s) (hooks.resume_after) if we "
                   f"drained it; `scontrol update nodename={ctx.node} state=resume` resumes it "
                   "now.")
    if kept:
        sys.exit(1)


def register(group: click.Group) -> None:
    """Add ``holds`` and ``clear-hold`` to the ``resilient-health`` command group."""

    @group.command("holds")
    @click.option("--node", help=NODE_HELP)
    @click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
    @click.option("--json", "as_json", is_flag=True, help="Print the holds as JSON.")
    def _holds(node: str | None, config_path: str | None, as_json: bool) -> None:
        """Show what keeps this node drained: each hold's check, evidence and what ends it."""
        holds_cmd(config_path, node, as_json)

    @group.command("clear-hold", epilog="\b\nExit codes:\n  0  cleared (or nothing held)\n"
                   "  1  --recheck: a held check still fails, or kernel-log evidence remains\n"
                   "  2  usage or configuration error\n"
                   "  4  the hook state could not be read or written (run as root)")
    @click.option("--node", help=NODE_HELP)
    @click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
    @click.option("--check", "checks", multiple=True,
                  help="Only the hold of this check (repeatable; default: every hold).")
    @click.option("--recheck", is_flag=True,
                  help="Re-run each held check on its GPUs (dcgm_diag at the epilog's level) "
                       "and clear only those that pass.")
    def _clear(node: str | None, config_path: str | None, checks: tuple[str, ...],
               recheck: bool) -> None:
        """End the holds that keep this node drained after a failure (see `holds`).

        \b
        A hold ends by itself when its check passes again (the health program re-runs
        gpu_procs and gpu_memory) or the node reboots; kernel-log evidence (a fatal Xid) and
        a failed dcgm_diag need a reboot or this command. The node is not resumed here: the
        health program resumes it after hooks.resume_after healthy runs.
        """
        clear_hold_cmd(config_path, node, checks, recheck)


__all__ = ["clear_hold_cmd", "holds_cmd", "register"]
