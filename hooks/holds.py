"""Holds: a failure keeps the node drained until the check that found it passes again.

Whichever hook drains the node (prolog, epilog, health program), each failing check of that
run is recorded as a *hold* in the hook state (``streak.json``, key ``holds``), one per check::

    {"check": "gpu_procs", "code": "GPU_PROCS_LEFT", "device": "gpu3", "source": "epilog",
     "evidence": "gpu3 ... pids=4242", "reason": "...", "boot_id": "...", "since": 1.7e9,
     "gpus": [3], "once": false}

The health program resumes a node we drained only when no hold stands (``nodestate.decide``).
A hold is released when

* the check that found it runs again and passes (``ok``/``warn``) on the hold's GPUs
  (``gpus``; None: the whole node). The health program re-runs held checks that are not in
  its periodic set (``gpu_procs``, ``gpu_memory``) scoped to those GPUs
  (:func:`recheck_groups`); a check too long for its budget (``dcgm_diag``) is re-run only by
  ``resilient-health clear-hold --recheck``;
* the node rebooted (its boot id differs from the hold's);
* an admin resumed the node (its drain reason is no longer ours) or ran
  ``resilient-health clear-hold``.

``once`` holds (kernel-log evidence reported a single time: a mapped Xid whose action is
drain, reset or reboot, a fatal SXid or EFA line) never pass a re-run: the event is not
reported again, so only a reboot or a clear releases them.

Pure functions over plain dicts, so the rules carry the tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report, Result

HOLD_ACTIONS = ("drain", "reset_gpu", "reboot")
SCOPED_SOURCES = ("nvml", "dcgm_diag")  # gatherers a GPU scope narrows
HEALTH_RECHECK_SOURCES = ("nvml",)  # what a health run can afford to re-run (not dcgm_diag)

Hold = dict[str, Any]


def is_once(result: Result) -> bool:
    """Kernel-log evidence reported once: only a reboot or a clear proves it gone."""
    return result.hold and result.action in HOLD_ACTIONS


def _source(check: str) -> str:
    from resilient_slurm.healthcheck.engine import CHECKS

    return CHECKS[check][0] if check in CHECKS else ""


def _gpu_index(device: str | None) -> int | None:
    if device and device.startswith("gpu") and device[3:].isdigit():
        return int(device[3:])
    return None


def load(state: dict[str, Any]) -> list[Hold]:
    """The holds of ``state`` (well-formed entries only; the old single ``hold`` record,
    a kernel-log hold, is read as a ``once`` hold)."""
    raw = state.get("holds")
    holds = [dict(h) for h in raw if isinstance(h, dict) and isinstance(h.get("code"), str)] \
        if isinstance(raw, list) else []
    old = state.get("hold")
    if isinstance(old, dict) and isinstance(old.get("code"), str) and not holds:
        holds.append({"check": "", "code": old["code"], "device": None, "source": "",
                      "evidence": "", "reason": "", "boot_id": old.get("boot_id"),
                      "since": old.get("since"), "gpus": None, "once": True})
    for h in holds:
        gpus = h.get("gpus")
        h["gpus"] = sorted({int(g) for g in gpus if isinstance(g, int)}) \
            if isinstance(gpus, list) else None
    return holds


def store(state: dict[str, Any], holds: list[Hold]) -> None:
    state.pop("hold", None)
    if holds:
        state["holds"] = holds
    else:
        state.pop("holds", None)


def record(holds: list[Hold], report: Report, source: str, boot: str | None,
           scope: Sequence[int] | None, now: float | None = None) -> list[Hold]:
    """``holds`` plus one hold per failing check of ``report`` not yet held (a check already
    held keeps its first evidence; it becomes ``once`` if the new failure is)."""
    now = time.time() if now is None else now
    out = [dict(h) for h in holds]
    by_check = {h.get("check"): h for h in out if h.get("check")}
    failing: dict[str, list[Result]] = {}
    for r in report.failing():
        failing.setdefault(r.check, []).append(r)
    for check, results in failing.items():
        once = any(is_once(r) for r in results)
        if check in by_check:
            held = by_check[check]
            held["once"] = bool(held.get("once")) or once
            held["last_seen"] = round(now, 3)
            continue
        first = sorted(results, key=lambda r: (r.status != FAIL, r.action is None))[0]
        indices = [_gpu_index(r.device) for r in results]
        if all(i is not None for i in indices):
            gpus: list[int] | None = sorted({i for i in indices if i is not None})
        else:
            gpus = sorted(scope) if scope is not None else None
        hold: Hold = {"check": check, "code": first.code, "device": first.device,
                      "source": source, "evidence": first.evidence[:300],
                      "reason": first.reason[:200], "boot_id": boot, "since": round(now, 3),
                      "gpus": gpus, "once": once}
        out.append(hold)
        by_check[check] = hold
    return out


def _covered(hold: Hold, scope: Sequence[int] | None) -> bool:
    """Whether a run with GPU ``scope`` (None: every GPU) looked where the hold points."""
    if scope is None or _source(str(hold.get("check"))) not in SCOPED_SOURCES:
        return True
    gpus = hold.get("gpus")
    return gpus is not None and set(gpus) <= set(scope)


def release(holds: list[Hold], report: Report, boot: str | None,
            scope: Sequence[int] | None) -> tuple[list[Hold], list[tuple[Hold, str]]]:
    """(holds kept, [(hold released, why)]) after ``report`` (a run on GPU ``scope``)."""
    passed: dict[str, bool] = {}
    for r in report.results:
        passed[r.check] = passed.get(r.check, True) and r.status not in (FAIL, UNKNOWN)
    kept: list[Hold] = []
    gone: list[tuple[Hold, str]] = []
    for h in holds:
        check = str(h.get("check") or "")
        if boot and h.get("boot_id") and h["boot_id"] != boot:
            gone.append((h, f"the node rebooted (boot id {boot})"))
        elif not h.get("once") and passed.get(check) and _covered(h, scope):
            gone.append((h, f"{check} passed again"))
        else:
            kept.append(h)
    return kept, gone


def recheck_groups(holds: Iterable[Hold], already: Iterable[str],
                   sources: Sequence[str] = HEALTH_RECHECK_SOURCES
                   ) -> list[tuple[list[str], list[int] | None]]:
    """Held checks a run must add to prove them good, grouped by GPU scope: those not in
    ``already`` (the run's own checks), not ``once``, and fed by one of ``sources``."""
    done = set(already)
    groups: dict[tuple[int, ...] | None, list[str]] = {}
    for h in holds:
        check = str(h.get("check") or "")
        if not check or h.get("once") or check in done or _source(check) not in sources:
            continue
        gpus = h.get("gpus")
        key = tuple(gpus) if isinstance(gpus, list) else None
        if check not in groups.setdefault(key, []):
            groups[key].append(check)
    return [(checks, list(key) if key is not None else None) for key, checks in groups.items()]


def describe(hold: Hold) -> str:
    """``gpu_procs GPU_PROCS_LEFT gpu3 (epilog)``."""
    head = " ".join(str(x) for x in (hold.get("check"), hold.get("code"), hold.get("device"))
                    if x)
    return f"{head} ({hold.get('source') or 'hook'})"


def summary(holds: list[Hold]) -> str | None:
    """One line for the first hold (+N more), or None when nothing holds."""
    if not holds:
        return None
    more = f" +{len(holds) - 1}" if len(holds) > 1 else ""
    return describe(holds[0]) + more


def until(hold: Hold) -> str:
    """What releases this hold, in words."""
    if hold.get("once"):
        return "a reboot or `resilient-health clear-hold`"
    if _source(str(hold.get("check"))) in HEALTH_RECHECK_SOURCES:
        return f"{hold.get('check')} passes again (the health program re-runs it)"
    return (f"{hold.get('check')} passes again (`resilient-health clear-hold --recheck`), "
            "a reboot or `resilient-health clear-hold`")
