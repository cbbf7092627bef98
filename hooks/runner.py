"""One hook run on one node: check, record, act.

Shared by the prolog, the epilog and the HealthCheckProgram. Every run emits a ``verdict``
event, publishes the node's verdict file, refreshes the Prometheus textfile when configured,
and emits one event per action (``drain``, ``reboot``, ``resume``, ``action_failed``).

Cheap for the controller and never failing a healthy node: Slurm is asked only when an action
may be needed (the node is unhealthy, or it is healthy and our own marker says we drained it);
then about this node only. A healthy run makes no Slurm call at all, so a stalled controller
cannot fail it. Non-essential I/O (events, metrics, verdict file, a corrupt state file) is
reported on stderr and never changes the verdict or the exit status.

Exit status (``act``): ``healthcheck/exits.py``'s ``HOOK_EXITS``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.healthcheck.exits import EXIT_HEALTHY
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report
from resilient_slurm.hooks import nodestate, verdict
from resilient_slurm.hooks.config import HooksConfig
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.slurm import SlurmError, connect

ACTION_EVENTS = {nodestate.DRAIN: EventKind.DRAIN, nodestate.REBOOT: EventKind.REBOOT,
                 nodestate.RESUME: EventKind.RESUME}  # the event each node action emits


def warn(source: str, what: str, exc: BaseException | str) -> None:
    """Report a non-essential failure on stderr (slurmd logs it); never raises."""
    try:
        print(f"resilient-{source}: {what}: {exc} (verdict unaffected)", file=sys.stderr)
    except (OSError, ValueError):
        pass


class SafeEvents:
    """An :class:`EventLog` whose failures (full disk, read-only path) go to stderr."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def emit(self, kind: EventKind, **fields: Any) -> None:
        try:
            self.log.emit(kind, **fields)
        except (OSError, ValueError, TypeError) as exc:
            warn(self.log.source, f"event log {self.log.path}", exc)


def for_node(config: Config, node: str) -> Config:
    """``config`` with ``{node}`` replaced in the path-like keys of [health] and [hooks]."""

    def sub(obj: Any, keys: tuple[str, ...]) -> Any:
        changes = {k: getattr(obj, k).replace("{node}", node) for k in keys
                   if isinstance(getattr(obj, k), str)}
        return dataclasses.replace(obj, **changes)

    sections = dict(config.sections)
    sections["health"] = sub(sections["health"], ("state_dir", "simulate"))
    sections["hooks"] = sub(sections["hooks"], ("state_dir", "events_file", "metrics_file",
                                                "verdict_file"))
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
    hooks: HooksConfig = config.section("hooks")
    return hooks


def state_path(config: Config, name: str) -> str:
    return os.path.join(hooks_cfg(config).state_dir, name)


def ensure_state_dir(config: Config) -> str:
    """The hook's state directory: created 0700; refused (PermissionError) when it is a
    symlink, owned by someone else, group/world-writable, or under a parent others can
    change."""
    return fsutil.private_dir(hooks_cfg(config).state_dir)


def event_log(config: Config, source: str, ctx: HookContext) -> SafeEvents:
    return SafeEvents(EventLog(hooks_cfg(config).events_file, source, node=ctx.node,
                               job=ctx.job_id))


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


def record(config: Config, ctx: HookContext, source: str, report: Report, events: SafeEvents,
           **extra: Any) -> None:
    """The run's verdict: event, published verdict file, metrics (each failure only warned)."""
    events.emit(EventKind.VERDICT, **verdict_fields(report), **extra)
    hook_settings = hooks_cfg(config)
    if hook_settings.verdict_file:
        try:
            verdict.publish(hook_settings.verdict_file,
                            verdict.verdict_record(report, source, ctx.job_id))
        except OSError as exc:
            warn(source, f"verdict file {hook_settings.verdict_file}", exc)
    if hook_settings.metrics_file:
        from resilient_slurm.healthcheck.metrics import write_metrics as write

        try:
            write(hook_settings.metrics_file, report)
        except OSError as exc:
            warn(source, f"metrics file {hook_settings.metrics_file}", exc)


def load_state(config: Config, source: str) -> dict[str, Any]:
    """``streak.json`` (healthy streak, hold, our drain marker); corrupt or unreadable: {}."""
    path = state_path(config, "streak.json")
    try:
        state = fsutil.read_json(path, default={}, nofollow=True)
    except (OSError, ValueError) as exc:
        warn(source, f"state file {path} unreadable, starting afresh", exc)
        return {}
    return state if isinstance(state, dict) else {}


