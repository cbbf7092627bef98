"""The repair loop's controller side: ``resilient-slurm repair`` (an admin's timer, one pass a
minute, on a host with Slurm admin rights).

One pass reads every node from one ``sinfo`` (``slurm.nodes_brief``: one RPC whatever the
cluster's size), then for each node drained or down by us (our reason prefix):

* a fresh fault, or a validation that failed (tag ``valfail``): the node's class
  (``hooks/ladder.py``) and the next step of its ladder from the ledger; the step is taken
  (reboot and replace only within the budgets), recorded in the ledger and as an event. A
  reboot or a GPU reset is asked of the node (its tag): its health program records it in the
  node's own state, then carries it out, so that a node Slurm puts back in service after the
  reboot is taken out again until validated;
* powered down for replacement (``replace``, Slurm's POWERED_DOWN): drained as ``replaced``
  and powered up (the site's ResumeProgram: a new machine), to be validated before work;
* anything else (a reboot in flight, a validation, isolated): left alone.

Past a budget nothing more is rebooted or replaced and the shared cause is raised loudly
(event ``repair_budget``, stderr, syslog), as the fleet guard does for drains. The node's own
health program does what needs the node: the GPU reset, the validation, the resume.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm import fsutil, proc
from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.hooks import ladder as lad
from resilient_slurm.hooks.repair_config import RepairConfig
from resilient_slurm.slurm import Node, SlurmBackend, SlurmError

IN_REMEDIATION = ("reboot", "replace", "replaced")  # tags that count against max_at_once


def xid_action(code: str) -> str | None:
    """The catalog's action for ``XIDnn`` (generation-independent: the controller does not
    know the node's GPUs); None for other codes."""
    if not (code.startswith("XID") and code[3:].isdigit()):
        return None
    from resilient_slurm.healthcheck.policy import bucket_actions, catalog

    entry = catalog().get(int(code[3:]))
    bucket = bucket_actions().get(entry.immediate) if entry else None
    if bucket is None:
        return None
    return "drain" if bucket[0] == "decode" else bucket[0]


@dataclass
class Ledger:
    """Every remediation taken, per node, kept ``history_window_s`` (a JSON file written
    atomically; unreadable: an empty ledger, said on stderr)."""

    path: str
    attempts: list[lad.Attempt] = field(default_factory=list)

    @classmethod
    def load(cls, path: str) -> Ledger:
        try:
            raw = fsutil.read_json(path, default={}, nofollow=True)
        except (OSError, ValueError) as exc:
            print(f"resilient-slurm repair: ledger {path} unreadable, starting afresh: {exc}",
                  file=sys.stderr)
            raw = {}
        items = raw.get("attempts", []) if isinstance(raw, dict) else []
        found = [lad.Attempt.from_json(a) for a in items if isinstance(a, dict)]
        return cls(path, [a for a in found if a is not None])

    def save(self, now: float, window_s: float) -> None:
        self.attempts = [a for a in self.attempts if now - a.time <= window_s]
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fsutil.atomic_write_json(self.path, {"format": 1, "attempts": [
            a.to_json() for a in self.attempts]}, mode=0o644)

    def of(self, node: str) -> list[lad.Attempt]:
        return [a for a in self.attempts if a.node == node]


@dataclass
class Action:
    """What one pass did (or would do, ``--dry-run``) for one node."""

    node: str
    step: str
    cls: str
    code: str
    why: str
    done: bool = True

    def line(self) -> str:
        state = "" if self.done else " (held)"
        return f"{self.node}: {self.step}{state} [{self.cls}: {self.code}] {self.why}"


def _emit(events: EventLog | None, kind: EventKind, **fields: Any) -> None:
    if events is None:
        return
    try:
        events.emit(kind, **fields)
    except (OSError, ValueError, TypeError) as exc:
        print(f"resilient-slurm repair: event log: {exc}", file=sys.stderr)


def _shout(line: str) -> None:
    print(f"resilient-slurm repair: REPAIR BUDGET: {line}", file=sys.stderr)
    try:
        import syslog

        syslog.openlog("resilient-slurm", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, f"REPAIR BUDGET: {line}")
    except (ImportError, OSError):
        pass


def _rma(cfg: RepairConfig, node: Node, cls: lad.RepairClass, code: str,
         history: Sequence[lad.Attempt]) -> str:
    """Write the evidence bundle beside the ledger and hand it to ``rma_command``."""
    bundle = {"node": node.name, "class": cls.name, "code": code, "reason": node.reason,
              "state": node.describe(), "ladder": list(cls.ladder),
              "history": [a.to_json() for a in history], "time": time.time()}
    where = os.path.join(os.path.dirname(cfg.ledger_file), "evidence")
    os.makedirs(where, mode=0o700, exist_ok=True)
    path = os.path.join(where, f"{node.name}-{int(time.time())}.json")
    fsutil.atomic_write_json(path, bundle, mode=0o600)
    if not cfg.rma_command:
        return f"evidence {path} (no repair.rma_command configured)"
    out = proc.run([*cfg.rma_command, path], cfg.rma_timeout_s)
    return f"evidence {path}; rma_command: {out.describe()}"


def _act(slurm: SlurmBackend, node: Node, step: str, reason: str) -> None:
    if step == "replace":
        slurm.power_down(node.name, reason)
    else:  # a new tag: reboot and reset_gpu are carried out by the node's health program
        slurm.drain(node.name, reason)  # (it records them first, so they survive the reboot)


