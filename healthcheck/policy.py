"""Xid policy as data: NVIDIA's Xid catalog, a column per GPU generation, boot-noise lists.

Shipped data (``healthcheck/xid_policies/``): ``catalog.toml`` (the catalog transcribed: per
code its applicability columns A100 / H100 / B100 / GB200 and its immediate-action bucket),
``base.toml`` (what each bucket makes us do), ``<generation>.toml`` (which column applies,
differences, boot noise) and ``nvlink5.toml`` (the Xid 144-150 decode). The site's
``[health.xid_overrides.<generation>]`` and ``[health.boot_noise]`` change them.

Contract of :meth:`XidPolicy.rule`: a code the generation's column lists gets its bucket's
action; a code the column does not list, or lists without a bucket, is *unmapped*
(``XidRule.mapped`` False: the check reports it ``unknown``, fails closed, never holds),
except that a code whose bucket is IGNORE or RESTART_APP keeps that action everywhere (the
catalog never asks to drain for it). Any Xid on a GPU of unknown generation is unmapped.
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

# GPU recovery actions by value (NVML's nvmlDeviceGpuRecoveryAction_t; the field
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and Xid 154's "to 0x<value> (...)") -> (action, text).
RECOVERY_ACTIONS = {
    0: ("ignore", "none"), 1: ("reset_gpu", "GPU reset required"),
    2: ("reboot", "node reboot required"), 3: ("drain", "drain P2P"),
    4: ("reset_gpu", "drain P2P and reset GPU"), 5: ("drain", "recover IMEX domain"),
    6: ("reset_gpu", "PCIe bus reset required"), 7: ("reboot", "system reboot required")}

# Actions by severity; the worst one in a set of Xids wins.
ACTION_RANK = {"ignore": 0, "restart_app": 1, "reset_gpu": 2, "drain": 3, "reboot": 4}
NEVER_DRAIN = ("IGNORE", "RESTART_APP")  # buckets kept on every generation

# GPU name fragments -> generation (checked in order; NVML's architecture is preferred, but
# Blackwell's architecture number does not tell GB200 from B200, so a Grace name wins).
_GRACE = re.compile(r"\bGB\d{3}\b")
_NAME_HINTS = (
    (_GRACE, "grace_blackwell"),
    (re.compile(r"\b(B\d{3}|RTX PRO 6000 Blackwell)\b"), "blackwell"),
    (re.compile(r"\b(GH\d{3}|H\d{3}|H800|H20)\b"), "hopper"),
    (re.compile(r"\b(L4|L40S?|L20|RTX \d{4} Ada|RTX 6000 Ada)\b"), "ada"),
    (re.compile(r"\b(A\d{2,3}|A800)\b"), "ampere"),
)
# NVML architecture numbers (nvmlDeviceGetArchitecture): 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell.
_ARCH = {7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell"}


def generation_of(name: str | None, architecture: int | str | None = None) -> str:
    """A member of ``GPU_GENERATIONS``, or ``""`` when unknown (callers fail closed)."""
    gen = ""
    if isinstance(architecture, str) and architecture in GPU_GENERATIONS:
        gen = architecture
    elif isinstance(architecture, int) and architecture in _ARCH:
        gen = _ARCH[architecture]
    if gen:
        return "grace_blackwell" if gen == "blackwell" and name and _GRACE.search(name) else gen
    for pattern, gen in _NAME_HINTS:
        if name and pattern.search(name):
            return gen
    return ""


@dataclass(frozen=True)
class XidRule:
    action: str
    meaning: str
    source: str
    mapped: bool = True  # False: not in this generation's map (unknown: fails closed, no hold)
    decode: str = ""  # "154" | "nvlink5": the line's own text decides (see xid/decode.py)
    warn: bool = False  # a decoded line the driver calls non-fatal that no row lists: warn only
    repeat_suspect: bool = False  # restart_app whose repeats across runs suspect the GPU


@dataclass(frozen=True)
class CatalogEntry:
    code: int
    mnemonic: str
    description: str
    applies: tuple[str, ...]  # the catalog columns marked YES
    immediate: str
    investigatory: str


@dataclass
class XidPolicy:
    generation: str
    rules: dict[int, XidRule] = field(default_factory=dict)
    boot_noise: frozenset[int] = frozenset()
    columns: tuple[str, ...] = ()

    def rule(self, xid: int) -> XidRule:
        """The rule for ``xid``; see the module docstring for what is unmapped."""
        if not self.generation:
            return XidRule("drain", "unknown", "unknown GPU generation: failing closed", False)
        found = self.rules.get(xid)
        if found is not None:
            return found
        entry = catalog().get(xid)
        where = f"the {self.generation} map ({'/'.join(self.columns)} column)"
        if entry is None:
            why = "not in NVIDIA's Xid catalog"
        elif not entry.applies:
            why = f"catalog: {entry.description}, listed for none of its columns"
        elif all(c in entry.applies for c in self.columns):
            given = entry.immediate[:60] or "empty"
            why = f"the catalog gives it no immediate-action bucket ({given})"
        else:
            why = f"catalog lists it for {'/'.join(entry.applies)} only"
        return XidRule("drain", entry.description if entry else "unknown",
                       f"Xid {xid} not in {where}: {why}; failing closed", False)


def _load(name: str) -> dict[str, Any]:
    with open(os.path.join(POLICY_DIR, name), "rb") as fh:
        return tomllib.load(fh)


@functools.lru_cache(maxsize=1)
def catalog() -> dict[int, CatalogEntry]:
    """``catalog.toml``: every code the catalog gives a row with a use (not "Unused")."""
    data = _load("catalog.toml")
    cols = tuple(data["columns"])
    out = {}
    for key, e in data["xid"].items():
        flags = e["applies"]
        if len(flags) != len(cols) or set(flags) - {"Y", "N"}:
            raise ValueError(f"catalog.toml: Xid {key}: applies {flags!r} is not Y/N per column")
        out[int(key)] = CatalogEntry(int(key), e["mnemonic"], e["description"],
                                     tuple(c for c, f in zip(cols, flags, strict=True) if f == "Y"),
                                     e["immediate"], e["investigatory"])
    return out


def unused_codes() -> tuple[int, ...]:
    """Codes the catalog marks *Unused* (no column lists them: unknown everywhere)."""
    return tuple(int(c) for c in _load("catalog.toml")["unused"])


@functools.lru_cache(maxsize=1)
def bucket_actions() -> dict[str, tuple[str, str]]:
    """Immediate-action bucket -> (action or ``decode``, note), from ``base.toml``."""
    data = _load("base.toml")
    out = {k: (v["action"], v["note"]) for k, v in data["bucket"].items()}
    out.update({k: (v["action"], v["note"]) for k, v in data["workflow"].items()})
    for name, (action, _) in out.items():
        if action not in ACTION_RANK and action != "decode":
            raise ValueError(f"base.toml: {name}: bad action {action!r}")
    return out


def catalog_rule(entry: CatalogEntry, columns: tuple[str, ...]) -> XidRule | None:
    """The rule the catalog gives ``entry`` on a GPU of ``columns`` (None: unmapped there)."""
    listed = all(c in entry.applies for c in columns)
    bucket = bucket_actions().get(entry.immediate)
    if bucket is None or not (listed or entry.immediate in NEVER_DRAIN):
        return None
    action, note = bucket
    col = "/".join(columns)
    where = f"catalog {col}: {entry.immediate}" if listed else (
        f"catalog: {entry.immediate}, not listed for {col} (kept: the catalog never drains it)")
    decode = ""
    if action == "decode":
        decode = "154" if entry.code == 154 else "nvlink5"
        action = "drain"  # only when the line cannot be decoded (then it is unknown anyway)
    elif entry.immediate == "WORKFLOW_NVLINK_ERR":
        decode = "74"  # the registers may say the line can be ignored (xid/decode.py)
    # WORKFLOW_XID_13 / _31 (investigatory): repeats on the same GPU across runs are a
    # possible hardware fault; no other RESTART_APP code has such a rule.
    suspect = entry.investigatory in ("WORKFLOW_XID_13", "WORKFLOW_XID_31")
    return XidRule(action, entry.description, f"{where} ({note})", decode=decode,
                   repeat_suspect=suspect)


@functools.lru_cache(maxsize=8)
def _load_shipped(generation: str) -> tuple[dict[int, XidRule], frozenset[int], tuple[str, ...]]:
    """The catalog through ``<generation>.toml``'s column, its differences, its boot noise."""
    data = _load(f"{generation}.toml")
    columns = tuple(data["columns"])
    rules = {}
    for code, entry in catalog().items():
        rule = catalog_rule(entry, columns)
        if rule is not None:
            rules[code] = rule
    for key, e in data.get("xid", {}).items():
        if e["action"] not in ACTION_RANK:
            raise ValueError(f"{generation}.toml: Xid {key}: bad action {e['action']!r}")
        rules[int(key)] = XidRule(e["action"], e.get("meaning", ""), e["source"])
    noise = frozenset(int(c) for c in data.get("boot_noise", {}).get("codes", []))
    return rules, noise, columns


def load_policy(generation: str, cfg: HealthConfig) -> XidPolicy:
    """The effective policy for ``generation`` (shipped data + site overrides)."""
    if generation not in GPU_GENERATIONS:
        return XidPolicy("")
    shipped, noise, columns = _load_shipped(generation)
    rules = dict(shipped)
    for key, action in cfg.xid_overrides.get(generation, {}).items():
        rules[int(key)] = XidRule(action, "site override", "config health.xid_overrides",
                                  repeat_suspect=action == "restart_app")
    extra = frozenset(cfg.boot_noise.get(generation, []))
    return XidPolicy(generation, rules, noise | extra, columns)


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
