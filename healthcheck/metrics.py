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

from resilient_slurm import __version__, fsutil

from .model import OK, STATUSES, Report, worst

HOOK_SOURCES = ("prolog", "epilog")  # the writers that get a file of their own beside the path


def writer_path(path: str, source: str) -> str:
    """The file ``source`` writes for the configured ``path``: the HealthCheckProgram (and a
    manual check) the path itself, the prolog ``STEM.prolog.prom``, the epilog
    ``STEM.epilog.prom`` (node_exporter reads every ``*.prom`` of the directory)."""
    if source not in HOOK_SOURCES:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{source}{ext or '.prom'}"


def render(report: Report, source: str = "check", now: float | None = None) -> str:
    """The textfile for one run of ``source``."""
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
    Gauge("resilient_health_last_run_timestamp_seconds", "When the run finished (UNIX s).",
          keys, registry=reg).labels(**base).set(now if now is not None else time.time())
    Gauge("resilient_health_run_duration_seconds", "Wall time of the run.", keys,
          registry=reg).labels(**base).set(round(report.duration_s, 4))
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


def write_metrics(path: str, report: Report, source: str = "check") -> str:
    """Write ``source``'s textfile for the configured ``path`` atomically; returns the file."""
    target = writer_path(path, source)
    fsutil.atomic_write(target, render(report, source))
    return target
