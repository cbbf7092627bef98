"""Prometheus textfile-collector output (node_exporter reads ``*.prom`` files whole).

node_exporter conventions: help and type lines on every family, one series per state with a
``state`` label (1 for the current state, 0 for the others, as ``node_systemd_unit_state``),
an ``_info`` metric for versions. Every series carries ``source`` (``health``, ``prolog``,
``epilog``, ``check``): each writer owns its own file (:func:`writer_path`), so the prolog and
the HealthCheckProgram never overwrite each other's series, and node_exporter, which merges
the files, never sees one series twice.

The text is ``prometheus_client``'s (names, label escaping); the file is written by
``fsutil.atomic_write`` (a private temp file, fsync, rename), not by ``write_to_textfile``,
whose temp name ``PATH.PID.TID`` is predictable and opened following symlinks, as root here.
``prometheus_client`` is imported only when a metrics file is written (about 25 ms measured:
``docs/health.md``).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resilient_slurm import __version__, fsutil

from .model import OK, STATUSES, Report, worst

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# The writers that get a file of their own beside the path (the node watcher among them: its
# failing verdicts never replace the health program's series, the staleness signal).
HOOK_SOURCES = ("prolog", "epilog", "watch")


def writer_path(path: str, source: str) -> str:
    """The file ``source`` writes for the configured ``path``: the HealthCheckProgram (and a
    manual check) the path itself, the prolog ``STEM.prolog.prom``, the epilog
    ``STEM.epilog.prom``, the node watcher ``STEM.watch.prom`` (node_exporter reads every
    ``*.prom`` of the directory)."""
    if source not in HOOK_SOURCES:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{source}{ext or '.prom'}"


@dataclass(frozen=True)
class NodeFacts:
    """What the health program adds about its node (the other writers: none): how often it is
    expected to run (slurm.conf's HealthCheckInterval; None: not known), the cause of our
    drain standing on the node and our drains so far (from the hook state as the run found
    it), the fleet guard's share (``hooks.max_drain_fraction``)."""

    interval_s: float | None = None
    drained_cause: str | None = None
    drains_total: int = 0
    max_drain_fraction: float = 1.0


def render(report: Report, source: str = "check", now: float | None = None,
           facts: NodeFacts | None = None) -> str:
    """The textfile for one run of ``source``. A file is written only by a run that reached
    its verdict, so its time is the hook's last successful run (``resilient_hook_*``: the
    staleness signal)."""
    from prometheus_client import CollectorRegistry, Gauge, Info
    from prometheus_client.exposition import generate_latest

    reg = CollectorRegistry(auto_describe=False)
    base = {"node": report.node, "source": source}
    keys = list(base)
    Info("resilient_slurm_build", "Version of resilient-slurm and its Python that wrote this.",
         keys, registry=reg).labels(**base).info(
        {"version": __version__, "python": platform.python_version()})
    status = Gauge("resilient_health_status", "Node verdict of the latest run: 1 for its "
                   "state (ok, warn, unknown, fail), 0 for the others.",
                   [*keys, "check_set", "state"], registry=reg)
    for s in STATUSES:
        status.labels(**base, check_set=report.check_set, state=s).set(
            int(report.status == s))
    Gauge("resilient_health_simulated", "1 when the data came from a simulated node.", keys,
          registry=reg).labels(**base).set(int(report.simulated))
    finished = now if now is not None else time.time()
    Gauge("resilient_health_last_run_timestamp_seconds", "When the run finished (UNIX s).",
          keys, registry=reg).labels(**base).set(finished)
    Gauge("resilient_health_run_duration_seconds", "Wall time of the run.", keys,
          registry=reg).labels(**base).set(round(report.duration_s, 4))
    Gauge("resilient_hook_last_success_timestamp_seconds", "When this hook last ran to its "
          "verdict (UNIX s): older than a few intervals, the hook stopped running.", keys,
          registry=reg).labels(**base).set(finished)
    Gauge("resilient_hook_last_success_duration_seconds", "How long that run took.", keys,
          registry=reg).labels(**base).set(round(report.duration_s, 4))
    if facts is not None:
        _node_facts(reg, base, facts)
    check = Gauge("resilient_health_check_state", "Per check and device: 1 for the result's "
                  "state, 0 for the others.", [*keys, "check", "device", "state"], registry=reg)
    code = Gauge("resilient_health_check_code", "Per check and device not ok: the result code "
                 "(1).", [*keys, "check", "device", "code"], registry=reg)
    by_check: dict[tuple[str, str], list[str]] = {}
    for r in report.results:
        by_check.setdefault((r.check, r.device or ""), []).append(r.status)
        if r.status != OK:
            code.labels(**base, check=r.check, device=r.device or "", code=r.code).set(1)
    for (name, device), states in by_check.items():
        verdict = worst(states)  # several results of one check and device: the worst counts
        for s in STATUSES:
            check.labels(**base, check=name, device=device, state=s).set(int(verdict == s))
    counts = Gauge("resilient_health_checks", "Results of the run per state.", [*keys, "state"],
                   registry=reg)
    for s in STATUSES:
        counts.labels(**base, state=s).set(sum(1 for r in report.results if r.status == s))
    return generate_latest(reg).decode("utf-8")


def _node_facts(reg: CollectorRegistry, base: dict[str, str], facts: NodeFacts) -> None:
    from prometheus_client import Counter, Gauge, disable_created_metrics

    disable_created_metrics()  # a counter kept in the hook state: no *_created series
    keys = list(base)
    if facts.interval_s is not None:
        Gauge("resilient_hook_interval_seconds", "How often this hook is expected to run "
              "(slurm.conf HealthCheckInterval).", keys,
              registry=reg).labels(**base).set(facts.interval_s)
    drained = Gauge("resilient_node_drained", "1 while a drain of ours stands on the node, "
                    "by the cause in its reason.", [*keys, "cause"], registry=reg)
    if facts.drained_cause:
        drained.labels(**base, cause=facts.drained_cause).set(1)
    Counter("resilient_node_drains", "Drains of the node by the hooks, ever (hook state).",
            keys, registry=reg).labels(**base).inc(facts.drains_total)
    Gauge("resilient_hook_max_drain_fraction", "The fleet guard's share "
          "(hooks.max_drain_fraction).", keys,
          registry=reg).labels(**base).set(facts.max_drain_fraction)


def write_metrics(path: str, report: Report, source: str = "check",
                  facts: NodeFacts | None = None) -> str:
    """Write ``source``'s textfile for the configured ``path`` atomically; returns the file."""
    target = writer_path(path, source)
    fsutil.atomic_write(target, render(report, source, facts=facts))
    return target
