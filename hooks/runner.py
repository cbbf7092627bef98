"""One hook run on one node: check, record, act.

Shared by the prolog, the epilog and the HealthCheckProgram. Every run emits a ``verdict``
event, publishes the node's verdict file, refreshes the Prometheus textfile when configured,
and emits one event per action (``drain``, ``reboot``, ``resume``, ``action_failed``).

Cheap for the controller and never failing a healthy node: Slurm is asked only when an action
may be needed (the node is unhealthy, or it is healthy and our own marker says we drained it);
then about this node only, plus, before a drain, one read of the drained set for the fleet
guard (``hooks/fleet.py``). A healthy run makes no Slurm call at all, so a stalled controller
cannot fail it. Holds (``hooks/holds.py``) are kept in the state file beside the healthy
streak: recorded for each failing check when we drain, released when the check passes again.
Non-essential I/O (events, metrics, verdict file, a corrupt state file) is reported on stderr
and never changes the verdict or the exit status.

Exit status (``act``): ``hooks/exits.py``'s ``HOOK_EXITS``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from resilient_slurm import fsutil, verdict_file
from resilient_slurm.config import Config
from resilient_slurm.events import (
    ActionFailed,
    DrainSkipped,
    EventKind,
    EventLog,
    FleetGuard,
    Hold,
    HoldReleased,
    HookVerdict,
    NodeAction,
)
from resilient_slurm.healthcheck.exits import EXIT_HEALTHY, EXIT_UNHEALTHY
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report
from resilient_slurm.hooks import fleet, holds, node_repair, nodestate, verdict
from resilient_slurm.hooks.config import HooksConfig
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.slurm import SlurmBackend, SlurmError, connect

ACTION_EVENTS = {nodestate.DRAIN: EventKind.DRAIN, nodestate.REBOOT: EventKind.REBOOT,
                 nodestate.RESUME: EventKind.RESUME}  # the event each node action emits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from resilient_slurm.healthcheck.metrics import NodeFacts


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
    sections["health"] = sub(sections["health"], ("state_dir",))
    sections["hooks"] = sub(sections["hooks"], ("state_dir", "events_file", "metrics_file",
                                                "verdict_file", "memory_tier_dir"))
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


def verdict_fields(report: Report) -> HookVerdict:
    failing = report.failing()
    return HookVerdict(
        status=report.status,
        check=failing[0].check if failing else None,
        code=failing[0].code if failing else None,
        reason=failing[0].reason if failing else "healthy",
        evidence=[r.to_json() for r in failing] or None,
        simulated=report.simulated,
        check_set=report.check_set,
        duration_s=round(report.duration_s, 3),
        results=len(report.results),
    )


def record(config: Config, ctx: HookContext, source: str, report: Report, events: SafeEvents,
           precursor_codes: Sequence[str] = (), **extra: Unpack[HookVerdict]) -> None:
    """The run's verdict: event, published verdict file, metrics (each failure only warned);
    ``precursor_codes``: the precursors found (``hooks/precursor.py``)."""
    fields = verdict_fields(report)
    fields.update(extra)
    if precursor_codes:
        fields["precursors"] = list(precursor_codes)
    events.emit(EventKind.VERDICT, **fields)
    hook_settings = hooks_cfg(config)
    if hook_settings.verdict_file:
        try:
            verdict_file.publish(hook_settings.verdict_file,
                                 verdict.verdict_record(report, source, ctx.job_id,
                                                        precursors=precursor_codes))
        except OSError as exc:
            warn(source, f"verdict file {hook_settings.verdict_file}", exc)
    if hook_settings.metrics_file:
        from resilient_slurm.healthcheck.metrics import write_metrics as write

        try:
            write(hook_settings.metrics_file, report, source=source,
                  facts=node_facts(config, source) if source == "health" else None)
        except OSError as exc:
            warn(source, f"metrics file {hook_settings.metrics_file}", exc)


def node_facts(config: Config, source: str) -> NodeFacts:
    """The health program's facts about its node for the metrics file (``NodeFacts``)."""
    from resilient_slurm.healthcheck.metrics import NodeFacts

    hook_settings = hooks_cfg(config)
    state = load_state(config, source)
    marker = state.get("drained")
    reason = marker.get("reason") if isinstance(marker, dict) else None
    return NodeFacts(health_interval(hook_settings),
                     fleet.cause_of(reason, hook_settings.owner_prefix)
                     if isinstance(reason, str) else None,
                     _int(state.get("drains_total")), hook_settings.max_drain_fraction)