def one_pass(slurm: SlurmBackend, cfg: RepairConfig, *, prefix: str,
             events: EventLog | None = None, dry_run: bool = False,
             now: float | None = None) -> list[Action]:
    """One pass of the repair loop over the whole cluster (module docstring)."""
    now = time.time() if now is None else now
    ladder = lad.load(path=cfg.ladder_file or lad.SHIPPED)
    ledger = Ledger.load(cfg.ledger_file)
    nodes = {n.name: n for n in slurm.nodes_brief()}
    ours = {name: lad.split_reason(n.reason, prefix) for name, n in nodes.items()
            if n.reason.startswith(prefix)}
    busy = sum(1 for _, _, tag in ours.values() if tag in IN_REMEDIATION)
    started = lad.last_hour(ledger.attempts, now)
    actions: list[Action] = []
    held: list[str] = []
    order = sorted(ours, key=lambda n: (nodes[n].reason_time or 0.0, n))
    for name in order:
        node, (code, device, tag) = nodes[name], ours[name]
        if tag == "replace" and "POWERED_DOWN" in node.flags:
            actions.append(Action(name, "power_up", "", code, "powered down for replacement: "
                                  "up again as a new machine, drained until validated"))
            if not dry_run:
                slurm.drain(name, lad.tagged(prefix, code, device, "replaced"))
                slurm.power_up(name)
                _emit(events, EventKind.REPAIR, node=name, step="power_up", cause=code,
                      reason=lad.tagged(prefix, code, device, "replaced"),
                      why="replacement powered up")
            continue
        if tag not in ("", "valfail") or not (node.drain or node.state == "DOWN"):
            continue
        cls = ladder.classify(code, xid_action(code))
        step = lad.next_step(cls, ledger.attempts, name, now, cfg.history_window_s)
        if step is None:
            continue  # no automatic repair for this class (or the ladder is used up)
        why = ("validation failed: up the ladder" if tag == "valfail" else "drained for "
               f"{code}") + f"; {lad.position(cls, step)}"
        if step in ("reboot", "replace"):
            verdict = lad.budget(len(nodes), busy, started, max_at_once=cfg.max_at_once,
                                 hourly_fraction=cfg.hourly_fraction,
                                 hourly_min=cfg.hourly_min)
            if not verdict.allow:
                held.append(name)
                actions.append(Action(name, step, cls.name, code, verdict.why, done=False))
                continue
            busy += 1
            started += 1
        reason = lad.tagged(prefix, code, device, lad.STEP_TAG[step])
        actions.append(Action(name, step, cls.name, code, why))
        if dry_run:
            continue
        try:
            _act(slurm, node, step, reason)
        except SlurmError as exc:
            _emit(events, EventKind.ACTION_FAILED, node=name, cause=str(exc), status=step)
            actions[-1].done, actions[-1].why = False, f"Slurm refused: {exc}"
            continue
        ledger.attempts.append(lad.Attempt(name, cls.name, step, now, code))
        if step == "isolate":
            why += "; " + _rma(cfg, node, cls, code, ledger.of(name))
        _emit(events, EventKind.REPAIR, node=name, step=step, cause=code, reason=reason,
              why=why, repair_class=cls.name, ladder=list(cls.ladder))
    for name, node in nodes.items():  # Slurm clears the reason at a power up: set it again
        taken = ledger.of(name)
        last = taken[-1] if taken else None
        powering = node.flags & {"POWERING_UP", "POWERING_DOWN", "POWERED_DOWN"}
        if node.drain and not node.reason and last is not None and last.step == "replace" \
                and not powering:  # a drain while it powers up would stop its registration
            reason = lad.tagged(prefix, last.code, "", "replaced")
            actions.append(Action(name, "mark", last.cls, last.code, "powered up as a new "
                                  "machine: drained until validated"))
            if not dry_run:
                slurm.drain(name, reason)
    if held and not dry_run:
        line = (f"{len(held)} node(s) held back ({', '.join(held[:10])}"
                f"{' ...' if len(held) > 10 else ''}): {busy} in remediation, {started} started "
                "within the hour; a shared cause (a driver, a firmware, the fabric?) is likely")
        _shout(line)
        _emit(events, EventKind.REPAIR_BUDGET, held=held, in_progress=busy,
              last_hour=started, why=line)
    if not dry_run:
        ledger.save(now, cfg.history_window_s)
    return actions


def ladders(cfg: RepairConfig, nodes: Sequence[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """Each node's remediations from the ledger (``resilient-slurm fleet`` shows them)."""
    ledger = Ledger.load(cfg.ledger_file)
    out: dict[str, list[dict[str, Any]]] = {}
    for a in sorted(ledger.attempts, key=lambda a: a.time):
        if not nodes or a.node in nodes:
            out.setdefault(a.node, []).append(a.to_json())
    return out


def ladder_lines(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """``node3: reboot (GPU_LOST, 12-04 22:01) -> replace (...)``, one line per node."""
    lines = []
    for node, steps in sorted(found.items()):
        when = [time.strftime("%m-%d %H:%M", time.localtime(s["time"])) for s in steps]
        lines.append(f"{node}: " + " -> ".join(
            f"{s['step']} ({s['code']}, {t})" for s, t in zip(steps, when, strict=True)))
    return lines


def dump(actions: Sequence[Action]) -> str:
    return json.dumps([a.__dict__ for a in actions], indent=2)
