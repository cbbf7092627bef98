"""The repair loop's decisions, pure: which class a failure is, which remediation is next, and
whether the fleet's repair budget allows it.

The ladder is data (``hooks/repair_ladder.toml``, overridable per site): per failure class the
remediations in order, each allowed ``times`` times (default once) for the same class within
the history window before the next step. The history is a list of attempts (the controller's
ledger, ``hooks/repair_ledger.py``), so it survives the node's reboots and replacements.

The drain reason carries the repair loop's state in brackets (``rhc:XID79 gpu3 [reboot]``), so
any process that can read ``sinfo`` sees where each node stands without a shared file:

======== ================================================================================
tag      meaning
======== ================================================================================
(none)   drained by a hook for a fault; the repair loop has not acted yet
reset    the node is asked to reset its failing GPUs (done by the node's health program)
reboot   ``scontrol reboot ASAP nextstate=DOWN`` issued
replace  ``POWER_DOWN_ASAP`` issued (the site's SuspendProgram: a new instance next)
replaced powered up again as a new machine, out of service until validated
validate a remediation is done; the node validates before it takes work
valfail  the validation failed: the repair loop moves the node up its ladder
isolated out of service for a person (``repair.rma_command`` was given the evidence)
======== ================================================================================
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.config import tomllib

STEPS = ("restart_app", "reset_gpu", "reboot", "replace", "isolate")
TAGS = ("reset", "reboot", "replace", "replaced", "validate", "valfail", "isolated")
# The tag a step leaves on the node's reason when it is taken.
STEP_TAG = {"restart_app": "validate", "reset_gpu": "reset", "reboot": "reboot",
            "replace": "replace", "isolate": "isolated"}
SHIPPED = os.path.join(os.path.dirname(__file__), "repair_ladder.toml")


class LadderError(ValueError):
    """A ladder file or override that cannot be used (the message names the key)."""


@dataclass(frozen=True)
class RepairClass:
    name: str
    ladder: tuple[str, ...]
    actions: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()
    times: Mapping[str, int] = field(default_factory=dict)

    def allowed(self, step: str) -> int:
        return int(self.times.get(step, 1))


@dataclass(frozen=True)
class Ladder:
    classes: Mapping[str, RepairClass]
    default: str

    def classify(self, code: str, action: str | None = None) -> RepairClass:
        """The class of a failure: by its Xid policy action first, then by its code."""
        if action:
            for cls in self.classes.values():
                if action in cls.actions:
                    return cls
        for cls in self.classes.values():
            if any(fnmatch.fnmatchcase(code, pattern) for pattern in cls.codes):
                return cls
        return self.classes[self.default]


def _class(name: str, raw: Any) -> RepairClass:
    if not isinstance(raw, dict):
        raise LadderError(f"repair.classes.{name}: must be a table")
    unknown = set(raw) - {"actions", "codes", "ladder", "times"}
    if unknown:
        raise LadderError(f"repair.classes.{name}: unknown key {sorted(unknown)[0]!r}")
    ladder = tuple(str(s) for s in raw.get("ladder", ()))
    bad = [s for s in ladder if s not in STEPS]
    if bad:
        raise LadderError(f"repair.classes.{name}.ladder: unknown step {bad[0]!r} (known: "
                          f"{', '.join(STEPS)})")
    times = raw.get("times", {})
    if not isinstance(times, dict) or any(k not in ladder or not isinstance(v, int) or v < 1
                                          for k, v in times.items()):
        raise LadderError(f"repair.classes.{name}.times: a count >= 1 per step of its ladder")
    return RepairClass(name, ladder, tuple(str(a) for a in raw.get("actions", ())),
                       tuple(str(c) for c in raw.get("codes", ())), dict(times))


def load(overrides: Mapping[str, Any] | None = None, path: str = SHIPPED) -> Ladder:
    """The shipped ladder with the site's ``[repair.classes.*]`` tables on top (a site table
    replaces the shipped class of that name; site classes are matched first)."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    shipped = {n: _class(n, raw) for n, raw in data.get("classes", {}).items()}
    site = {n: _class(n, raw) for n, raw in (overrides or {}).items()}
    classes = {**site, **{n: c for n, c in shipped.items() if n not in site}}
    default = str(data.get("default", "hold"))
    if default not in classes:
        raise LadderError(f"repair ladder: default class {default!r} is not defined")
    return Ladder(classes, default)


