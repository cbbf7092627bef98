"""Where the script saves (:func:`script_checkpoint_dir`, from its own arguments), the
launch options a parsed ``resilient-launch`` command line gives each cycle
(:func:`launch_options`), and the ranks' environment they add: the heartbeat floor when the
user chose no heartbeat timeout (:func:`adapt_env`), the instrumentation's bootstrap unless
``--no-instrument`` (:func:`instrument_env`)."""

from __future__ import annotations

import os

import click

from resilient_slurm.launcher.cycle import ft_config, plan, torchrun_args


def launch_options(ctx: click.Context) -> plan.LaunchOptions:
    """What shapes each cycle's command line, from the parsed command line (``ctx``: after
    ``TorchrunCommand.parse_args``): torchrun's passed-on flags first, then ``--ft-arg``s.
    Raises ``FtConfigError`` for an unreadable ``--ft-cfg-path``."""
    p = ctx.params
    found = ctx.meta.get("torchrun") or torchrun_args.Split()
    ft_args = (*found.passed, *p["ft_args"])
    return plan.LaunchOptions(
        script=p["script"], script_args=tuple(p["args"]), module=p["module"],
        nproc_per_node=p["nproc_per_node"],
        max_restarts=plan.ft_restart_budget(p["max_restarts"]),
        heartbeat_timeout=p["heartbeat_timeout"],
        initial_heartbeat_timeout=p["initial_heartbeat_timeout"],
        term_timeout=p["term_timeout"], ft_args=ft_args, srun_args=tuple(p["srun_args"]),
        ft_launcher=p["ft_launcher"], user_ft=ft_config.user_ft_settings(ft_args),
        extra_env={**adapt_env(ctx), **instrument_env(ctx)})


def instrument_env(ctx: click.Context) -> dict[str, str]:
    """The ranks' bootstrap (``launcher/instrument``) unless ``--no-instrument`` or
    ``--inprocess`` (whose training library keeps level 0's own heartbeats and timeouts)."""
    if ctx.params.get("no_instrument") or ctx.params.get("inprocess"):
        return {}
    from resilient_slurm.launcher import instrument

    return {k: v for k, v in instrument.worker_env(dict(os.environ)).items()
            if k in ("PYTHONPATH", instrument.ENABLE_ENV)}


def adapt_env(ctx: click.Context) -> dict[str, str]:
    """``RESILIENT_HEARTBEAT_FLOOR`` for the ranks when the user chose no heartbeat timeout:
    the script may then adapt it from its own heartbeats (docs/launcher.md)."""
    found = ctx.meta.get("torchrun") or torchrun_args.Split()
    user = ft_config.user_ft_settings((*found.passed, *ctx.params["ft_args"]))
    if ctx.get_parameter_source("heartbeat_timeout") is not click.core.ParameterSource.DEFAULT \
            or "rank_heartbeat_timeout" in user:
        return {}
    return {"RESILIENT_HEARTBEAT_FLOOR": f"{ctx.params['heartbeat_floor']:g}"}


# The script's own argument naming its checkpoint directory, as the frameworks' users spell it
# (the last dotted part of a config-style flag: --trainer.callbacks.dirpath, torchtitan's
# --checkpoint.folder under --job.dump_folder is not followed).
CHECKPOINT_FLAGS = frozenset({
    "checkpoint-dir", "checkpoint_dir", "checkpointdir", "ckpt-dir", "ckpt_dir", "ckptdir",
    "checkpoint-path", "checkpoint_path", "ckpt-path", "ckpt_path", "save-dir", "save_dir",
    "savedir", "save", "output-dir", "output_dir", "outdir", "out-dir", "out_dir", "dirpath",
    "default-root-dir", "default_root_dir", "checkpoints-dir", "checkpoints_dir"})


def script_checkpoint_dir(args: tuple[str, ...] | list[str]) -> str | None:
    """The checkpoint directory the script's arguments name (``--ckpt-dir D``,
    ``--output_dir=D``, ``--trainer.callbacks.dirpath D``...: :data:`CHECKPOINT_FLAGS`);
    the first one given, None when none is."""
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        name, eq, value = a[2:].partition("=")
        if name.rsplit(".", 1)[-1].lower() not in CHECKPOINT_FLAGS:
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") \
                else ""
        if value:
            return value
    return None
