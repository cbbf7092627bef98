"""Precursors: findings that foretell a failure on a node that still works.

``[hooks] precursors`` lists result codes (default: ``ROW_REMAP_PENDING``,
``ECC_CORRECTED_RATE``, ``NVLINK_CRC_RATE``). The node watcher and the health program treat a
result with such a code, ``warn`` or ``fail``, as a precursor, not a failure:

* **a job runs on the node** (Slurm: ALLOCATED, MIXED or COMPLETING): the node is not drained.
  The result counts as ``warn``; the published verdict says ``status: warn`` with the codes in
  ``precursors`` (``verdict_file``), and a ``precursor`` event (``action: published``) is
  written. The job's launcher reads the verdict and moves the job off the node at a step
  boundary when a spare waits (``launcher/recovery/evacuate.py``); a launcher that does not know the
  field sees a healthy ``warn``.
* **no job runs there** (none ever did, or the launcher evacuated it and gave the node back):
  the node is **drained for repair**: the precursor results fail with a hold
  (:func:`for_repair`), so the drain reason is ours (``rhc:ECC_CORRECTED_RATE gpu4``) and only
  a reboot or ``resilient-health clear-hold`` ends it, not the next quiet sample. A
  ``precursor`` event (``action: drain``) says so.
* Slurm not answering: the node is taken as busy (nothing is drained on a guess); the next
  run asks again.

A real failure in the same run wins: the report fails and is acted on as always. The hooks
drain, not the launcher: the launcher runs as the job's user and cannot; the hooks run as root
and see the node go idle (the launcher releases an evacuated node from its allocation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from resilient_slurm.config import Config
from resilient_slurm.events import EventKind, Precursor
from resilient_slurm.healthcheck.model import FAIL, WARN, Report, Result
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.slurm import SlurmError, connect

BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


def split(report: Report, codes: Collection[str]) -> tuple[Report, list[Result]]:
    """(``report`` with each precursor result counted as ``warn``, the precursor results as
    found). A precursor's result is one whose code is in ``codes`` and whose status is ``warn``
    or ``fail``."""
    found = [r for r in report.results if r.code in codes and r.status in (WARN, FAIL)]
    if not found:
        return report, []
    ids = {id(r) for r in found}
    results = [dataclasses.replace(r, status=WARN, action=None) if id(r) in ids else r
               for r in report.results]
    return dataclasses.replace(report, results=results), found


def codes_of(found: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.code for r in found))


def for_repair(report: Report, found: list[Result]) -> Report:
    """``report`` (as :func:`split` left it) with the precursor results failing with a hold:
    what drains an idle node for repair. Each keeps its check's action where it names a
    repair (a pending row remap: ``reset_gpu``), else ``drain``, so the repair ladder
    (``hooks/ladder.py``) picks its class."""
    keep = [r for r in report.results if not (r.status == WARN and any(
        r.code == f.code and r.device == f.device and r.check == f.check for f in found))]
    repair = [dataclasses.replace(f, status=FAIL, hold=True,
                                  action=f.action if f.action in ("reset_gpu", "reboot")
                                  else "drain",
                                  reason=f"precursor, drained for repair: {f.reason}"[:300])
              for f in found]
    return dataclasses.replace(report, results=[*keep, *repair])


def job_runs(config: Config, node: str) -> bool:
    """Does a job run on ``node`` (Slurm's view)? True when Slurm does not answer."""
    hs = runner.hooks_cfg(config)
    conf = hs.slurm_conf or None
    try:
        slurm = connect(conf=conf, backend="cli", timeout=hs.slurm_timeout_s,
                        bin_dir=hs.slurm_bin_dir, env={} if conf else None,
                        version_file=runner.state_path(config, "slurm-version.json"))
        n = slurm.node(node)
    except SlurmError as exc:
        runner.warn("precursor", "Slurm (taken as busy)", exc)
        return True
    return bool(({n.state} | set(n.flags)) & BUSY_STATES)


def note(events: runner.SafeEvents, found: list[Result], action: str, cause: str) -> None:
    """The ``precursor`` event."""
    events.emit(EventKind.PRECURSOR, **Precursor(
        codes=codes_of(found), devices=sorted({r.device for r in found if r.device}),
        evidence=[r.to_json() for r in found], action=action, cause=cause))


def handle(config: Config, ctx: HookContext, report: Report, found: list[Result],
           events: runner.SafeEvents, source: str, *, may_resume: bool,
           rechecked: Collection[str] = (), busy: bool | None = None) -> int:
    """Record and act on a run whose precursors are ``found`` (``report``: after
    :func:`split`, not failing): publish while a job runs (``busy``; None: ask Slurm), else
    drain for repair. Returns the run's exit status (``runner.act``'s)."""
    codes = codes_of(found)
    busy = job_runs(config, ctx.node) if busy is None else busy
    runner.record(config, ctx, source, report, events, precursor_codes=codes)
    if busy:
        note(events, found, "published", "a job runs on the node: its launcher may move off")
        return runner.act(config, ctx, report, events, may_resume=False, source=source)
    note(events, found, "drain", "no job runs on the node: drained for repair")
    return runner.act(config, ctx, for_repair(report, found), events, may_resume=may_resume,
                      source=source, rechecked=rechecked)


__all__ = ["BUSY_STATES", "codes_of", "for_repair", "handle", "job_runs", "note", "split"]