def health_interval(hook_settings: HooksConfig) -> float | None:
    """slurm.conf's ``HealthCheckInterval`` (``[hooks] slurm_conf``, else the default path),
    or None when it cannot be read or is not set."""
    import re

    try:
        with open(hook_settings.slurm_conf or "/etc/slurm/slurm.conf", encoding="utf-8",
                  errors="replace") as fh:
            found = re.search(r"^\s*HealthCheckInterval\s*=\s*(\d+)", fh.read(1 << 20),
                              re.IGNORECASE | re.MULTILINE)
    except OSError:
        return None
    return float(found.group(1)) if found and int(found.group(1)) > 0 else None


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
        may_resume: bool, source: str = "hook", scope: Sequence[int] | None = None,
        rechecked: Collection[str] = ()) -> int:
    """Decide and carry out the node action under the node lock; returns the exit status.

    ``scope``: the GPU indices the run's GPU checks covered (None: every GPU), which says
    whether a passing check proves a hold on some GPU good (``hooks/holds.py``).
    ``rechecked``: checks this run ran only because a hold named them; if that hold ended
    before the lock was had (an admin's ``clear-hold`` while the run checked), their results
    are the admin's call, not new evidence, and are left out."""
    with node_lock(config, source):
        state = load_state(config, source)
        ended = set(rechecked) - {h.get("check") for h in holds.load(state)}
        kept = [r for r in report.results if r.check not in ended]
        if ended and kept:
            print(f"resilient-{source}: the hold on {', '.join(sorted(ended))} ended while "
                  "this run re-ran it (clear-hold): its result is left out", file=sys.stderr)
            report = dataclasses.replace(report, results=kept)
        return _act(config, ctx, report, events, state, may_resume=may_resume, source=source,
                    scope=scope)


def _released(events: SafeEvents, gone: list[tuple[holds.Hold, str]], by: str = "hook") -> None:
    for hold, why in gone:
        events.emit(EventKind.HOLD_RELEASED, **HoldReleased(
            check=hold.get("check"), code=hold.get("code"), cause=why, by=by))


