"""The launcher's memory across cycles and requeues: strikes per node, exclusions, budgets.

One JSON file, ``<state-dir>/ledger.json``, written atomically (tmp + rename) after every
change, so a requeued batch script (same state dir on shared storage) picks up where the last
one stopped: which nodes are excluded and why, strikes of nodes that failed ambiguously, how
many cycles ran, the best committed checkpoint step seen and how many cycles or requeues in a
row made no progress.
"""

from __future__ import annotations

import os
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

    # -- progress --------------------------------------------------------------------------
    def record_progress(self, step: int | None) -> bool:
        """Count one finished cycle's outcome; True when ``step`` is a new committed step."""
        if step is not None and (self.best_step is None or step > self.best_step):
            self.best_step = step
            self.no_progress = 0
            return True
        self.no_progress += 1
        return False

    # -- strikes ---------------------------------------------------------------------------
    def strike(self, node: str, n: int = 1) -> int:
        self.strikes[node] = self.strikes.get(node, 0) + n
        return self.strikes[node]

    def exclude(self, node: str, why: str) -> None:
        self.excluded[node] = why

    def usable(self, nodes: list[str] | tuple[str, ...]) -> list[str]:
        return [n for n in nodes if n not in self.excluded]

    # -- persistence -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        led = cls(**known)
        led.strikes = {str(k): int(v) for k, v in led.strikes.items()}
        led.excluded = {str(k): str(v) for k, v in led.excluded.items()}
        return led


def load(state_dir: str) -> Ledger:
    """The ledger in ``state_dir`` (a fresh one when absent; a corrupt one is kept aside)."""
    path = os.path.join(state_dir, LEDGER_FILE)
    try:
        data = read_json(path, default=None)
    except ValueError:
        os.replace(path, path + ".corrupt")
        data = None
    return Ledger() if not isinstance(data, dict) else Ledger.from_json(data)


def save(state_dir: str, led: Ledger) -> None:
    atomic_write_json(os.path.join(state_dir, LEDGER_FILE), led.to_json())
