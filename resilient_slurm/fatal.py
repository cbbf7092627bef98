"""Errors no retry can fix, found inside the training: a configuration error that is the same
on every attempt (two nodes' memory tiers in one folder: ``RESILIENT_TIER1_DIR`` without
``{node}`` where the nodes share a host).

Contract: where such an error is found, :func:`reported` appends one ``config_error`` event
(message, rank, node) to ``$RESILIENT_EVENTS_FILE`` when set, and the error is raised as a
:class:`ConfigurationError`. Level 0 (``training/inprocess.py``) never re-enters the training
function for it: the rank exits with :data:`EXIT_CONFIG`. ``resilient-launch`` stops the step
on the first such event (before any in-job restart, which would meet the same error) and ends
the job with its message: verdict ``config-error``, exit 2, never a requeue.
"""

from __future__ import annotations

import os
from typing import TypeVar

from resilient_slurm.events import EventKind, EventLog

EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: a rank that ended on a ConfigurationError


class ConfigurationError(Exception):
    """A configuration error no retry can fix (see the module docstring)."""


E = TypeVar("E", bound=ConfigurationError)


def reported(exc: E) -> E:
    """``exc``, once its ``config_error`` event is written (best effort: an events file that
    cannot be written never hides the error itself)."""
    path = os.environ.get("RESILIENT_EVENTS_FILE")
    if path:
        rank = os.environ.get("RANK", "")
        try:
            EventLog(path, "training").emit(
                EventKind.CONFIG_ERROR, message=str(exc)[:2000],
                rank=int(rank) if rank.isdigit() else None,
                node=os.environ.get("SLURMD_NODENAME") or os.uname().nodename)
        except OSError:
            pass
    return exc
