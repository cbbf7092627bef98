"""The job side's Prometheus metrics and the jobs index (``--metrics-dir``, ``--job-index``).

``resilient-launch --metrics-dir DIR`` rewrites ``DIR/resilient_job_<JOBID>.prom`` after every
cycle, requeue and verdict, and every :data:`REFRESH_S` while a cycle runs (a thread of its
own: the watch never waits on the events file's read); node_exporter's textfile collector on
the batch host serves it (no Pushgateway). The numbers are ``launcher/report/badput.py``'s from the
job's own events, so they are what ``resilient-slurm report`` says. Labels are bounded:
``slurm_job`` (the numeric job id; ``job`` is Prometheus's own target label), ``cause`` and
``fault_class`` from fixed sets, ``node`` from the job's nodes; never the job's name or any
text the user wrote. Files of jobs whose last update is older than :data:`KEEP_S` are removed
by the next writer that may.

``--job-index FILE`` appends one JSON line per start of the batch script (``job``,
``state_dir``, ``events``, ``restart_count``, ``ts``): where ``resilient-slurm fleet`` finds
every job's events.

The text is ``prometheus_client``'s (``generate_latest``); the file is written by
``fsutil.atomic_write`` (a private temporary file, then rename), not ``write_to_textfile``,
whose temporary name ``PATH.PID.TID`` is predictable in a directory every job user writes to.
"""

from __future__ import annotations

import glob
import json
import os
import time

from resilient_slurm import fsutil
from resilient_slurm.launcher.report import badput
from resilient_slurm.launcher.report.report import Report

KEEP_S = 7 * 86400.0
REFRESH_S = 300.0  # while a cycle runs, the file is rewritten this often (a thread)
PREFIX = "resilient_job_"
RECOVERY_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def render(job: int | str, rep: Report, lost: badput.Badput, now: float | None = None) -> str:
    """The textfile of one job (see the module doc)."""
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        disable_created_metrics,
    )
    from prometheus_client.exposition import generate_latest

    disable_created_metrics()  # no *_created series: the file is rewritten from the events
    reg = CollectorRegistry(auto_describe=False)
    base = {"slurm_job": str(job)}
    keys = list(base)
    Gauge("resilient_job_wall_seconds", "Wall time so far (from submission when known).", keys,
          registry=reg).labels(**base).set(round(lost.wall_s, 3))
    if lost.productive_s is not None:  # unknown is absent, never 0
        Gauge("resilient_job_productive_seconds", "Step time that counts (each step once), "
              "less blocking checkpoint saves.", keys, registry=reg).labels(**base).set(
            round(lost.productive_s, 3))
    by_cause = Gauge("resilient_job_lost_seconds", "Wall time lost, by cause (they add up to "
                     "wall less productive).", [*keys, "cause"], registry=reg)
    for cause, seconds in lost.seconds.items():
        by_cause.labels(**base, cause=cause).set(round(seconds, 3))
    Gauge("resilient_job_ranks", "Ranks (GPUs) of the latest cycle.", keys,
          registry=reg).labels(**base).set(lost.ranks)
    faults = Counter("resilient_job_faults", "Faults, by class.", [*keys, "fault_class"],
                     registry=reg)
    recovery = Histogram("resilient_job_recovery_seconds", "Fault to training again, per "
                         "recovered fault.", [*keys, "fault_class"], registry=reg,
                         buckets=RECOVERY_BUCKETS)
    node_lost = Gauge("resilient_job_node_lost_gpu_seconds", "GPU-seconds lost to faults on "
                      "a node, by cause (seconds x the cycle's ranks).",
                      [*keys, "node", "cause"], registry=reg)
    for cls in badput.FAULT_CLASSES:
        faults.labels(**base, fault_class=cls)  # every class present, 0 when none
    per_node: dict[tuple[str, str], float] = {}
    for f in lost.faults:
        faults.labels(**base, fault_class=f.fault_class).inc()
        if f.recovery_s is not None:
            recovery.labels(**base, fault_class=f.fault_class).observe(f.recovery_s)
        for cause, seconds in f.seconds.items():
            key = (f.node or "unknown", cause)
            per_node[key] = per_node.get(key, 0.0) + seconds * f.ranks
    for (node, cause), gpu_s in per_node.items():
        node_lost.labels(**base, node=node, cause=cause).set(round(gpu_s, 3))
    Gauge("resilient_job_last_update_timestamp_seconds", "When this file was written.", keys,
          registry=reg).labels(**base).set(now if now is not None else time.time())
    Gauge("resilient_job_requeues", "Requeues so far.", keys,
          registry=reg).labels(**base).set(rep.requeues)
    return generate_latest(reg).decode("utf-8")


def path_for(metrics_dir: str, job: int | str) -> str:
    return os.path.join(metrics_dir, f"{PREFIX}{job}.prom")


def write(metrics_dir: str, job: int | str, text: str, now: float | None = None) -> str:
    """Write the job's file atomically (mode 0644); remove files of jobs gone quiet for
    :data:`KEEP_S` (those this user may remove). Returns the path."""
    now = now if now is not None else time.time()
    target = path_for(metrics_dir, job)
    fsutil.atomic_write(target, text, mode=0o644)
    for old in glob.glob(os.path.join(metrics_dir, f"{PREFIX}*.prom")):
        try:
            if old != target and now - os.lstat(old).st_mtime > KEEP_S:
                os.unlink(old)
        except OSError:
            pass
    return target


def append_index(index: str, job: int | str, state_dir: str, restart_count: int,
                 now: float | None = None) -> None:
    """One line for ``resilient-slurm fleet``: a single ``write`` on an ``O_APPEND``
    descriptor (concurrent jobs never interleave), opened without following a symlink."""
    line = json.dumps({"ts": round(now if now is not None else time.time(), 3), "job": job,
                       "state_dir": os.path.abspath(state_dir),
                       "events": os.path.join(os.path.abspath(state_dir), "events.jsonl"),
                       "restart_count": restart_count}) + "\n"
    fd = os.open(index, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def publish(metrics_dir: str, job: int | str, events_path: str) -> str:
    """Rebuild the job's file from its events file (``report.build``, ``badput.account``);
    returns its path (OSError when it cannot be read or written)."""
    from resilient_slurm.events import read_events
    from resilient_slurm.launcher.report.fields import usable
    from resilient_slurm.launcher.report.report import build

    events = usable(read_events(events_path))
    rep = build(events)
    return write(metrics_dir, job, render(job, rep, badput.account(events, rep)))
