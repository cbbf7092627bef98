"""``resilient-health validate``: the return-to-service validation set on this node.

``dcgmi diag`` at ``[repair] validate_dcgm_level`` (3 by default), the single-node all-reduce
bandwidth against the profile's floor, the fabric's loopback bandwidth against its floor
(``[repair] validate_checks``), the whole run within ``validate_budget_s``. An admin runs it by
hand; the health program starts it detached (``--record``) before lifting a drain of ours, and
the result lands in the node's hook state for the next health run (``hooks/node_repair.py``).

Exit status: 0 passed (warnings allowed), 1 a check failed, 3 a check could not tell
(unknown: never a pass), 2 usage or config error, 4 the hook state could not be written.
"""

from __future__ import annotations

import json
import sys
import time

import click

from resilient_slurm.config import Config
from resilient_slurm.events import EventKind, Validation
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.exits import EXIT_HOOK_ERROR
from resilient_slurm.hooks.repair_config import RepairConfig


def validation_config(config: Config) -> Config:
    """``config`` whose health engine runs the validation: the repair's DCGM level, its budget
    as the watchdog and the DCGM timeout."""
    cfg: RepairConfig = config.section("repair")
    return runner.with_health(config, dcgm_diag_level=cfg.validate_dcgm_level,
                              dcgm_diag_timeout_s=cfg.validate_budget_s,
                              watchdog_s=cfg.validate_budget_s,
                              validate_timeout_s=min(config.health.validate_timeout_s,
                                                     cfg.validate_budget_s))


def run_validation(config: Config, ctx: HookContext) -> Report:
    from resilient_slurm.healthcheck.seams import check_node

    cfg: RepairConfig = config.section("repair")
    return check_node(validation_config(config), check_set="validate",
                      only=list(cfg.validate_checks), node=ctx.node)


def record(config: Config, ctx: HookContext, report: Report, started: float) -> None:
    """The result into the node's hook state (under the node lock) and the event log."""
    from resilient_slurm.healthcheck.seams import klog_for

    src, _ = klog_for(config, ctx.node)
    failing = report.failing()
    codes = [r.code for r in failing]
    why = failing[0].reason[:200] if failing else f"{len(report.results)} checks passed"
    result = {"status": report.status, "codes": codes, "reason": why,
              "boot_id": src.boot_id(), "started": started, "finished": time.time()}
    with runner.node_lock(config, "validate"):
        state = runner.load_state(config, "validate")
        previous = state.get("validation")
        if isinstance(previous, dict) and previous.get("status") == "running":
            result["started"] = previous.get("started", started)
        state["validation"] = result
        runner.save_state(config, "validate", state)
    events = runner.event_log(config, "validate", ctx)
    events.emit(EventKind.VALIDATION, **Validation(
        outcome="passed" if report.status not in (FAIL, UNKNOWN) else "failed",
        status=report.status, codes=codes, reason=why,
        duration_s=round(report.duration_s, 3)))


def register(main: click.Group) -> None:
    from resilient_slurm.hooks.admin import CONFIG_HELP, NODE_HELP, _setup

    @main.command("validate")
    @click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
    @click.option("--node", help=NODE_HELP)
    @click.option("--record", "record_it", is_flag=True,
                  help="Write the result to the node's hook state, where the health program "
                       "reads it before lifting a drain of ours (what it runs itself).")
    @click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
    def validate_cmd(config_path: str | None, node: str | None, record_it: bool,
                     as_json: bool) -> None:
        """Prove this node before it takes work: DCGM diag and bandwidth floors.

        \b
        The set ([repair] validate_checks): dcgm_diag at [repair] validate_dcgm_level
        (3: about 15 minutes on 8 GPUs), allreduce_bw (nccl-tests' all_reduce_perf,
        else a torch.distributed probe) against the profile's allreduce_busbw_gbps, and
        loopback_bw (fi_pingpong on EFA, ib_write_bw on InfiniBand) against its
        loopback_gbps. A missing tool or floor is unknown: the node stays out.
        \b
        Exit: 0 passed, 1 a check failed, 3 unknown, 2 usage/config, 4 state not written.
        """
        config, ctx = _setup(config_path, node)
        started = time.time()
        report = run_validation(config, ctx)
        if record_it:
            try:
                record(config, ctx, report, started)
            except OSError as exc:
                click.echo(f"resilient-health: validation result not recorded: {exc}", err=True)
                sys.exit(EXIT_HOOK_ERROR)
        if as_json:
            click.echo(json.dumps(report.to_json(), indent=2))
        else:
            for r in report.results:
                click.echo(f"{r.status.upper():8} {r.check:14} {r.code:22} {r.reason}")
            click.echo(f"validation: {report.status} ({report.duration_s:.1f} s)")
        sys.exit(report.exit_code if report.status in (FAIL, UNKNOWN) else 0)
