"""Xids whose line decides the action: 154 (the recovery action it names), 74 (the NVLink
error registers) and NVLink5 144-150.

:func:`line_rule` is what the xid check asks: the policy's rule for a code, or, where the
catalog says to read the line (``XidRule.decode``), the rule that line's text gives. Pure and
total: any text yields a rule (an undecodable line is unmapped, i.e. ``unknown``), never an
exception.

NVLink5 lines read ``<subcode> <Nonfatal|Fatal> XC<n> i<n> Link <n> (<IntrInfo> <ErrorStatus>
...)`` (older drivers: ``[<IntrInfo>]``); they are decoded with the catalog's "XID 144-150
Decode" sheet (``xid_policies/nvlink5.toml``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass

from resilient_slurm.config import tomllib

from ..policy import POLICY_DIR, RECOVERY_ACTIONS, XidPolicy, XidRule

# Xid 154 names the recovery action in its text, "GPU recovery action changed from 0x0 (None)
# to 0x2 (Node Reboot Required)": by its value (NVML's nvmlDeviceGpuRecoveryAction_t, the
# same numbers as NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: ``policy.RECOVERY_ACTIONS``) and by
# its name (catalog: None, Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot
# Required). The value decides; a name is read when the line has no value.
_XID154_VALUE = re.compile(r"\bto\s{1,4}(0x[0-9a-fA-F]{1,8}|\d{1,9})(?=\s|\(|$)",
                           re.IGNORECASE)
_XID154 = (
    ("node reboot required", "reboot"),
    ("drain and reset", "reset_gpu"),
    ("gpu reset required", "reset_gpu"),
    ("drain p2p", "drain"),
    ("none", "ignore"),
)
# What a decode row's bucket makes us do (XID_154_EVAL: "if no Xid 154, RESTART_APP").
_ROW_ACTION = {"IGNORE": "ignore", "RESET_GPU": "reset_gpu", "XID_154_EVAL": "restart_app"}
_PID_NAME = re.compile(r"^\s*pid=[^,]*,\s*name=[^,]*,\s*")
_NVLINK5 = re.compile(r"\s*(?P<sub>[A-Za-z][A-Za-z0-9_]*(?:/[A-Za-z0-9_]+)?)\s+"
                      r"(?P<sev>non-?fatal|fatal)\b(?P<rest>.*)", re.IGNORECASE)
_REGS = re.compile(r"[(\[]\s*(0x[0-9a-fA-F]{1,16}(?:[\s,]+0x[0-9a-fA-F]{1,16})*)")


def action_for_154(text: str) -> str | None:
    """The action an Xid 154 line asks for (the state it changed *to*), or None: the
    value's action when the line gives a value NVML defines, else the name's. A value NVML
    does not define is None (unknown), whatever name follows it."""
    if (v := _XID154_VALUE.search(text)) is not None:  # the first "to <value>"
        known = RECOVERY_ACTIONS.get(int(v.group(1), 0))
        return known[0] if known is not None else None
    low = text.lower()
    if " to " in low:
        low = low.rsplit(" to ", 1)[1]
    for needle, action in _XID154:
        if needle in low:
            return action
    return None


@functools.lru_cache(maxsize=1)
def _xid74_ignorable() -> dict[int, int]:
    """Register number (1-based) -> mask of the bits the catalog says to ignore (base.toml)."""
    with open(os.path.join(POLICY_DIR, "base.toml"), "rb") as fh:
        wf = tomllib.load(fh)["workflow"]["WORKFLOW_NVLINK_ERR"]
    out = {}
    for reg, bits in wf["ignorable_bits"].items():
        out[int(reg)] = sum(1 << int(b) for b in bits)
    return out


_XID74_VALID = (1, 3, 4, 5)  # the registers the catalog decodes (first, third, fourth, fifth)
_XID74_REGS = re.compile(r"link (\d{1,3}) ?\((0x[0-9a-fA-F]{1,8}(?:, ?0x[0-9a-fA-F]{1,8}){6})\)")


def decode_xid74(rule: XidRule, text: str) -> XidRule:
    """Xid 74 (WORKFLOW_NVLINK_ERR): ``NVLink: fatal error detected on link <n>(<seven
    registers>)``. When every bit set in the registers the catalog decodes is one it calls
    ignorable (first register bits 0, 23, 30: "can be safely ignored"; fifth register bits
    20, 23, 26, 29: "a threshold of ECC errors being exceeded. There was no uncorrectable
    error at this time. Continue operation"), the line is ignored; any other bit, no bit, or
    a line whose registers cannot be read keeps the rule's action (a reset)."""
    m = _XID74_REGS.search(text)
    if m is None:
        return rule
    regs = [int(v, 16) for v in m.group(2).split(",")]
    ignorable = _xid74_ignorable()
    seen = {n: regs[n - 1] for n in _XID74_VALID if regs[n - 1]}
    if not seen:
        return rule
    left = {n: v & ~ignorable.get(n, 0) for n, v in seen.items()}
    bits = ", ".join(f"reg{n}=0x{v:x}" for n, v in seen.items())
    if any(left.values()):
        other = ", ".join(f"reg{n}=0x{v:x}" for n, v in left.items() if v)
        return dataclasses.replace(rule, source=f"{rule.source}; link {m.group(1)} {bits}: "
                                   f"bits the catalog does not call ignorable ({other})")
    return XidRule("ignore", rule.meaning, f"catalog WORKFLOW_NVLINK_ERR: link {m.group(1)} "
                   f"{bits}: only bits the catalog says can be ignored")


@dataclass(frozen=True)
class DecodeRow:
    xid: int
    subcodes: tuple[str, ...]  # "*" matches any
    status: tuple[int, ...] | None  # ErrorStatus values (second register)
    reason: tuple[int, ...] | None  # IntrInfo bits 25:20 (NETIR_LINK_EVT)
    immediate: str
    severity: str
    promoted: str = ""  # "Action 2" when the line says Fatal (rows marked Non-fatal*)


@functools.lru_cache(maxsize=1)
def nvlink5_rows() -> tuple[DecodeRow, ...]:
    with open(os.path.join(POLICY_DIR, "nvlink5.toml"), "rb") as fh:
        data = tomllib.load(fh)
    rows = []
    for r in data["row"]:
        for bucket in (r["immediate"], r.get("promoted", "IGNORE")):
            if bucket not in _ROW_ACTION:
                raise ValueError(f"nvlink5.toml: Xid {r['xid']}: unknown bucket {bucket!r}")
        rows.append(DecodeRow(int(r["xid"]), tuple(r["subcodes"]),
                              tuple(r["status"]) if "status" in r else None,
                              tuple(r["reason"]) if "reason" in r else None,
                              r["immediate"], r["severity"], r.get("promoted", "")))
    return tuple(rows)


def decode_nvlink5(code: int, text: str) -> XidRule:
    """The rule an NVLink5 line (Xid 144-150) gets from the catalog's decode sheet."""
    m = _NVLINK5.match(_PID_NAME.sub("", text))
    if m is None:
        return XidRule("drain", "NVLink5 error", f"Xid {code}: line has no subcode and "
                       "severity the catalog's 144-150 decode can read; failing closed", False)
    sub, fatal = m.group("sub").upper(), m.group("sev").lower() == "fatal"
    regs_m = _REGS.search(m.group("rest"))
    regs = [int(v, 16) for v in re.split(r"[\s,]+", regs_m.group(1))] if regs_m else []
    intr = regs[0] if regs else None
    status = regs[1] if len(regs) > 1 else None
    sev = "Fatal" if fatal else "Nonfatal"
    for row in nvlink5_rows():
        if row.xid != code or not (sub in row.subcodes or "*" in row.subcodes):
            continue
        if row.status is not None and status not in row.status:
            continue
        if row.reason is not None and (intr is None or (intr >> 20) & 0x3F not in row.reason):
            continue
        bucket = row.promoted if (row.promoted and fatal) else row.immediate
        key = f"status 0x{status:08x}" if row.status is not None and status is not None else (
            f"reason {(intr or 0) >> 20 & 0x3F}" if row.reason is not None else "any status")
        promoted = ", promoted by the line" if bucket == row.promoted and fatal else ""
        return XidRule(_ROW_ACTION[bucket], f"NVLink5 {sub} {sev}",
                       f"catalog 144-150 decode: {code} {sub} {key}: {bucket} "
                       f"(severity {row.severity}{promoted})")
    what = f"Xid {code} {sub} {sev}" + (f" status 0x{status:08x}" if status is not None else "")
    if not fatal:
        return XidRule("restart_app", f"NVLink5 {sub} Nonfatal", f"{what} is not in the "
                       "catalog's 144-150 decode; the driver calls it non-fatal: warning only",
                       warn=True)
    return XidRule("drain", f"NVLink5 {sub} {sev}", f"{what} is not in the catalog's 144-150 "
                   "decode; failing closed", False)


def line_rule(policy: XidPolicy, code: int, text: str) -> XidRule:
    """The rule for one Xid line: the policy's, or the one the line's text decodes to."""
    rule = policy.rule(code)
    if rule.decode == "154":
        action = action_for_154(text)
        if action is None:
            return XidRule("drain", rule.meaning, "catalog XID_154: the line names no "
                           "recovery action the catalog lists; failing closed", False)
        return XidRule(action, rule.meaning, f"{rule.source}; the line asks: {action}")
    if rule.decode == "nvlink5":
        return decode_nvlink5(code, text)
    if rule.decode == "74":
        return decode_xid74(rule, text)
    return rule
