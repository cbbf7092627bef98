"""The node watcher (``resilient-health watch``): a root service that publishes a node's fault
within seconds, not at the next ``HealthCheckInterval``.

Slurm runs the HealthCheckProgram every ``HealthCheckInterval`` (30 s here; 300 s is common):
a GPU that falls off the bus right after a run is seen up to that long later, and a job's
launcher waits that long to blame the node (a hot spare waits with it). The watcher runs the
cheap NVML checks (``[hooks] watch_checks``: by default the GPU count and lost GPUs, ECC,
row remapping, NVML's recovery action; no kernel log, so the health program's saved kernel-log
position is never moved) every ``watch_interval_s`` and, when they **fail**, does at once what
the next health run would: publishes the verdict (source ``watch``), emits it as an event and
drains the node with the usual owner-prefixed reason (``runner.act``, fleet guard included).

Contract:

* **Escalate only.** The watcher never publishes a healthy verdict (a precursor's ``warn``
  aside, below), never resumes a node and
  never acts on ``unknown`` (an NVML call that timed out under load): the health program
  stays the authority that clears, and that fails closed on what it cannot read.
* Each distinct failure is acted on once (the same status and codes on later ticks: nothing),
  and again when it changes or after a healthy tick; a drain Slurm refused then (the
  controller unreachable: an ``action_failed`` event) is the next health run's to retry.
* It yields to a starting job (a prolog holds ``job-start.lock``), as the health program does,
  and never takes ``health.lock`` (a health run is never skipped for it).
* A data source left wedged in a thread (NVML hung past its timeout: the call cannot be
  interrupted, and each tick would leave one more thread) ends the watcher with the
  hook-error status; its service manager starts a fresh process (``Restart=always``).
* A precursor (``[hooks] precursors``, ``hooks/precursor.py``) with no failure: published
  (status ``warn``, ``precursors``) once while a job runs on the node, Slurm asked every
  ``PRECURSOR_ASK_S`` (10 s) until none does; then drained for repair, once.
* SIGTERM / SIGINT end it between ticks.

It runs as root like the hooks (the simulated kernel log and NVML of the sandbox are root-only,
as a production node's dmesg is); arguments: ``--config``, ``--node`` (default
``$SLURMD_NODENAME``, then the short host name) and ``--ticks N`` (stop after N ticks: tests).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from resilient_slurm.config import Config
from resilient_slurm.events import EventKind, HookNote
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report, Result
from resilient_slurm.hooks import entry, runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.exits import EXIT_HOOK_ERROR

if TYPE_CHECKING:  # a caller outside the product may pass one (hooks/entry.py)
    from resilient_slurm.healthcheck.seams import Hardware

SOURCE = "watch"


def _positive(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: a whole number >= 1")
    return int(raw)


def _ticks(argv: Sequence[str]) -> tuple[int | None, list[str]]:
    """Split ``--ticks N`` off ``argv`` (the rest is the hooks' ``--config``/``--node``, parsed
    by ``entry.guarded``); a bad value exits 2, as argparse does."""
    parser = argparse.ArgumentParser(prog="resilient-watch", add_help=False)
    parser.add_argument("--ticks", type=_positive)
    known, rest = parser.parse_known_args(argv)
    return known.ticks, rest


def watch_main(argv: Sequence[str] | None = None,
               hardware: Hardware | None = None) -> int:
    """Node watcher: NVML checks every watch_interval_s; drain at once on a failure."""
    ticks, rest = _ticks(sys.argv[1:] if argv is None else argv)
    stop: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def body(config: Config, ctx: HookContext, events: runner.SafeEvents) -> int:
        from resilient_slurm.config import ConfigError
        from resilient_slurm.healthcheck.engine import CHECKS

        hs = runner.hooks_cfg(config)
        unknown = [c for c in hs.watch_checks if c not in CHECKS]
        if unknown:
            raise ConfigError("hooks.watch_checks", f"unknown check(s) {', '.join(unknown)} "
                              f"(known: {', '.join(CHECKS)})")
        events.emit(EventKind.WATCH_START, **HookNote(
            cause=f"every {hs.watch_interval_s:g} s: {', '.join(hs.watch_checks)}"))
        acted: tuple[str, ...] | None = None  # the failure last acted on
        n = 0
        while not stop and (ticks is None or n < ticks):
            n += 1
            started = time.monotonic()
            acted = tick(config, ctx, events, acted)
            if stuck := wedged():
                print(f"resilient-watch: a data source is wedged ({', '.join(stuck)} still "
                      "running after its timeout): exiting for a fresh process",
                      file=sys.stderr)
                return EXIT_HOOK_ERROR
            if ticks is not None and n >= ticks:
                break
            _sleep(hs.watch_interval_s - (time.monotonic() - started), stop)
        return 0

    return entry.guarded(SOURCE, rest, watch_main.__doc__ or "", body, hardware)


def tick(config: Config, ctx: HookContext, events: runner.SafeEvents,
         acted: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """One look; returns the failure now acted on (None: nothing failing)."""
    from resilient_slurm.hooks.health import job_starting

    if job_starting(config):
        return acted  # a prolog checks the node now; look again next tick
    from resilient_slurm.hooks import precursor

    hs = runner.hooks_cfg(config)
    report = entry.check(config, ctx, "periodic", hs.watch_budget_s,
                         only=list(hs.watch_checks))
    report, found = precursor.split(report, hs.precursors)
    if report.status != FAIL and found:
        return _precursor(config, ctx, events, report, found, acted)
    if report.status != FAIL:
        return acted if report.status == UNKNOWN else None
    key = tuple(sorted({r.code for r in report.failing()}))
    if key == acted:
        return acted
    runner.record(config, ctx, SOURCE, report, events,
                  precursor_codes=precursor.codes_of(found))
    runner.act(config, ctx, report, events, may_resume=False, source=SOURCE)
    return key


# While a precursor stands under a job, Slurm is asked at most this often whether the job left.
PRECURSOR_ASK_S = 10.0
_asked: dict[str, float] = {}  # node -> when Slurm was last asked (monotonic; one process)


def _precursor(config: Config, ctx: HookContext, events: runner.SafeEvents, report: Report,
               found: list[Result], acted: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """A precursor and no failure: published once while a job runs (Slurm asked every
    ``PRECURSOR_ASK_S`` until none does), drained for repair once when none does
    (``hooks/precursor.py``)."""
    from resilient_slurm.hooks import precursor

    codes = tuple(sorted(precursor.codes_of(found)))
    if acted == ("drain", *codes) or (acted == ("published", *codes) and time.monotonic()
                                      - _asked.get(ctx.node, 0.0) < PRECURSOR_ASK_S):
        return acted
    _asked[ctx.node] = time.monotonic()
    busy = precursor.job_runs(config, ctx.node)
    key = ("published" if busy else "drain", *codes)
    if key == acted:
        return acted
    precursor.handle(config, ctx, report, found, events, SOURCE, may_resume=False, busy=busy)
    return key


def wedged() -> list[str]:
    """The gather threads a tick left running (a hung NVML call cannot be interrupted): each
    tick would leave one more, so the watcher ends instead."""
    return sorted({t.name for t in threading.enumerate()
                   if t.is_alive() and t.name.startswith(("rhc-", "nvml-"))})


def _sleep(seconds: float, stop: list[int]) -> None:
    end = time.monotonic() + max(0.0, seconds)
    while not stop and time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def main() -> None:
    sys.exit(watch_main())


if __name__ == "__main__":  # pragma: no cover
    main()