def save_state(config: Config, source: str, state: dict[str, Any]) -> None:
    path = state_path(config, "streak.json")
    try:
        fsutil.atomic_write_json(path, state, mode=0o600)
    except OSError as exc:
        warn(source, f"state file {path}", exc)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@contextlib.contextmanager
def node_lock(config: Config, source: str) -> Iterator[bool]:
    """The node lock around reading, deciding and writing the node's state: waited for up to
    ``lock_timeout_s``, then gone on without (never a reason to fail a hook; the state is
    written atomically, so at worst one healthy-streak update is lost). Yields whether held."""
    timeout = hooks_cfg(config).lock_timeout_s
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(fsutil.locked(state_path(config, "lock"), timeout=timeout))
        except (TimeoutError, OSError) as exc:
            warn(source, "node lock", exc)
            yield False
            return
        yield True


def act(config: Config, ctx: HookContext, report: Report, events: SafeEvents, *,
        may_resume: bool, source: str = "hook") -> int:
    """Decide and carry out the node action under the node lock; returns the exit status."""
    with node_lock(config, source):
        return _act(config, ctx, report, events, may_resume=may_resume, source=source)


def _act(config: Config, ctx: HookContext, report: Report, events: SafeEvents, *,
         may_resume: bool, source: str) -> int:
    hook_settings = hooks_cfg(config)
    state = load_state(config, source)
    healthy = report.status not in (FAIL, UNKNOWN)
    status = EXIT_HEALTHY if healthy else report.exit_code
    before = dict(state)
    if may_resume:
        state["healthy_streak"] = _int(state.get("healthy_streak")) + 1 if healthy else 0
        state["last_status"] = report.status
        state["updated_at"] = time.time()
    elif not healthy:
        state["healthy_streak"] = 0
    marker = state.get("drained")  # set before we drain: we may have drained this node
    if healthy and not (may_resume and marker):
        if state != before:
            save_state(config, source, state)
        return status  # healthy, nothing of ours to undo: no Slurm call at all
    conf = hook_settings.slurm_conf or None
    slurm = connect(conf=conf, backend="cli", timeout=hook_settings.slurm_timeout_s,
                    bin_dir=hook_settings.slurm_bin_dir, env={} if conf else None,
                    version_file=state_path(config, "slurm-version.json"))
    boot = (report.kernel_position or {}).get("boot_id")
    try:
        node = slurm.node(ctx.node)  # this node only
        ours = node.drain and nodestate.ours(node, hook_settings.owner_prefix)
        hold = state.get("hold")
        if isinstance(hold, dict) and (not ours
                                       or (boot and hold.get("boot_id") not in (None, boot))):
            hold = None  # an admin resumed the node, or it rebooted since
        decision = nodestate.decide(
            report, node, _int(state.get("healthy_streak")), prefix=hook_settings.owner_prefix,
            resume_after=hook_settings.resume_after, reboot_enabled=hook_settings.reboot_enabled,
            may_resume=may_resume, hold=hold.get("code") if isinstance(hold, dict) else None)
        cause = nodestate.hold_for(report)
        if cause is not None and decision.action in (nodestate.DRAIN, nodestate.REBOOT):
            hold = {"code": cause.drain_reason, "boot_id": boot, "since": time.time()}
        state["hold"] = hold
        if decision.action in (nodestate.DRAIN, nodestate.REBOOT):
            state["drained"] = {"reason": decision.reason, "since": time.time()}
            save_state(config, source, state)  # before acting: a drain that times out may
            #                                     still land, and must be ours to undo
        elif decision.action == nodestate.RESUME or (healthy and not ours):
            state.pop("drained", None)
        elif ours and not state.get("drained"):
            state["drained"] = {"reason": node.reason, "since": time.time()}
        if decision.action != nodestate.NONE:
            nodestate.apply(slurm, ctx.node, decision)
            events.emit(ACTION_EVENTS[decision.action], reason=decision.reason, cause=decision.why,
                        previous_state=node.describe())
        elif not healthy:
            events.emit(EventKind.DRAIN_SKIPPED, reason=decision.reason, cause=decision.why)
    except SlurmError as exc:
        events.emit(EventKind.ACTION_FAILED, cause=str(exc), status=report.status)
        warn(source, "Slurm", exc)
    if state != before:
        save_state(config, source, state)
    return status
