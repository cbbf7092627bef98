"""The repair loop's node side, in the health program (with ``[repair] enabled``).

For a node drained (or down) by us, after :func:`nodestate.decide`:

* the drain reason's repair tag (``hooks/ladder.py``) says what the controller's repair pass
  asked or did: ``reset`` -> reset the failing GPUs here, once the node is idle and no process
  holds them (``nvidia-smi --gpu-reset -i N``); ``valfail``, ``replace``, ``isolated``, a
  pending reboot -> wait for the repair pass;
* a node the health program would resume (healthy, no hold, ``resume_after`` runs) is first
  proven by the validation set (``resilient-health validate``: ``dcgmi diag`` at the repair
  level, the all-reduce and loopback bandwidth floors), run detached because it outlasts a
  health run; the node is resumed only once a validation started after its last drain or tag
  change, on this boot, passed. A failed (or unknown) validation tags the reason ``valfail``:
  the repair pass moves the node up its ladder.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Protocol

from resilient_slurm import proc
from resilient_slurm.config import Config
from resilient_slurm.events import EventKind, HoldReleased, Repair, Validation
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report
from resilient_slurm.hooks import holds, ladder, nodestate
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.repair_config import RepairConfig
from resilient_slurm.slurm import Node, SlurmBackend


class SafeEvents(Protocol):
    """The hooks' event log (``runner.SafeEvents``): failures never raise."""

    def emit(self, kind: EventKind, **fields: Any) -> None: ...

WAIT = ("valfail", "replace", "isolated")
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")


def repair_cfg(config: Config) -> RepairConfig:
    cfg: RepairConfig = config.section("repair")
    return cfg


def enabled(config: Config) -> bool:
    return "repair" in config.sections and repair_cfg(config).enabled


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"validate" in f.read()
    except OSError:
        return False


def start_validation(config: Config, ctx: HookContext) -> int:
    """``resilient-health validate --record`` in its own session (it outlives this run), on
    this run's hardware (``seams.current``); returns its pid. Its output goes to
    ``validate.log`` in the hook state directory."""
    from resilient_slurm.healthcheck.seams import current

    argv = [*current().health_command, "validate", "--record", "--node", ctx.node]
    if config.source:
        argv += ["--config", config.source]
    state_dir = config.section("hooks").state_dir
    log = os.open(os.path.join(state_dir, "validate.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,  # noqa: S603
                                 start_new_session=True, close_fds=True, cwd="/")
    finally:
        os.close(log)
    return child.pid


def gate(config: Config, ctx: HookContext, report: Report, events: SafeEvents,
         state: dict[str, Any], node: Node, slurm: SlurmBackend, decision: nodestate.Decision,
         held: list[holds.Hold], prefix: str) -> tuple[nodestate.Decision, list[holds.Hold]]:
    """The repair loop's word on ``decision`` for a node we took out (module docstring)."""
    code, device, tag = ladder.split_reason(node.reason, prefix)
    none = nodestate.NONE
    if tag in WAIT:
        return nodestate.Decision(none, node.reason, f"repair: {tag}: the repair pass acts "
                                  "next (resilient-slurm repair)"), held
    if node.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}:
        return nodestate.Decision(none, node.reason, "repair: reboot pending"), held
    if tag == "reset":
        return _reset(config, ctx, events, state, node, slurm, held, prefix, code, device)
    boot = (report.kernel_position or {}).get("boot_id")
    asked = state.get("repair") if isinstance(state.get("repair"), dict) else None
    if asked and asked.get("tag") == "reboot" and boot and asked.get("boot_id") != boot:
        asked.update(tag="rebooted", boot_id=boot)  # the reboot happened: validate next
    if tag == "reboot" and (asked is None or asked.get("tag") not in ("reboot", "rebooted")):
        return _reboot(ctx, events, state, node, slurm, prefix, code, device, boot), held
    if tag == "reboot" and asked and asked.get("tag") == "reboot":
        return nodestate.Decision(none, node.reason, "repair: reboot pending"), held
    if report.status in (FAIL, UNKNOWN) and tag in ("reboot", "replaced", "validate"):
        # The remediation did not fix it: the repair pass moves the node up its ladder (the
        # class stays the original fault's: its reason keeps the first code).
        reason = _failed(state, ctx, slurm, prefix, code, device)
        failing = [r.code for r in report.failing()]
        events.emit(EventKind.REPAIR, **Repair(node=ctx.node, step="check", cause=code,
                                               reason=reason, why=f"still failing after {tag}: "
                                               f"{', '.join(failing[:5])}"))
        return nodestate.Decision(none, reason, f"repair: still failing after {tag}"), held
    if decision.action != nodestate.RESUME:
        return decision, held
    return _validated(config, ctx, report, events, state, node, slurm, decision, prefix,
                      code, device), held