def _act(config: Config, ctx: HookContext, report: Report, events: SafeEvents,
         state: dict[str, Any], *, may_resume: bool, source: str,
         scope: Sequence[int] | None) -> int:
    """``act`` under the node lock, on ``state`` as read under it."""
    hook_settings = hooks_cfg(config)
    healthy = report.status not in (FAIL, UNKNOWN)
    status = EXIT_HEALTHY if healthy else report.exit_code
    before = dict(state)
    boot = (report.kernel_position or {}).get("boot_id")
    held, gone = holds.release(holds.load(state), report, boot, scope)
    _released(events, gone)
    holds.store(state, held)
    if may_resume:
        state["healthy_streak"] = _int(state.get("healthy_streak")) + 1 if healthy else 0
        state["last_status"] = report.status
        state["updated_at"] = time.time()
    elif not healthy:
        state["healthy_streak"] = 0
    marker = state.get("drained")  # set before we drain: we may have drained this node
    repairing = node_repair.enabled(config) and node_repair.pending(state, boot)
    # No state at all (a new machine, a wiped disk): ask Slurm whether we drained it, until
    # it is in service or ours (a powered-up replacement is drained before its reason is set).
    adopt = not before or state.get("adopt")
    if healthy and not (may_resume and (marker or adopt)) and not repairing:
        if state != before:
            save_state(config, source, state)
        return status  # healthy, nothing of ours to undo: no Slurm call at all
    conf = hook_settings.slurm_conf or None
    slurm = connect(conf=conf, backend="cli", timeout=hook_settings.slurm_timeout_s,
                    bin_dir=hook_settings.slurm_bin_dir, env={} if conf else None,
                    version_file=state_path(config, "slurm-version.json"))
    try:
        node = slurm.node(ctx.node)  # this node only
        ours = nodestate.out_by_us(node, hook_settings.owner_prefix)
        if repairing and not ours:  # back from a repair reboot, in service: not before validated
            reason = node_repair.keep_out(ctx, events, slurm, hook_settings.owner_prefix,
                                          repairing)
            state["drained"] = {"reason": reason, "since": time.time()}
            save_state(config, source, state)
            return status if may_resume else EXIT_UNHEALTHY  # the prolog refuses the job
        if held and not ours:  # an admin resumed (or re-drained) the node: their call
            _released(events, [(h, "the node is no longer drained by us") for h in held])
            held = []
        decision = nodestate.decide(
            report, node, _int(state.get("healthy_streak")), prefix=hook_settings.owner_prefix,
            resume_after=hook_settings.resume_after, reboot_enabled=hook_settings.reboot_enabled,
            may_resume=may_resume, hold=holds.summary(held))
        if ours and may_resume and node_repair.enabled(config):
            decision, held = node_repair.gate(config, ctx, report, events, state, node, slurm,
                                              decision, held, hook_settings.owner_prefix)
        guarded = decision.action in (nodestate.DRAIN, nodestate.REBOOT) and fleet.enabled(
            hook_settings.max_drain_fraction, hook_settings.max_drains_per_interval)
        if guarded and not _fleet_allows(slurm, config, ctx, report, events, source,
                                         decision.reason, drained=False):
            holds.store(state, held)
            if state != before:
                save_state(config, source, state)
            return EXIT_HEALTHY  # kept up: a non-zero prolog/epilog would drain it
        held_before = list(held)
        if not healthy and (decision.action in (nodestate.DRAIN, nodestate.REBOOT) or ours):
            known = {h.get("check") for h in held}
            held = holds.record(held, report, source, boot, scope)
            for h in held:
                if h.get("check") not in known:
                    events.emit(EventKind.HOLD, **Hold(
                        check=h.get("check"), code=h.get("code"), device=h.get("device"),
                        gpus=h.get("gpus"), once=h.get("once"), until=holds.until(h)))
        holds.store(state, held)
        if decision.action in (nodestate.DRAIN, nodestate.REBOOT):
            state["drained"] = {"reason": decision.reason, "since": time.time()}
            state["drains_total"] = _int(state.get("drains_total")) + 1
            save_state(config, source, state)  # before acting: a drain that times out may
            #                                     still land, and must be ours to undo
        elif decision.action == nodestate.RESUME or (healthy and not ours):
            state.pop("drained", None)
            if adopt and (node.drain or node.state == "DOWN") and not node.reason:
                state["adopt"] = True  # out, no reason yet: ask again next run
            else:
                state.pop("adopt", None)
            if decision.action == nodestate.RESUME:
                state.pop("repair", None)  # validated (node_repair): the repair is over
        elif ours and not state.get("drained"):
            state["drained"] = {"reason": node.reason, "since": time.time()}
            state.pop("adopt", None)
        if decision.action != nodestate.NONE:
            nodestate.apply(slurm, ctx.node, decision)
            events.emit(ACTION_EVENTS[decision.action], **NodeAction(
                reason=decision.reason, cause=decision.why, previous_state=node.describe()))
        elif not healthy:
            events.emit(EventKind.DRAIN_SKIPPED,
                        **DrainSkipped(reason=decision.reason, cause=decision.why))
        if guarded and decision.action == nodestate.DRAIN:
            time.sleep(fleet.SETTLE_S)  # then confirm: others may have drained with us
            if not _fleet_allows(slurm, config, ctx, report, events, source, decision.reason,
                                 drained=True):
                slurm.resume(ctx.node)
                state.pop("drained", None)
                state["drains_total"] = max(_int(state.get("drains_total")) - 1, 0)
                holds.store(state, held_before)
                save_state(config, source, state)
                return EXIT_HEALTHY
    except SlurmError as exc:
        events.emit(EventKind.ACTION_FAILED, **ActionFailed(cause=str(exc), status=report.status))
        warn(source, "Slurm", exc)
    if state != before:
        save_state(config, source, state)
    return status


def _fleet_allows(slurm: SlurmBackend, config: Config, ctx: HookContext, report: Report,
                 events: SafeEvents, source: str, reason: str, *, drained: bool) -> bool:
    """The fleet guard on draining (``drained``: keeping drained) this node, from one census
    query; when it says no, the shared cause is raised (event, stderr, syslog). An unreadable
    census allows: the node is bad and nothing says the fleet is."""
    hook_settings = hooks_cfg(config)
    causes = nodestate.root_causes(report)
    cause = causes[0].code if causes else "UNKNOWN"
    try:
        seen = fleet.census(slurm)
    except SlurmError as exc:
        warn(source, "fleet guard: drained set unreadable, draining anyway", exc)
        return True
    guard = fleet.decide(cause, ctx.node, seen, prefix=hook_settings.owner_prefix,
                         max_fraction=hook_settings.max_drain_fraction,
                         max_per_interval=hook_settings.max_drains_per_interval,
                         interval_s=hook_settings.drain_interval_s, now=time.time(),
                         drained=drained)
    if not guard.allow:
        events.emit(EventKind.FLEET_GUARD, **FleetGuard(
            cause=guard.cause, same=guard.same, total=guard.total, recent=guard.recent,
            why=guard.why, reason=reason, undone=drained))
        fleet.shout(source, ctx.node, guard, undone=drained)
    return guard.allow
