"""One hook run on one node: lock, check, record, act.

Shared by the prolog, the epilog and the HealthCheckProgram. Every run emits a ``verdict``
event and one event per action (``drain``, ``reboot``, ``resume``, ``action_failed``), and
refreshes the Prometheus textfile when configured. Exit status: 0 healthy, 1 unhealthy (the
node was drained, or could not be), 3 unknown result (treated as unhealthy), 4 the hook itself
could not run (lock busy, Slurm unreachable while acting).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.events import EventLog
from resilient_slurm.healthcheck.model import Report
from resilient_slurm.hooks import nodestate
from resilient_slurm.hooks.config import HooksConfig
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.slurm import SlurmError, connect

EXIT_HOOK_ERROR = 4


def for_node(config: Config, node: str) -> Config:
    """``config`` with ``{node}`` replaced in the path-like keys of [health] and [hooks]."""

    def sub(obj: Any, keys: tuple[str, ...]) -> Any:
        changes = {k: getattr(obj, k).replace("{node}", node) for k in keys
                   if isinstance(getattr(obj, k), str)}
        return dataclasses.replace(obj, **changes)

    sections = dict(config.sections)
    sections["health"] = sub(sections["health"], ("state_dir", "simulate"))
    sections["hooks"] = sub(sections["hooks"], ("state_dir", "events_file", "metrics_file"))
    return Config(sections, config.source)


def with_health(config: Config, **changes: Any) -> Config:
    """``config`` with some [health] keys replaced."""
    sections = dict(config.sections)
    sections["health"] = dataclasses.replace(config.health, **changes)
    return Config(sections, config.source)


def with_budget(config: Config, budget_s: float) -> Config:
    """``config`` whose health watchdog fits inside ``budget_s``."""
    return with_health(config, watchdog_s=min(config.health.watchdog_s, budget_s))


def hooks_cfg(config: Config) -> HooksConfig:
    return config.section("hooks")  # type: ignore[no-any-return]


def state_path(config: Config, name: str) -> str:
    return os.path.join(hooks_cfg(config).state_dir, name)


def ensure_state_dir(config: Config) -> str:
    """The hook's state directory: created 0700, must be owned by us (root on a cluster)."""
    path = hooks_cfg(config).state_dir
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.geteuid() or (st.st_mode & 0o022):
        raise PermissionError(f"{path} must be owned by uid {os.geteuid()} and not "
                              "group/world-writable")
    return path


def event_log(config: Config, source: str, ctx: HookContext) -> EventLog:
    return EventLog(hooks_cfg(config).events_file, source, node=ctx.node, job=ctx.job_id)


def verdict_fields(report: Report) -> dict[str, Any]:
    failing = report.failing()
    return {
        "status": report.status,
        "check": failing[0].check if failing else None,
        "code": failing[0].code if failing else None,
        "reason": failing[0].reason if failing else "healthy",
        "evidence": [r.to_json() for r in failing] or None,
        "simulated": report.simulated,
        "check_set": report.check_set,
        "duration_s": round(report.duration_s, 3),
        "results": len(report.results),
    }


def write_metrics(config: Config, report: Report) -> None:
    path = hooks_cfg(config).metrics_file
    if not path:
        return
    from resilient_slurm.healthcheck.metrics import write_metrics as write

    write(path, report)


def act(config: Config, ctx: HookContext, report: Report, events: EventLog, *,
        may_resume: bool) -> int:
    """Decide and carry out the node action; returns the hook's exit status."""
    hk = hooks_cfg(config)
    streak_file = state_path(config, "streak.json")
    state = fsutil.read_json(streak_file, default={}) or {}
    healthy = report.status not in ("fail", "unknown")
    if may_resume:
        state["healthy_streak"] = int(state.get("healthy_streak", 0)) + 1 if healthy else 0
        state["last_status"] = report.status
        state["updated_at"] = time.time()
        fsutil.atomic_write_json(streak_file, state, mode=0o600)
    elif not healthy:
        state["healthy_streak"] = 0
        fsutil.atomic_write_json(streak_file, state, mode=0o600)
    status = 0 if healthy else report.exit_code
    conf = hk.slurm_conf or None
    slurm = connect(conf=conf, backend="cli", timeout=hk.slurm_timeout_s,
                    bin_dir=hk.slurm_bin_dir, env={} if conf else None)
    boot = (report.kernel_position or {}).get("boot_id")
    try:
        node = slurm.node(ctx.node)
        hold = state.get("hold")
        if isinstance(hold, dict) and (not (node.drain and nodestate.ours(node, hk.owner_prefix))
                                       or (boot and hold.get("boot_id") not in (None, boot))):
            hold = None  # an admin resumed the node, or it rebooted since
        decision = nodestate.decide(
            report, node, int(state.get("healthy_streak", 0)), prefix=hk.owner_prefix,
            resume_after=hk.resume_after, reboot_enabled=hk.reboot_enabled,
            may_resume=may_resume, hold=hold.get("code") if isinstance(hold, dict) else None)
        cause = nodestate.hold_for(report)
        if cause is not None and decision.action in (nodestate.DRAIN, nodestate.REBOOT):
            hold = {"code": cause.drain_reason, "boot_id": boot, "since": time.time()}
        if hold != state.get("hold"):
            state["hold"] = hold
            fsutil.atomic_write_json(streak_file, state, mode=0o600)
        if decision.action != nodestate.NONE:
            nodestate.apply(slurm, ctx.node, decision)
            events.emit(decision.action, reason=decision.reason, cause=decision.why,
                        previous_state=node.describe())
        elif not healthy:
            events.emit("drain_skipped", reason=decision.reason, cause=decision.why)
    except SlurmError as exc:
        events.emit("action_failed", cause=str(exc), status=report.status)
        return status or EXIT_HOOK_ERROR
    return status