def _reboot(ctx: HookContext, events: SafeEvents, state: dict[str, Any], node: Node,
            slurm: SlurmBackend, prefix: str, code: str, device: str,
            boot: str | None) -> nodestate.Decision:
    """The repair pass asked for a reboot: record it here first (the node's state survives the
    reboot), then ``scontrol reboot ASAP nextstate=DOWN``."""
    reason = ladder.tagged(prefix, code, device, "reboot")
    state["repair"] = {"tag": "reboot", "code": code, "device": device, "boot_id": boot,
                       "time": time.time()}
    slurm.reboot_asap(ctx.node, reason, nextstate="DOWN")
    events.emit(EventKind.REPAIR, **Repair(node=ctx.node, step="reboot", cause=code,
                                           reason=reason, why="asked by the repair pass"))
    return nodestate.Decision(nodestate.NONE, reason, "repair: rebooting")


def _failed(state: dict[str, Any], ctx: HookContext, slurm: SlurmBackend, prefix: str,
            code: str, device: str) -> str:
    """The remediation did not make the node good: tag ``valfail`` (the repair pass moves it
    up its ladder; a reboot it asks next is a new one). Returns the reason."""
    reason = ladder.tagged(prefix, code, device, "valfail")
    asked = state.get("repair")
    if isinstance(asked, dict):
        asked["tag"] = "failed"
    slurm.drain(ctx.node, reason)
    return reason


def pending(state: dict[str, Any], boot: str | None) -> dict[str, Any] | None:
    """A repair reboot this node went through and has not been validated since (it keeps the
    node out even if Slurm returned it to service after the reboot)."""
    asked = state.get("repair")
    if not isinstance(asked, dict):
        return None
    done = asked.get("tag") == "reboot" and bool(boot) and asked.get("boot_id") != boot
    return asked if done or asked.get("tag") == "rebooted" else None


def keep_out(ctx: HookContext, events: SafeEvents, slurm: SlurmBackend, prefix: str,
             asked: dict[str, Any]) -> str:
    """Drain a node back from a repair reboot that Slurm returned to service: it takes no work
    until validated. Returns the reason."""
    reason = ladder.tagged(prefix, str(asked.get("code", "REPAIR")), str(asked.get("device", "")),
                           "reboot")
    slurm.drain(ctx.node, reason)
    events.emit(EventKind.REPAIR, **Repair(node=ctx.node, step="keep_out",
                                           cause=str(asked.get("code")),
                                           reason=reason, why="back from a repair reboot: out "
                                           "of service until validated"))
    return reason


