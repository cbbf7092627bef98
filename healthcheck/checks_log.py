"""Pure evaluation of kernel-log lines: Xid (per the generation's policy), SXid, EFA driver.

Xids come from the kernel log even when NVML is broken (the fallback): the GPU is named from
NVML's PCI map when there is one, else by PCI address; the generation from the GPU, else the
profile, else unknown (every Xid then fails closed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from resilient_slurm.healthcheck.config import HealthConfig

from .kernlog import LogEvent, LogRead
from .model import FAIL, OK, UNKNOWN, WARN, Result
from .policy import XidPolicy, action_for_154, efa_rule_for, worst_action
from .registry import EVERY_SET, declare


@dataclass
class LogContext:
    cfg: HealthConfig
    policy_for: Callable[[str], XidPolicy]
    pci_to_gpu: dict[str, tuple[int, str]] = field(default_factory=dict)  # pci -> (idx, gen)
    default_generation: str = ""
    # Application-class Xids across runs: device -> times of earlier runs that saw some
    # (within health.xid_repeat_window_s); devices seen in this run are added to app_seen.
    app_history: dict[str, list[float]] = field(default_factory=dict)
    app_seen: list[str] = field(default_factory=list)


def _unreadable(check: str, read: LogRead) -> list[Result]:
    return [Result(check, UNKNOWN, "KLOG_UNREADABLE", f"kernel log unreadable: {read.error}",
                   read.error)]


def _gap(check: str, read: LogRead) -> list[Result]:
    """A wrap we could not read back is ``unknown``: an Xid may be among the lost lines."""
    out = []
    if read.gap and read.gap_filled:
        out.append(Result(check, OK, "KLOG_GAP_FILLED", "kernel log wrapped since the last "
                          f"run; the lost lines were read from the {read.gap_filled}",
                          str(read.position)))
    elif read.gap:
        out.append(Result(check, UNKNOWN, "KLOG_GAP", "kernel log wrapped or was replaced "
                          "since the last run and the lost lines are not in the journal: an "
                          "Xid may have been missed", str(read.position)))
    if read.flood:
        out.append(Result(check, UNKNOWN, "KLOG_FLOOD", f"more than {len(read.events)} "
                          f"kernel-log events in one read ({read.flood} not examined)",
                          str(read.position)))
    return out


def _in_boot_window(ev: LogEvent, read: LogRead, window: float) -> bool:
    ts = ev.ts if ev.ts is not None else read.uptime_s
    return ts is not None and ts <= window


def nonfatal(text: str) -> bool:
    """An NVLink5 Xid line whose severity word (after the unit) says Nonfatal."""
    words = text.split()
    return len(words) >= 2 and words[1].lower() in ("nonfatal", "non-fatal")


@declare("xid", "kernlog", EVERY_SET, context="log")
def evaluate_xid(read: LogRead, ctx: LogContext) -> list[Result]:
    check = "xid"
    if read.error:
        return _unreadable(check, read)
    groups: dict[tuple[str, int], list[tuple[LogEvent, str]]] = defaultdict(list)
    ignored: list[str] = []
    warned: list[Result] = []
    garbled = [ev for ev in read.events if ev.kind == "garbled_xid"]
    for ev in read.events:
        if ev.kind != "xid" or ev.code is None:
            continue
        idx, gen = ctx.pci_to_gpu.get(ev.pci, (None, ctx.default_generation))
        dev = f"gpu{idx}" if idx is not None else f"pci{ev.pci}"
        policy = ctx.policy_for(gen)
        if ev.code in policy.boot_noise and _in_boot_window(ev, read, ctx.cfg.boot_noise_window_s):
            ignored.append(f"Xid {ev.code} on {dev} (boot noise)")
            continue
        action = action_for_154(ev.text) if ev.code == 154 else None
        rule = policy.rule(ev.code)
        action = action or rule.action
        if rule.severity_in_text and nonfatal(ev.text):
            # NVLink5: "145, RLW_REMAP Nonfatal XC0 ...": the driver recovered; warn only.
            warned.append(Result(check, WARN, f"XID{ev.code}", f"non-fatal Xid {ev.code} on "
                                 f"{dev}: {ev.text[:100]}", f"{dev} PCI:{ev.pci} {ev.text[:200]}"
                                 f" [policy {gen or 'unknown generation'}: {rule.source}]",
                                 device=dev))
            continue
        if action == "ignore":
            ignored.append(f"Xid {ev.code} on {dev}")
            continue
        groups[(dev, ev.code)].append((ev, action))
    out = _gap(check, read) + warned
    if garbled:
        out.append(Result(check, UNKNOWN, "XID_UNPARSEABLE", f"{len(garbled)} Xid line(s) that "
                          "cannot be parsed", " | ".join(ev.text for ev in garbled[:3])))
    for (dev, code), items in sorted(groups.items()):
        ev, _ = items[-1]
        action = worst_action([a for _, a in items])
        idx, gen = ctx.pci_to_gpu.get(ev.pci, (None, ctx.default_generation))
        rule = ctx.policy_for(gen).rule(code)
        n = len(items)
        status = FAIL
        if action == "restart_app":
            # An application's fault, however often one read shows it; the GPU is suspect only
            # when such Xids recur on it in separate runs within the window (no hold).
            ctx.app_seen.append(dev)
            runs = len(ctx.app_history.get(dev, [])) + 1
            status = FAIL if runs >= ctx.cfg.xid_repeat_fail else WARN
            if status == FAIL:
                n_txt = f"in {runs} runs within {ctx.cfg.xid_repeat_window_s:g}s"
                out.append(Result(check, FAIL, "XID_APP_REPEAT", f"application-class Xid {code} "
                                  f"on {dev} {n_txt}: the GPU is suspect", f"{dev} PCI:{ev.pci} "
                                  f"{ev.text[:200]}", action="restart_app", device=dev))
                continue
        gen_txt = gen or "unknown generation"
        reason = (f"Xid {code} on {dev}: {ev.text[:100] or rule.meaning}"
                  f"{f' (x{n})' if n > 1 else ''} -> {action}")
        out.append(Result(check, status, f"XID{code}", reason,
                          f"{dev} PCI:{ev.pci} x{n}: {ev.text[:200]} [policy {gen_txt}: "
                          f"{rule.source}]", action=action, device=dev,
                          hold=rule.mapped and action in ("drain", "reset_gpu", "reboot")))
    if not out:
        why = f"no new Xids ({read.source} log)"
        if ignored:
            why += "; ignored: " + ", ".join(ignored[:8])
        return [Result(check, OK, "OK", why, "; ".join(ignored))]
    return out


@declare("sxid", "kernlog", EVERY_SET, context="log")
def evaluate_sxid(read: LogRead, ctx: LogContext) -> list[Result]:
    check = "sxid"
    if read.error:
        return _unreadable(check, read)
    out = []
    for ev in read.events:
        if ev.kind == "garbled_sxid":
            out.append(Result(check, UNKNOWN, "SXID_UNPARSEABLE", "SXid line that cannot be "
                              "parsed", ev.text))
        if ev.kind != "sxid":
            continue
        dev = f"pci{ev.pci}"
        if ev.fatal:
            out.append(Result(check, FAIL, f"SXID{ev.code}", f"fatal NVSwitch SXid {ev.code}: "
                              f"{ev.text[:120]}", f"{dev} {ev.text[:200]}", action="drain",
                              device=dev, hold=True))
        else:
            out.append(Result(check, WARN, f"SXID{ev.code}", f"non-fatal NVSwitch SXid "
                              f"{ev.code}: {ev.text[:120]}", f"{dev} {ev.text[:200]}",
                              device=dev))
    return out or [Result(check, OK, "OK", "no new NVSwitch SXids")]


@declare("efa_driver", "kernlog", EVERY_SET, context="log")
def evaluate_efa_driver(read: LogRead, ctx: LogContext) -> list[Result]:
    check = "efa_driver"
    if read.error:
        return _unreadable(check, read)
    fatal = [ev for ev in read.events if ev.kind == "efa"]
    if fatal:
        rules = [efa_rule_for(ev.text) for ev in fatal]
        actions = [r.action for r in rules if r is not None] or ["drain"]
        action = worst_action(actions)
        if action == "ignore":
            return [Result(check, OK, "OK", "EFA driver lines ignored by policy")]
        src = next((r.source for r in rules if r is not None and r.action == action), "")
        return [Result(check, FAIL, "EFA_DRIVER_FATAL", f"EFA driver error: {fatal[-1].text[:150]}"
                       + (f" (and {len(fatal) - 1} more)" if len(fatal) > 1 else ""),
                       " | ".join(ev.text[:150] for ev in fatal[:5]) + f" [policy: {src}]",
                       action=action, hold=action in ("drain", "reset_gpu", "reboot"))]
    return [Result(check, OK, "OK", "no fatal EFA driver lines")]
