"""Xids whose line decides the action: 154 (the recovery action it names) and NVLink5 144-150.

:func:`line_rule` is what the xid check asks: the policy's rule for a code, or, where the
catalog says to read the line (``XidRule.decode``), the rule that line's text gives. Pure and
total: any text yields a rule (an undecodable line is unmapped, i.e. ``unknown``), never an
exception.

NVLink5 lines read ``<subcode> <Nonfatal|Fatal> XC<n> i<n> Link <n> (<IntrInfo> <ErrorStatus>
...)`` (older drivers: ``[<IntrInfo>]``); they are decoded with the catalog's "XID 144-150
Decode" sheet (``xid_policies/nvlink5.toml``).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from resilient_slurm.config import tomllib

from .policy import POLICY_DIR, XidPolicy, XidRule

# Xid 154 names the recovery action in its text (catalog: None, Drain P2P, Drain and Reset,
# GPU Reset Required, Node Reboot Required).
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
    """The action an Xid 154 line asks for (the state it changed *to*), or None."""
    low = text.lower()
    if " to " in low:
        low = low.rsplit(" to ", 1)[1]
    for needle, action in _XID154:
        if needle in low:
            return action
    return None


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
    return rule