def _validated(config: Config, ctx: HookContext, report: Report, events: SafeEvents,
               state: dict[str, Any], node: Node, slurm: SlurmBackend,
               decision: nodestate.Decision, prefix: str, code: str,
               device: str) -> nodestate.Decision:
    cfg = repair_cfg(config)
    now = time.time()
    boot = (report.kernel_position or {}).get("boot_id")
    since = max(float((state.get("drained") or {}).get("since") or 0.0),
                (node.reason_time or 0.0) - 1.0)
    raw = state.get("validation")
    val: dict[str, Any] | None = raw if isinstance(raw, dict) else None
    current = val is not None and val.get("boot_id") == boot \
        and float(val.get("started", 0)) >= since
    if val and current and val.get("status") == "running":
        if _alive(val.get("pid")) and now - float(val["started"]) < cfg.validate_budget_s + 60:
            since_s = now - float(val["started"])
            return nodestate.Decision(nodestate.NONE, node.reason,
                                      f"repair: validating for {since_s:.0f} s")
        val.update(status=UNKNOWN, codes=["VALIDATION_LOST"], finished=now,
                   reason="the validation process ended without a result")
    if val and current and val.get("status") in ("ok", "warn"):
        return nodestate.Decision(decision.action, decision.reason,
                                  f"{decision.why}; validated ({val.get('reason', 'passed')})")
    if val and current and val.get("status") in (FAIL, UNKNOWN):
        reason = _failed(state, ctx, slurm, prefix, code, device)
        events.emit(EventKind.REPAIR, **Repair(node=ctx.node, step="validate", cause=code,
                                               reason=reason, why="validation failed: "
                                               f"{', '.join(val.get('codes') or [])}"))
        return nodestate.Decision(nodestate.NONE, reason, "repair: validation failed")
    pid = start_validation(config, ctx)
    state["validation"] = {"status": "running", "pid": pid, "boot_id": boot, "started": now}
    events.emit(EventKind.VALIDATION, **Validation(outcome="started", reason=", ".join(
        cfg.validate_checks)))
    return nodestate.Decision(nodestate.NONE, node.reason, "repair: validation started")


def _reset(config: Config, ctx: HookContext, events: SafeEvents, state: dict[str, Any],
           node: Node, slurm: SlurmBackend, held: list[holds.Hold], prefix: str, code: str,
           device: str) -> tuple[nodestate.Decision, list[holds.Hold]]:
    none = nodestate.NONE
    if node.state in BUSY_STATES or node.flags & {"COMPLETING"}:
        return nodestate.Decision(none, node.reason, "repair: the GPU reset waits for the "
                                  "node to be idle"), held
    from resilient_slurm.healthcheck.seams import check_node, seams_for

    gpus = sorted({int(g) for h in held for g in (h.get("gpus") or [])})
    procs = check_node(config, check_set="epilog", node=ctx.node, only=["gpu_procs"],
                       gpu_indices=gpus or None)
    busy = [r for r in procs.results if r.check == "gpu_procs" and r.status in (FAIL, UNKNOWN)]
    if busy:
        return nodestate.Decision(none, node.reason, "repair: the GPU reset waits: "
                                  f"{busy[0].reason}"), held
    tool_path = seams_for(config, ctx.node).tool_path
    env = {"PATH": tool_path, "LANG": "C"}
    targets: list[list[str]] = [["-i", str(g)] for g in gpus] or [[]]
    outcomes = [proc.run(["nvidia-smi", "--gpu-reset", *t], 120.0, env=env,
                         search_path=tool_path) for t in targets]
    failed = [o for o in outcomes if o.kind != proc.OK]
    what = f"GPU(s) {', '.join(map(str, gpus))}" if gpus else "every GPU"
    if failed:
        reason = _failed(state, ctx, slurm, prefix, code, device)
        events.emit(EventKind.REPAIR, **Repair(node=ctx.node, step="reset_gpu", cause=code,
                                               reason=reason, why=f"reset of {what} failed: "
                                               f"{failed[0].describe()}"))
        return nodestate.Decision(none, reason, "repair: GPU reset failed"), held
    for h in held:
        events.emit(EventKind.HOLD_RELEASED, **HoldReleased(
            check=h.get("check"), code=h.get("code"), cause=f"{what} reset", by="hook"))
    reason = ladder.tagged(prefix, code, device, "validate")
    slurm.drain(ctx.node, reason)
    events.emit(EventKind.REPAIR, **Repair(node=ctx.node, step="reset_gpu", cause=code,
                                           reason=reason, why=f"{what} reset: validation next"))
    return nodestate.Decision(none, reason, "repair: GPU reset, validation next"), []
