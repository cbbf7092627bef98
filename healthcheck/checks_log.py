"""Pure evaluation of kernel-log lines: Xid (per the generation's policy), SXid, EFA driver,
mlx5 (InfiniBand / RoCE) driver.

Xids come from the kernel log even when NVML is broken (the fallback): the GPU is named from
NVML's PCI map when there is one, else by PCI address; the generation from the GPU, else the
profile, else unknown (every Xid then fails closed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from resilient_slurm.healthcheck.config import HealthConfig

from .klog.rdma import mlx5_rule_for
from .klog.sources import LogEvent, LogRead
from .model import FAIL, OK, UNKNOWN, WARN, Result
from .policy import XidPolicy, XidRule, efa_rule_for, worst_action
from .registry import EVERY_SET, declare
from .xid.decode import line_rule


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
    """What the read itself says about its window: a wrap we could not read back, a read cut
    by its budget and too many distinct events are ``unknown`` (an Xid may be among what was
    not judged); a position not trusted is a warning (the window was read again)."""
    out = []
    if read.untrusted:
        out.append(Result(check, WARN, "KLOG_POSITION_UNTRUSTED", read.untrusted[:300],
                          str(read.position)))
    if read.gap and read.gap_filled:
        out.append(Result(check, OK, "KLOG_GAP_FILLED", "kernel log wrapped since the last "
                          f"run; the lost lines were read from the {read.gap_filled}",
                          str(read.position)))
    elif read.gap:
        out.append(Result(check, UNKNOWN, "KLOG_GAP", "kernel log wrapped or was replaced "
                          "since the last run and the lost lines are not in the journal: an "
                          "Xid may have been missed", str(read.position)))
    if read.partial:
        out.append(Result(check, UNKNOWN, "KLOG_PARTIAL", f"kernel log read {read.partial}",
                          str(read.position)))
    if read.flood:
        out.append(Result(check, UNKNOWN, "KLOG_FLOOD", f"more than {len(read.events)} "
                          f"distinct kernel-log events in one read ({read.flood} not examined)",
                          str(read.position)))
    return out


def _in_boot_window(ev: LogEvent, read: LogRead, window: float) -> bool:
    ts = ev.ts if ev.ts is not None else read.uptime_s
    return ts is not None and ts <= window


@declare("xid", "kernlog", EVERY_SET, context="log")
def evaluate_xid(read: LogRead, ctx: LogContext) -> list[Result]:
    check = "xid"
    if read.error:
        return _unreadable(check, read)
    groups: dict[tuple[str, int], list[tuple[LogEvent, XidRule]]] = defaultdict(list)
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
        rule = line_rule(policy, ev.code, ev.text)  # 154 and NVLink5 lines decode their text
        action = rule.action
        if rule.warn:
            # NVLink5 line no decode row lists, which the driver calls non-fatal: warn only.
            warned.append(Result(check, WARN, f"XID{ev.code}", f"non-fatal Xid {ev.code} on "
                                 f"{dev}: {ev.text[:100]}", f"{dev} PCI:{ev.pci} {ev.text[:200]}"
                                 f" [policy {gen or 'unknown generation'}: {rule.source}]",
                                 device=dev))
            continue
        if action == "ignore":
            ignored.append(f"Xid {ev.code} on {dev}")
            continue
        groups[(dev, ev.code)].append((ev, rule))
    out = _gap(check, read) + warned
    if garbled:
        out.append(Result(check, UNKNOWN, "XID_UNPARSEABLE", f"{sum(ev.count for ev in garbled)}"
                          " Xid line(s) that cannot be parsed",
                          " | ".join(ev.text for ev in garbled[:3])))
    for (dev, code), items in sorted(groups.items()):
        action = worst_action([r.action for _, r in items])
        ev, rule = next((e, r) for e, r in reversed(items) if r.action == action)
        idx, gen = ctx.pci_to_gpu.get(ev.pci, (None, ctx.default_generation))
        n = sum(e.count for e, _ in items)
        status = FAIL if rule.mapped else UNKNOWN  # unmapped: fails closed, never holds
        if action == "restart_app":
            # An application's fault, however often one read shows it: a warning. Only where
            # the catalog's investigatory workflow says repeats on one GPU suspect it (Xid 13,
            # 31) do such Xids in separate runs within the window fail it (no hold).
            status = WARN
            if rule.repeat_suspect:
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


_SXID_STATUS = {"fatal": FAIL, "unknown": UNKNOWN, "nonfatal": WARN, "correctable": OK}


@declare("sxid", "kernlog", EVERY_SET, context="log")
def evaluate_sxid(read: LogRead, ctx: LogContext) -> list[Result]:
    """SXids by the severity the driver wrote (:func:`.klog.parse.sxid_meaning`): Fatal fails
    with a hold, Non-fatal warns, Correctable is ok, anything else is ``unknown``."""
    check = "sxid"
    if read.error:
        return _unreadable(check, read)
    out = []
    corrected = []
    for ev in read.events:
        if ev.kind == "garbled_sxid":
            out.append(Result(check, UNKNOWN, "SXID_UNPARSEABLE", f"{ev.count} SXid line(s) "
                              "that cannot be parsed", ev.text))
        if ev.kind != "sxid":
            continue
        dev = f"pci{ev.pci}"
        times = f" (x{ev.count})" if ev.count > 1 else ""
        status = _SXID_STATUS.get(ev.severity, UNKNOWN)
        evidence = f"{dev} x{ev.count}: {ev.text[:200]}"
        if status == FAIL:
            out.append(Result(check, FAIL, f"SXID{ev.code}", f"fatal NVSwitch SXid {ev.code}"
                              f"{times}: {ev.text[:120]}", evidence, action="drain",
                              device=dev, hold=True))
        elif status == UNKNOWN:
            out.append(Result(check, UNKNOWN, f"SXID{ev.code}", f"NVSwitch SXid {ev.code} of "
                              f"unknown severity{times} (not Fatal, Non-fatal or Correctable): "
                              f"{ev.text[:100]}", evidence, device=dev))
        elif status == WARN:
            out.append(Result(check, WARN, f"SXID{ev.code}", f"non-fatal NVSwitch SXid "
                              f"{ev.code}{times}: {ev.text[:120]}", evidence, device=dev))
        else:
            corrected.append(f"SXid {ev.code} on {dev}{times}")
    if out:
        return out
    why = "no new NVSwitch SXids" + ("; corrected: " + ", ".join(corrected[:8])
                                     if corrected else "")
    return [Result(check, OK, "OK", why, "; ".join(corrected))]


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


@declare("ib_driver", "kernlog", EVERY_SET, context="log")
def evaluate_ib_driver(read: LogRead, ctx: LogContext) -> list[Result]:
    """mlx5 (ConnectX: InfiniBand, RoCE) driver lines (:mod:`.klog.rdma`, ``mlx5.toml``): a
    fatal device error or a failing firmware health poll fails with a hold (per PCI
    function); a command failure other than the routine ones (``ACCESS_REG``) and a port
    module error warn; port state changes are counted, and a link that went down warns."""
    check = "ib_driver"
    if read.error:
        return _unreadable(check, read)
    out: list[Result] = []
    counted: dict[str, int] = defaultdict(int)
    links: dict[str, dict[str, int]] = defaultdict(lambda: {"link_up": 0, "link_down": 0})
    where: dict[str, str] = {}  # netdev -> its PCI function
    for ev in read.events:
        if ev.kind != "mlx5":
            continue
        times = f" (x{ev.count})" if ev.count > 1 else ""
        evidence = f"{ev.pci} x{ev.count}: {ev.text[:200]}"
        if ev.severity == "fatal":
            rule = mlx5_rule_for(ev.key)
            action = rule.action if rule is not None else "drain"
            out.append(Result(check, FAIL, "IB_DRIVER_FATAL", f"mlx5 {ev.pci}: "
                              f"{rule.meaning if rule else ev.key}{times}", evidence +
                              f" [policy: {rule.source if rule else 'mlx5.toml'}]",
                              action=action, device=ev.pci, hold=True))
        elif ev.severity in ("link_up", "link_down"):
            links[ev.pci][ev.severity] += ev.count
            where[ev.pci] = ev.key
        elif ev.severity == "cmd_fail":
            out.append(Result(check, WARN, "IB_CMD_FAILED", f"mlx5 {ev.pci}: firmware command "
                              f"{ev.key} failed{times}", evidence, device=ev.pci))
        elif ev.severity == "module_error":
            out.append(Result(check, WARN, "IB_MODULE_ERROR", f"mlx5 {ev.pci}: port module "
                              f"error{times}: {ev.key}", evidence, device=ev.pci))
        else:  # cmd_noise, module: counted
            counted[f"{ev.key} on {ev.pci}"] += ev.count
    for dev, n in sorted(links.items()):
        seen = f"link down x{n['link_down']}, up x{n['link_up']}"
        if n["link_down"]:
            out.append(Result(check, WARN, "IB_LINK_FLAP", f"mlx5 {dev}: {seen} in this window",
                              f"{dev} on mlx5_core {where[dev]}: {seen}", device=dev))
        else:
            counted[f"link up on {dev}"] += n["link_up"]
    if out:
        return out
    what = ", ".join(f"{k} x{v}" for k, v in sorted(counted.items())[:8])
    return [Result(check, OK, "OK", "no fatal mlx5 driver lines" + (f"; counted: {what}"
                                                                   if what else ""), what)]
