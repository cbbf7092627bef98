"""The launcher's memory across cycles and requeues: strikes per node, exclusions, budgets.

One JSON file, ``<state-dir>/ledger.json``, written atomically (tmp + rename) after every
change, so a requeued batch script (same state dir on shared storage) picks up where the last
one stopped: which nodes are excluded and why, strikes of nodes that failed ambiguously, how
many cycles ran, the best committed checkpoint step seen and how many cycles or requeues in a
row made no progress.

The ledger belongs to one job: a requeue (same job id) continues it; a new job that reuses the
state directory starts a fresh one (the old file is kept as ``ledger.<job>.json``). Strikes
decay: each cycle that makes progress takes one strike off every node.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from resilient_slurm.fsutil import atomic_write_json, read_json

LEDGER_FILE = "ledger.json"
VERSION = 1


@dataclass
class Ledger:
    strikes: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)  # node -> why
    cycles: int = 0
    best_step: int | None = None
    no_progress: int = 0
    requeues: int = 0  # requeues this launcher asked for
    job_id: int | None = None
    excluded_at: dict[str, float] = field(default_factory=dict)  # node -> unix time
    user_excluded: list[str] | None = None  # the job's own ExcNodeList before we touched it

    # -- progress --------------------------------------------------------------------------
    def record_progress(self, step: int | None) -> bool:
        """Count one finished cycle's outcome; True when ``step`` is a new committed step."""
        if step is not None and (self.best_step is None or step > self.best_step):
            self.best_step = step
            self.no_progress = 0
            self.strikes = {n: k - 1 for n, k in self.strikes.items() if k > 1}
            return True
        self.no_progress += 1
        return False

    # -- strikes ---------------------------------------------------------------------------
    def strike(self, node: str, n: int = 1) -> int:
        self.strikes[node] = self.strikes.get(node, 0) + n
        return self.strikes[node]

    def exclude(self, node: str, why: str, now: float | None = None) -> None:
        self.excluded[node] = why
        self.excluded_at[node] = time.time() if now is None else now

    def readmit(self, node: str) -> None:
        """An excluded node that was repaired: usable again, with a clean slate."""
        self.excluded.pop(node, None)
        self.excluded_at.pop(node, None)
        self.strikes.pop(node, None)

    def usable(self, nodes: list[str] | tuple[str, ...]) -> list[str]:
        return [n for n in nodes if n not in self.excluded]

    # -- persistence -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        ledger = cls(**known)
        ledger.strikes = {str(k): int(v) for k, v in ledger.strikes.items()}
        ledger.excluded = {str(k): str(v) for k, v in ledger.excluded.items()}
        ledger.excluded_at = {str(k): float(v) for k, v in ledger.excluded_at.items()}
        if ledger.user_excluded is not None:
            ledger.user_excluded = [str(n) for n in ledger.user_excluded]
        return ledger


def load(state_dir: str, job_id: int | None = None) -> Ledger:
    """The ledger in ``state_dir`` for ``job_id`` (a fresh one when absent, unreadable or
    another job's; a corrupt one is kept aside as ``.corrupt``, another job's as
    ``ledger.<job>.json``)."""
    path = os.path.join(state_dir, LEDGER_FILE)
    try:
        data = read_json(path, default=None)
        ledger = Ledger() if not isinstance(data, dict) else Ledger.from_json(data)
    except (ValueError, TypeError, AttributeError):
        os.replace(path, path + ".corrupt")
        return Ledger(job_id=job_id)
    if job_id is not None and ledger.job_id is not None and ledger.job_id != job_id:
        os.replace(path, os.path.join(state_dir, f"ledger.{ledger.job_id}.json"))
        return Ledger(job_id=job_id)
    if job_id is not None:
        ledger.job_id = job_id
    return ledger


def save(state_dir: str, ledger: Ledger) -> None:
    atomic_write_json(os.path.join(state_dir, LEDGER_FILE), ledger.to_json())
