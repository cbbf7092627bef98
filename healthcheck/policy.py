"""Xid policy as data: per-generation maps from Xid to action, with boot-noise lists.

Shipped maps: one base table ``healthcheck/xid_policies/base.toml`` (one entry per Xid, each
with its catalog source) and per generation only the differences (``<generation>.toml``); the site's
``[health.xid_overrides.<generation>]`` and ``[health.boot_noise]`` change them. Fail closed:
an Xid missing from the map, or any Xid on a GPU whose generation is unknown, gets action
``drain`` (without a hold: ``XidRule.mapped`` is False).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.config import tomllib
from resilient_slurm.healthcheck.config import GPU_GENERATIONS, HealthConfig

POLICY_DIR = os.path.join(os.path.dirname(__file__), "xid_policies")

# Actions by severity; the worst one in a set of Xids wins.
ACTION_RANK = {"ignore": 0, "restart_app": 1, "reset_gpu": 2, "drain": 3, "reboot": 4}

# GPU name fragments -> generation (checked in order; NVML architecture is preferred).
_NAME_HINTS = (
    (re.compile(r"\b(GB\d{3}|B\d{3}|RTX PRO 6000 Blackwell)\b"), "blackwell"),
    (re.compile(r"\b(GH\d{3}|H\d{3}|H800|H20)\b"), "hopper"),
    (re.compile(r"\b(L4|L40S?|L20|RTX \d{4} Ada|RTX 6000 Ada)\b"), "ada"),
    (re.compile(r"\b(A\d{2,3}|A800)\b"), "ampere"),
)
# NVML architecture numbers (nvmlDeviceGetArchitecture): 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell.
_ARCH = {7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell"}


def generation_of(name: str | None, architecture: int | str | None = None) -> str:
    """``ampere|hopper|blackwell``, or ``""`` when unknown (callers fail closed)."""
    if isinstance(architecture, str) and architecture in GPU_GENERATIONS:
        return architecture
    if isinstance(architecture, int) and architecture in _ARCH:
        return _ARCH[architecture]
    for pattern, gen in _NAME_HINTS:
        if name and pattern.search(name):
            return gen
    return ""


@dataclass(frozen=True)
class XidRule:
    action: str
    meaning: str
    source: str
    mapped: bool = True  # False: not in the policy (fails closed, but never holds)
    severity_in_text: bool = False  # the line says Fatal / Nonfatal after the code (NVLink5)


@dataclass
class XidPolicy:
    generation: str
    rules: dict[int, XidRule] = field(default_factory=dict)
    boot_noise: frozenset[int] = frozenset()

    def rule(self, xid: int) -> XidRule:
        """The rule for ``xid``; an unmapped Xid (or unknown generation) fails closed."""
        if not self.generation:
            return XidRule("drain", "unknown", "unknown GPU generation: failing closed", False)
        found = self.rules.get(xid)
        if found is None:
            return XidRule("drain", "unknown",
                           f"Xid {xid} not in the {self.generation} policy: failing closed",
                           False)
        return found


def _rules(path: str, data: dict[str, Any]) -> dict[int, XidRule]:
    rules = {}
    for key, entry in data.get("xid", {}).items():
        action = entry["action"]
        if action not in ACTION_RANK:
            raise ValueError(f"{path}: Xid {key}: bad action {action!r}")
        rules[int(key)] = XidRule(action, entry.get("meaning", ""), entry["source"],
                                  severity_in_text=bool(entry.get("severity_in_text", False)))
    return rules


@functools.lru_cache(maxsize=8)
def _load_shipped(generation: str) -> tuple[dict[int, XidRule], frozenset[int]]:
    """``base.toml`` with ``<generation>.toml``'s differences on top, and its boot noise."""
    base_path = os.path.join(POLICY_DIR, "base.toml")
    with open(base_path, "rb") as fh:
        rules = _rules(base_path, tomllib.load(fh))
    path = os.path.join(POLICY_DIR, f"{generation}.toml")
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    rules.update(_rules(path, data))
    noise = frozenset(int(c) for c in data.get("boot_noise", {}).get("codes", []))
    return rules, noise


def load_policy(generation: str, cfg: HealthConfig) -> XidPolicy:
    """The effective policy for ``generation`` (shipped file + site overrides)."""
    if generation not in GPU_GENERATIONS:
        return XidPolicy("")
    shipped, noise = _load_shipped(generation)
    rules = dict(shipped)
    for key, action in cfg.xid_overrides.get(generation, {}).items():
        rules[int(key)] = XidRule(action, "site override", "config health.xid_overrides")
    extra = frozenset(cfg.boot_noise.get(generation, []))
    return XidPolicy(generation, rules, noise | extra)


# Xid 154 names the recovery action in its text.
_XID154 = (
    ("node reboot required", "reboot"),
    ("drain and reset", "reset_gpu"),
    ("gpu reset required", "reset_gpu"),
    ("drain p2p", "drain"),
    ("none", "ignore"),
)


def action_for_154(text: str) -> str | None:
    """The action an Xid 154 line asks for (the state it changed *to*), or None."""
    low = text.lower()
    if " to " in low:
        low = low.rsplit(" to ", 1)[1]
    for needle, action in _XID154:
        if needle in low:
            return action
    return None


@dataclass(frozen=True)
class EfaRule:
    phrase: str
    action: str
    meaning: str
    source: str


@functools.lru_cache(maxsize=1)
def efa_rules() -> tuple[EfaRule, ...]:
    """Fatal EFA driver phrases and their actions (``xid_policies/efa.toml``), longest first."""
    path = os.path.join(POLICY_DIR, "efa.toml")
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    rules = []
    for entry in data.get("line", []):
        if entry["action"] not in ACTION_RANK:
            raise ValueError(f"{path}: {entry['phrase']!r}: bad action {entry['action']!r}")
        rules.append(EfaRule(entry["phrase"].lower(), entry["action"], entry.get("meaning", ""),
                             entry["source"]))
    return tuple(sorted(rules, key=lambda r: -len(r.phrase)))


def efa_rule_for(text: str) -> EfaRule | None:
    """The EFA rule whose phrase ``text`` holds (None: not a fatal EFA line)."""
    low = text.lower()
    return next((r for r in efa_rules() if r.phrase in low), None)


def worst_action(actions: list[str]) -> str:
    return max(actions, key=lambda a: ACTION_RANK[a]) if actions else "ignore"