@dataclass(frozen=True)
class Attempt:
    """One remediation the repair loop took on a node."""

    node: str
    cls: str
    step: str
    time: float
    code: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "class": self.cls, "step": self.step, "time": self.time,
                "code": self.code}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Attempt | None:
        try:
            return cls(str(raw["node"]), str(raw["class"]), str(raw["step"]),
                       float(raw["time"]), str(raw.get("code", "")))
        except (KeyError, TypeError, ValueError):
            return None


def next_step(cls: RepairClass, history: Iterable[Attempt], node: str, now: float,
              window_s: float) -> str | None:
    """The first step of the class's ladder this node has not used up within the window;
    None when the ladder is exhausted (or empty: no automatic repair)."""
    used: dict[str, int] = {}
    for a in history:
        if a.node == node and a.cls == cls.name and now - a.time <= window_s:
            used[a.step] = used.get(a.step, 0) + 1
    return next((s for s in cls.ladder if used.get(s, 0) < cls.allowed(s)), None)


def position(cls: RepairClass, step: str) -> str:
    """``reboot (2 of 4)``: where a step stands on its class's ladder, for events and tables."""
    return f"{step} ({cls.ladder.index(step) + 1} of {len(cls.ladder)})" if step in cls.ladder \
        else step


@dataclass(frozen=True)
class Budget:
    allow: bool
    why: str
    in_progress: int
    last_hour: int
    per_hour: int
    at_once: int


def budget(total_nodes: int, in_progress: int, last_hour: int, *, max_at_once: int,
           hourly_fraction: float, hourly_min: int) -> Budget:
    """Whether one more node may be rebooted or replaced: at most ``max_at_once`` in
    remediation at a time and max(``hourly_min``, ``hourly_fraction`` of the nodes) started
    within the last hour (GKE's rule for node repairs)."""
    per_hour = max(hourly_min, math.ceil(hourly_fraction * total_nodes))
    if in_progress >= max_at_once:
        return Budget(False, f"{in_progress} node(s) already in remediation (at most "
                      f"{max_at_once} at once)", in_progress, last_hour, per_hour, max_at_once)
    if last_hour >= per_hour:
        return Budget(False, f"{last_hour} remediation(s) started within the hour (at most "
                      f"max({hourly_min}, {hourly_fraction:g} x {total_nodes} nodes) = "
                      f"{per_hour})", in_progress, last_hour, per_hour, max_at_once)
    return Budget(True, "within budget", in_progress, last_hour, per_hour, max_at_once)


def split_reason(reason: str, prefix: str) -> tuple[str, str, str]:
    """(code, device text, tag) of one of our drain reasons: ``rhc:XID79 gpu3 +1 [reboot] :
    reboot issued`` -> (``XID79``, ``gpu3 +1``, ``reboot``). Slurm's own suffixes (``:
    reboot issued``) are dropped; a reason without our prefix gives ("", "", "")."""
    if not reason.startswith(prefix):
        return "", "", ""
    body = reason[len(prefix):].split(" : ", 1)[0].strip()
    tag = ""
    if body.endswith("]") and "[" in body:
        head, _, inner = body[:-1].rpartition("[")
        if inner in TAGS:
            body, tag = head.strip(), inner
    words = body.split()
    return (words[0] if words else ""), " ".join(words[1:]), tag


def tagged(prefix: str, code: str, device: str, tag: str) -> str:
    """Our reason with the repair loop's tag: ``rhc:XID79 gpu3 [reboot]`` (at most 64
    characters: the device text is cut first)."""
    tail = f" [{tag}]" if tag else ""
    head = f"{prefix}{code}"
    room = 64 - len(head) - len(tail) - 1
    dev = device[:max(0, room)].strip()
    return f"{head} {dev}{tail}" if dev else f"{head}{tail}"


def last_hour(history: Sequence[Attempt], now: float,
              steps: Iterable[str] = ("reboot", "replace")) -> int:
    wanted = set(steps)
    return sum(1 for a in history if a.step in wanted and now - a.time <= 3600)
